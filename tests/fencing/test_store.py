"""FencedStore on both backends: the fence, idempotency, atomicity, bad input."""

from __future__ import annotations

import pytest

import leaseq
from leaseq.fencing import FencedStore, IdempotencyKeyReused, StaleToken

from .conftest import add_entry, ledger

TASK = 10


def t(generation: int, task: int = TASK) -> str:
    """The fencing token of attempt ``generation`` of ``task``."""
    return f"{task}.{generation}"


class Write:
    """A write that records each call and adds one ledger row on the fence's connection."""

    def __init__(self, store: FencedStore, amount: int = 1, result=None):
        self.store, self.amount, self.result, self.calls = store, amount, result, 0

    def __call__(self, conn):
        self.calls += 1
        add_entry(conn, self.store, "acct", self.amount)
        return self.result


def test_tokens_at_or_above_the_newest_are_accepted_and_recorded(store):
    assert store.newest_generation("acct", TASK) is None
    assert store.apply("acct", t(3), Write(store, 1, "first")) == "first"
    assert store.newest_generation("acct", TASK) == 3
    store.apply("acct", t(3), Write(store, 2))           # same attempt writing again
    store.apply("acct", t(7), Write(store, 3))
    assert store.newest_generation("acct", TASK) == 7
    assert [row[1] for row in ledger(store)] == [1, 2, 3]


def test_an_older_token_is_refused_and_changes_nothing(store):
    store.apply("acct", t(5), Write(store, 1))
    stale = Write(store, 99)
    with pytest.raises(StaleToken) as info:
        store.apply("acct", t(4), stale)
    assert isinstance(info.value, leaseq.StaleToken) and info.value.code == "stale_token"
    message = str(info.value)
    assert "'acct'" in message and "task 10 generation 4" in message and "generation 5 already" in message
    assert (info.value.resource_key, info.value.token, info.value.newest_token) == ("acct", "10.4", "10.5")
    assert stale.calls == 0
    assert store.newest_generation("acct", TASK) == 5
    assert [row[1] for row in ledger(store)] == [1]


def test_tokens_are_per_resource(store):
    store.apply("a", t(9), Write(store))
    store.apply("b", t(1), Write(store))                 # b has its own fence
    assert (store.newest_generation("a", TASK), store.newest_generation("b", TASK)) == (9, 1)


def test_a_failing_write_rolls_everything_back(store):
    store.apply("acct", t(2), Write(store, 1))

    def explode(conn):
        add_entry(conn, store, "acct", 50)
        raise RuntimeError("downstream said no")

    with pytest.raises(RuntimeError, match="downstream said no"):
        store.apply("acct", t(6), explode, idempotency_key="k")
    assert store.newest_generation("acct", TASK) == 2           # token 6 was not accepted
    assert store.outcome("k") is None
    assert [row[1] for row in ledger(store)] == [1]
    # and the first token ever seen is not recorded either when its write fails
    with pytest.raises(RuntimeError):
        store.apply("fresh", t(1), explode)
    assert store.newest_generation("fresh", TASK) is None


def test_an_idempotency_key_runs_the_write_once_and_replays_its_outcome(store):
    write = Write(store, 10, {"receipt": ("r", 1)})
    first = store.apply("acct", t(1), write, idempotency_key="pay-1")
    assert first == {"receipt": ["r", 1]}             # the JSON form, as every replay returns it
    again = store.apply("acct", t(1), Write(store, 10, "other"), idempotency_key="pay-1")
    assert again == first
    assert [row[1] for row in ledger(store)] == [10]
    stored = store.outcome("pay-1", TASK)
    assert (stored.resource_key, stored.fencing_token, stored.value) == ("acct", "10.1", first)
    assert stored.recorded_at is not None


def test_a_replay_with_a_newer_token_records_the_token(store):
    store.apply("acct", t(1), Write(store), idempotency_key="k")
    assert store.apply("acct", t(4), Write(store, result="new"), idempotency_key="k") is None
    assert store.newest_generation("acct", TASK) == 4
    assert len(ledger(store)) == 1


def test_the_fence_is_checked_before_the_replay(store):
    store.apply("acct", t(1), Write(store, result="done"), idempotency_key="k")
    store.apply("acct", t(2), Write(store))
    with pytest.raises(StaleToken):
        store.apply("acct", t(1), Write(store), idempotency_key="k")


def test_a_key_cannot_be_reused_for_another_resource(store):
    store.apply("acct", t(1), Write(store), idempotency_key="k")
    other = Write(store)
    with pytest.raises(IdempotencyKeyReused) as info:
        store.apply("other", t(1), other, idempotency_key="k")
    assert "'k'" in str(info.value) and "'acct'" in str(info.value) and "'other'" in str(info.value)
    assert other.calls == 0
    assert store.newest_generation("other", TASK) is None       # rolled back with the refusal
    assert store.outcome("k", TASK).resource_key == "acct"


def test_without_a_token_only_idempotency_applies(store):
    store.apply("acct", None, Write(store), idempotency_key="k")
    store.apply("acct", None, Write(store), idempotency_key="k")
    assert store.newest_generation("acct", TASK) is None
    assert store.outcome("k").fencing_token is None
    assert len(ledger(store)) == 1


def test_without_a_key_the_return_value_passes_through(store):
    marker_object = object()
    assert store.apply("acct", t(1), lambda conn: marker_object) is marker_object


def test_an_outcome_that_is_not_json_is_refused_and_rolled_back(store):
    with pytest.raises(leaseq.InvalidInput) as info:
        store.apply("acct", t(1), Write(store, result={1, 2}), idempotency_key="k")
    assert info.value.field == "outcome"
    assert store.outcome("k") is None and store.newest_generation("acct", TASK) is None and ledger(store) == []


@pytest.mark.parametrize("args, field", [
    (("", "1.1"), "resource_key"), ((5, "1.1"), "resource_key"), (("x" * 1001, "1.1"), "resource_key"),
    (("a\x00b", "1.1"), "resource_key"), (("acct", "10.-1"), "fencing_token"), (("acct", True), "fencing_token"),
    (("acct", 3), "fencing_token"), (("acct", "3"), "fencing_token"), (("acct", f"10.{2**63}"), "fencing_token"),
    (("acct", f"{2**63}.1"), "fencing_token"), (("acct", 1.0), "fencing_token"), (("acct", "10.1.2.3"), "fencing_token"),
    (("acct", " 10.1"), "fencing_token"), (("acct", "10.1\n"), "fencing_token"),
])
def test_bad_arguments_name_the_field_and_change_nothing(store, args, field):
    with pytest.raises(leaseq.InvalidInput) as info:
        store.apply(*args, Write(store))
    assert info.value.field == field
    assert ledger(store) == []


def test_bad_key_and_write_arguments(store):
    with pytest.raises(leaseq.InvalidInput, match="idempotency_key"):
        store.apply("acct", t(1), Write(store), idempotency_key="")
    with pytest.raises(leaseq.InvalidInput, match="write"):
        store.apply("acct", t(1), "not callable")
    with pytest.raises(leaseq.InvalidInput, match="resource_key"):
        store.newest_generation("", TASK)
    with pytest.raises(leaseq.InvalidInput, match="task_id"):
        store.newest_generation("acct", "10")


def test_the_largest_token_fits(store):
    store.apply("acct", f"{2**63 - 1}.{2**63 - 1}", Write(store))
    assert store.newest_generation("acct", 2**63 - 1) == 2**63 - 1


def test_migrate_is_idempotent_and_missing_tables_are_reported(fence_dsn):
    with FencedStore(fence_dsn) as fresh:
        with pytest.raises(leaseq.ConfigError, match=r"migrate\(\)"):
            fresh.apply("acct", t(1), lambda conn: None)
        fresh.migrate()
        fresh.migrate()
        fresh.apply("acct", t(1), lambda conn: None)
        assert fresh.newest_generation("acct", TASK) == 1


def test_a_write_may_not_end_the_transaction_itself(store):
    def commit_early(conn):
        conn.commit()

    with pytest.raises(Exception, match="(?i)commit"):
        store.apply("acct", t(1), commit_early)


@pytest.mark.parametrize("dsn", ["", "mysql://x/y", "sqlite://", "sqlite:///:memory:"])
def test_bad_dsns_are_config_errors(dsn):
    with pytest.raises(leaseq.ConfigError, match="dsn"):
        FencedStore(dsn)


def test_unreachable_postgres_is_reported_plainly():
    with pytest.raises(leaseq.BackendUnavailable, match="cannot connect"):
        FencedStore("postgresql://postgres@127.0.0.1:1/none", connect_timeout=1)


def test_postgres_refuses_a_nul_in_the_outcome_clearly(store):
    if store.dialect != "postgres":
        assert store.apply("acct", t(1), lambda conn: "a\x00b", idempotency_key="k") == "a\x00b"
        return
    with pytest.raises(leaseq.InvalidInput, match="NUL"):
        store.apply("acct", t(1), lambda conn: "a\x00b", idempotency_key="k")
    assert store.apply("acct", t(1), lambda conn: "\\u0000 as text", idempotency_key="k") == "\\u0000 as text"


def test_both_dialect_files_define_the_same_queries_with_the_same_parameters():
    import re

    from leaseq.fencing.backends import load_fence_queries

    pg, lite = load_fence_queries("postgres"), load_fence_queries("sqlite")
    assert pg.keys() == lite.keys()
    for name in pg:
        assert set(re.findall(r"%\((\w+)\)s", pg[name])) == set(re.findall(r"(?<!:):(\w+)", lite[name])), name


def test_the_portable_mode_migrates_without_an_advisory_lock_and_is_safe_to_race(pg_schema_dsn,
                                                                                pg_direct_schema_dsn):
    """``?portable=true`` (servers without advisory locks): another session holding the
    advisory lock a direct migrate takes does not hold it up, and eight first runs racing
    on an empty schema all succeed (the attempts table is the lock; a loser of the race to
    create it runs again). The holder's session is a direct one in every mode (a
    transaction-mode pooler would hand its lock's server connection on)."""
    import threading

    import psycopg

    portable = pg_schema_dsn if "portable=true" in pg_schema_dsn else pg_schema_dsn + "&portable=true"
    with psycopg.connect(pg_direct_schema_dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(7431002301)")  # the lock a direct migrate waits for
        errors: list[BaseException] = []
        stores = [FencedStore(portable) for _ in range(8)]
        start = threading.Barrier(len(stores))

        def run(store: FencedStore) -> None:
            try:
                start.wait()
                store.migrate()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(s,)) for s in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads), "a portable migrate waited for the advisory lock"
        assert errors == []
        stores[0].apply("acct", t(1), lambda conn: None)
        assert stores[0].newest_generation("acct", TASK) == 1
        for store in stores:
            store.close()
