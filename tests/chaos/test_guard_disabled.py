"""The checker can fail: with a lease guard removed, a short chaos run finds the violation.

The package is copied into a scratch folder, the generation check is removed
from ``complete_batch`` (the one completion statement) in the copy's
queries.sql, by passing the lease guard template the row's own generation
(the real file is never touched), and `leaseq chaos` runs with the copy first on PYTHONPATH, for
both the harness and its worker processes. The stale-writer probe then
completes a task with a superseded claim of the same worker, the database
accepts it, and the checker must say so and exit non-zero.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import leaseq

from .support import describe, need_pg_binaries, recheck_cli, run_chaos_cli

pytestmark = pytest.mark.timeout(180)
#: complete_batch's use of the guard template, and the same use with the generation check made a tautology
GUARD_USE = "/* TEMPLATE: lease_guard(c.generation) */"
NO_GENERATION_CHECK = "/* TEMPLATE: lease_guard(t.claim_generation) */"


def scratch_copy_without_generation_check(root: Path) -> Path:
    """A copy of the leaseq package whose complete_batch ignores the claim generation."""
    source = Path(leaseq.__file__).parent
    target = root / "leaseq"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    # (on PostgreSQL the completion's lease guard is in the template complete_batch and
    # complete_plain, the lean completion every task without a limit gets, both expand)
    for dialect, where in (("sqlite", "-- name: complete_batch\n"), ("postgres", "-- template: completion(")):
        path = target / "sql" / dialect / "queries.sql"
        text = path.read_text()
        start = text.index(where)
        end = min(text.index(marker, start + 1) for marker in ("-- name: ", "-- template: ") if marker in text[start + 1:])
        block = text[start:end]
        assert block.count(GUARD_USE) == 1, f"{dialect} {where.strip()} no longer expands the guard once"
        path.write_text(text[:start] + block.replace(GUARD_USE, NO_GENERATION_CHECK) + text[end:])
        assert (source / "sql" / dialect / "queries.sql").read_text().count(GUARD_USE) >= 1  # the real file is intact
    return root


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_removing_the_generation_check_is_caught(tmp_path, backend):
    if backend == "postgres":
        need_pg_binaries()
    scratch = scratch_copy_without_generation_check(tmp_path / "scratch")
    proc, doc = run_chaos_cli(tmp_path, "--backend", backend, "--duration", "20", "--workers", "2",
                              "--tasks", "30", "--seed", "3", "--faults", "none", "--quiet", pythonpath=scratch)
    assert proc.returncode == 1, describe(proc)
    verdict = doc["verdict"]
    assert not verdict["ok"]
    assert verdict["by_invariant"]["stale_write_refused"] >= 1, verdict["by_invariant"]
    assert verdict["by_invariant"]["single_completion"] >= 1, verdict["by_invariant"]
    # the trails convict it too: the completed event records the generation the caller completed
    # under, which the model does not let complete once a newer claim exists
    assert verdict["by_invariant"].get("model_trace", 0) >= 1, verdict["by_invariant"]
    accepted = [r for r in doc["history"] if r["op"] == "probe.complete" and r["outcome"] == "ok"]
    assert accepted, "the probe's stale completion should have been accepted by the broken copy"
    assert "VIOLATION stale_write_refused" in proc.stdout
    # The other guards were left alone, and still refused the probe.
    refused = {r["op"] for r in doc["history"] if r["op"].startswith("probe.") and r["outcome"] == "refused"}
    assert {"probe.renew", "probe.begin_effect", "probe.downstream"} <= refused
    # The saved history convicts the broken copy again, with the intact checker.
    again = recheck_cli(tmp_path / "history.json")
    assert again.returncode == 1 and "VIOLATION single_completion" in again.stdout, describe(again)


# -- the same, for trace validation: a guard missing in the SQL shows in the trails ---------------

def scratch_copy(root: Path, dialects: tuple[str, ...], query: str, old: str, new: str) -> Path:
    """A copy of the leaseq package whose named ``query`` (or ``template: <name>``, a template
    of the dialect's file, with or without declared parameters) has ``old`` replaced by ``new``."""
    source = Path(leaseq.__file__).parent
    target = root / "leaseq"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    header = query if query.startswith("template: ") else f"name: {query}"
    for dialect in dialects:
        path = target / "sql" / dialect / "queries.sql"
        text = path.read_text()
        # a template's header may declare its parameters: "-- template: name(param=default)"
        found = [text.find(f"-- {header}{after}") for after in ("\n", "(")]
        assert max(found) >= 0, f"{dialect}: no block headed {header!r}"
        start = min(i for i in found if i >= 0)
        end = min(i for i in (text.find("\n-- name: ", start + 1), text.find("\n-- template: ", start + 1))
                  if i >= 0) + 1
        block = text[start:end]
        assert block.count(old) == 1, f"{dialect} {query} no longer holds {old!r} once"
        path.write_text(text[:start] + block.replace(old, new) + text[end:])
    return root


def test_without_the_completion_guard_trace_validation_fails(tmp_path):
    """The lease guard removed from complete_batch altogether: a short chaos run's trails hold a
    completion the model does not allow, named with its task, generation and event. (Without only
    the generation check, the trails convict it as well: above.)"""
    scratch = scratch_copy(tmp_path / "scratch", ("sqlite",), "complete_batch",
                           "  " + GUARD_USE + "\n", "")
    proc, doc = run_chaos_cli(tmp_path, "--backend", "sqlite", "--duration", "20", "--workers", "1",
                              "--tasks", "10", "--seed", "4", "--faults", "none", "--quiet", pythonpath=scratch)
    assert proc.returncode == 1, describe(proc)
    found = [v for v in doc["verdict"]["violations"] if v["invariant"] == "model_trace"]
    assert found, doc["verdict"]["by_invariant"]
    assert any("completed (generation" in v["detail"] for v in found), found
    assert "VIOLATION model_trace" in proc.stdout
    # the saved history convicts it again, with the intact checker
    again = recheck_cli(tmp_path / "history.json")
    assert again.returncode == 1 and "VIOLATION model_trace" in again.stdout, describe(again)


def _race(tmp_path: Path, pythonpath: Path | None) -> list[dict]:
    import json
    import os
    import subprocess
    import sys
    import uuid

    from conftest import with_search_path

    base = os.environ["LEASEQ_TEST_PG_DSN"]
    import psycopg

    schema = f"race_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        env = dict(os.environ)
        if pythonpath is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH")) if p)
        proc = subprocess.run([sys.executable, str(Path(__file__).with_name("revocation_race.py")),
                               with_search_path(base, schema), "25"], env=env, capture_output=True, text=True,
                              timeout=240, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_without_the_revocation_lock_trace_validation_fails(tmp_path, pg_schema_dsn):
    """The worker row's FOR SHARE removed from the claim (claim_head, the first steps of
    claim_batch and claim_fair; PostgreSQL: SQLite writes one transaction at a time): claims
    racing revocations leave a revoked worker a lease, which the trails show. The intact
    package, raced the same way, leaves trails the model allows."""
    assert _race(tmp_path, None) == []
    scratch = scratch_copy(tmp_path / "scratch", ("postgres",), "template: claim_head",
                           "WHERE w.id = %(worker_id)s AND w.revoked_at IS NULL\n    FOR SHARE",
                           "WHERE w.id = %(worker_id)s AND w.revoked_at IS NULL")
    found = _race(tmp_path, scratch)
    assert found, "no claim slipped past a revocation in 25 trials"
    assert all("revoke" in v["why"] or "revocation" in v["why"] for v in found), \
        [v["why"] for v in found if "revoke" not in v["why"] and "revocation" not in v["why"]][:3]
