"""FencedStore under arbitrary interleavings of resources, tokens and idempotency keys.

tests/fencing covers each rule by example and with racing processes; this
adds the sequences nobody thought to write: hypothesis generates runs of
``apply`` calls (two tasks' tokens rising, falling, repeating or absent;
keys reused on the same or another resource, by the same or another task: kept
per task, so another task's use of a key is its own)
and every call is checked against a reference model of the rules, on both
backends: the result, whether the write ran, the newest generation per
resource and task, and the stored outcomes.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leaseq.fencing import FencedStore, IdempotencyKeyReused, StaleToken

from .test_lease_rules import EXPLORE, pg_base_dsn

CALLS = st.lists(st.tuples(st.sampled_from(["acct:1", "acct:2"]),
                           st.one_of(st.none(), st.tuples(st.sampled_from([1, 2]), st.integers(0, 6))),
                           st.one_of(st.none(), st.sampled_from(["k1", "k2", "k3"]))),
                 min_size=1, max_size=25)


class FreshStore:
    """A migrated FencedStore on an empty SQLite file or PostgreSQL schema."""

    def __init__(self, backend: str):
        self.backend = backend
        if backend == "sqlite":
            self.folder = tempfile.mkdtemp(prefix="leaseq-fence-")
            dsn = f"sqlite:///{self.folder}/f.db"
        else:
            self.base = pg_base_dsn()
            self.schema = f"f_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(self.base, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {self.schema}")
            sep = "&" if "?" in self.base else "?"
            dsn = f"{self.base}{sep}options={quote(f'-csearch_path={self.schema}')}"
        self.store = FencedStore(dsn, **({"max_size": 2} if backend == "postgres" else {}))
        self.store.migrate()

    def close(self) -> None:
        self.store.close()
        if self.backend == "sqlite":
            shutil.rmtree(self.folder, ignore_errors=True)
        else:
            with psycopg.connect(self.base, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")


def check_run(backend: str, calls: list[tuple[str, tuple[int, int] | None, str | None]]) -> None:
    fresh = FreshStore(backend)
    store = fresh.store
    newest: dict[tuple[str, int], int] = {}              # the model: newest generation per resource and task
    # (task, key) -> (resource, stored value): keys are kept per task (None: an unfenced apply's),
    # so two tasks using one key never meet
    outcomes: dict[tuple[int | None, str], tuple[str, object]] = {}
    writes = 0
    try:
        for i, (resource, attempt, key) in enumerate(calls):
            ran = []
            value = {"call": i}
            task = None if attempt is None else attempt[0]
            token = None if attempt is None else f"{attempt[0]}.{attempt[1]}"
            mine = (task, key)
            if attempt is not None and attempt[1] < newest.get((resource, task), -1):
                expect = "stale"
            elif key is not None and mine in outcomes and outcomes[mine][0] != resource:
                expect = "reused"
            elif key is not None and mine in outcomes:
                expect = "replay"
            else:
                expect = "write"        # another task's outcome under the same key is never handed out
            try:
                got = store.apply(resource, token, lambda conn: ran.append(1) or value, idempotency_key=key)
            except StaleToken:
                assert expect == "stale", (i, calls[: i + 1])
            except IdempotencyKeyReused:
                assert expect == "reused", (i, calls[: i + 1])
            else:
                assert expect in ("replay", "write"), (i, expect, calls[: i + 1])
                if attempt is not None:
                    newest[(resource, task)] = max(attempt[1], newest.get((resource, task), attempt[1]))
                if expect == "write":
                    writes += 1
                    if key is not None:
                        outcomes[mine] = (resource, value)
                assert got == (outcomes[mine][1] if key is not None else value)
            assert bool(ran) == (expect == "write"), "the write must run exactly when it is accepted and new"
            for res in ("acct:1", "acct:2"):
                for t in (1, 2):
                    assert store.newest_generation(res, t) == newest.get((res, t))
        for (task, key), (resource, stored) in outcomes.items():
            found = store.outcome(key, task)
            assert (found.resource_key, found.value) == (resource, stored)
            assert (found.fencing_token or "").split(".")[0] == ("" if task is None else str(task))
    finally:
        fresh.close()


@settings(max_examples=int(EXPLORE or 60), derandomize=not EXPLORE, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(calls=CALLS)
def test_sqlite_interleavings_match_the_model(calls):
    check_run("sqlite", calls)


@settings(max_examples=int(EXPLORE or 25), derandomize=not EXPLORE, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(calls=CALLS)
def test_postgres_interleavings_match_the_model(calls):
    check_run("postgres", calls)


def test_the_model_sees_every_outcome():
    """The strategy reaches every branch (else the properties above prove little)."""
    check_run("sqlite", [("acct:1", (1, 3), "k1"), ("acct:1", (1, 2), None), ("acct:2", (1, 1), "k1"),
                         ("acct:1", (1, 5), "k1"), ("acct:1", (2, 0), None), ("acct:1", (2, 1), "k1"),
                         ("acct:1", None, "k2"), ("acct:1", (2, 1), "k2"), ("acct:2", None, None)])


pytestmark = pytest.mark.timeout(120)
