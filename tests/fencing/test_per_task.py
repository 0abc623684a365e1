"""Fences per task, outcomes bound to their task, and the exact lease check, on both backends."""

from __future__ import annotations

import time

import pytest

import leaseq
from leaseq.fencing import FencedStore, IdempotencyKeyReused, QueueLeaseCheck, StaleToken, fencing_token

from .conftest import add_entry, ledger


def write(store: FencedStore, note: str):
    def run(conn):
        add_entry(conn, store, "order:17", 1, note)
        return {"note": note}
    return run


def test_two_tasks_on_one_record_never_refuse_each_other(store):
    # A refund task whose generation reached 5, and a charge task on its first attempt.
    store.apply("order:17", "2.5", write(store, "refund"))
    assert store.apply("order:17", "1.1", write(store, "charge")) == {"note": "charge"}
    store.apply("order:17", "2.5", write(store, "refund again"))   # the refund's own attempt, still current
    assert (store.newest_generation("order:17", 1), store.newest_generation("order:17", 2)) == (1, 5)
    assert [row[2] for row in ledger(store)] == ["refund", "charge", "refund again"]


def test_a_tasks_superseded_attempt_is_still_refused(store):
    store.apply("order:17", "1.1", write(store, "a"))
    store.apply("order:17", "1.2", write(store, "b"))              # task 1 was reclaimed
    store.apply("order:17", "9.7", write(store, "other task"))     # does not matter to task 1
    with pytest.raises(StaleToken, match="task 1 generation 1"):
        store.apply("order:17", "1.1", write(store, "zombie"))
    assert "zombie" not in [row[2] for row in ledger(store)]


def test_raising_one_tasks_generation_cannot_lock_out_another(store):
    store.apply("order:17", f"3.{2**63 - 1}", write(store, "greedy"))
    assert store.apply("order:17", "4.1", write(store, "other")) == {"note": "other"}


def test_an_outcome_is_replayed_only_to_its_own_task_and_keys_are_kept_per_task(store):
    first = store.apply("order:17", "1.1", write(store, "charge"), idempotency_key="pay-17")
    assert store.apply("order:17", "1.2", write(store, "retry"), idempotency_key="pay-17") == first
    # Another task (or an unfenced caller) using the same key neither sees task 1's outcome
    # nor is refused for it: its key is its own, so no task can squat another's.
    for other, note in (("2.1", "task 2"), (None, "unfenced")):
        assert store.apply("order:17", other, write(store, note), idempotency_key="pay-17") == {"note": note}
    assert [row[2] for row in ledger(store)] == ["charge", "task 2", "unfenced"]
    assert store.outcome("pay-17", 1).fencing_token == "1.1"
    assert store.outcome("pay-17", 2).fencing_token == "2.1"
    assert store.outcome("pay-17").fencing_token is None


def test_a_task_cannot_make_another_get_idempotency_key_reused(store):
    # Task 2 knows task 1 will use "pay-17" on order:17, and uses it first, even on another resource.
    store.apply("order:99", "2.1", write(store, "squat"), idempotency_key="pay-17")
    store.apply("order:17", "2.1", write(store, "squat again"), idempotency_key="1:pay-17")
    assert store.apply("order:17", "1.1", write(store, "charge"), idempotency_key="pay-17") == {"note": "charge"}
    assert store.apply("order:17", "1.2", write(store, "retry"), idempotency_key="pay-17") == {"note": "charge"}


def test_fencing_token_names_task_and_generation():
    assert fencing_token(12, 3) == "12.3"
    with pytest.raises(leaseq.InvalidInput, match="generation"):
        fencing_token(12, -1)


def test_a_store_made_before_per_task_fences_is_upgraded_in_place(fence_dsn):
    with FencedStore(fence_dsn) as old:
        with old.transaction() as conn:  # the tables as the first version created them
            kind = "jsonb" if old.dialect == "postgres" else "TEXT"
            conn.execute("CREATE TABLE leaseq_fence_tokens (resource_key text PRIMARY KEY, "
                         "newest_token bigint NOT NULL)")
            conn.execute(f"CREATE TABLE leaseq_fence_outcomes (idempotency_key text PRIMARY KEY, "
                         f"resource_key text NOT NULL, fencing_token bigint, outcome {kind} NOT NULL, "
                         f"recorded_at {'timestamptz' if old.dialect == 'postgres' else 'REAL'} NOT NULL "
                         f"DEFAULT {'now()' if old.dialect == 'postgres' else '0'})")
            conn.execute("INSERT INTO leaseq_fence_outcomes (idempotency_key, resource_key, fencing_token, "
                         "outcome) VALUES ('old-key', 'order:1', 3, '{\"done\": true}')")
        old.migrate()
        old.migrate()
        with old.transaction() as conn:
            conn.execute("CREATE TABLE ledger (account TEXT NOT NULL, amount INTEGER NOT NULL, note TEXT)")
        # The old outcome is kept, bound to no task, as it was: an unfenced apply still replays it,
        # while a fenced apply's key is its task's own (stored as "<task>:old-key").
        assert old.apply("order:1", None, write(old, "again"), idempotency_key="old-key") == {"done": True}
        assert old.outcome("old-key").fencing_token is None
        assert old.apply("order:1", "5.4", write(old, "new"), idempotency_key="new-key") == {"note": "new"}


# -- the exact check --------------------------------------------------------------------------

def claimed(q: leaseq.Queue, lease: float = 0.4):
    task = q.enqueue("pay", {"order": 17}, effect="side_effect", lease_seconds=lease)
    worker = q.register_worker("a")
    [claim] = q.claim(worker)
    return task, worker, claim


def wait_expired(q: leaseq.Queue, task_id: int) -> None:
    deadline = time.monotonic() + 20
    while q.get(task_id).lease_expires_at > q.now():
        assert time.monotonic() < deadline, "the lease did not run out"
        time.sleep(0.05)


def test_same_database_lease_check_refuses_an_expired_attempt_before_anyone_else_wrote(fence_dsn):
    q = leaseq.connect(fence_dsn)
    q.migrate()
    store = FencedStore(fence_dsn, lease_check=QueueLeaseCheck())
    try:
        store.migrate()
        with store.transaction() as conn:
            conn.execute("CREATE TABLE ledger (account TEXT NOT NULL, amount INTEGER NOT NULL, note TEXT)")
        task, worker, claim = claimed(q, lease=30)
        token = claim.fencing_token
        assert store.apply("order:17", token, write(store, "live")) == {"note": "live"}
        q.release(worker, claim, "handing back")              # the attempt ends: no lease any more
        with pytest.raises(StaleToken, match="no longer holds its lease"):
            store.apply("order:17", token, write(store, "after release"))
        task2 = q.enqueue("pay", {"order": 18}, effect="side_effect", lease_seconds=0.4, queue="other")
        [claim2] = q.claim(worker, queue="other")
        assert claim2.task_id == task2.id
        wait_expired(q, task2.id)                             # expired, and nobody has reclaimed it
        with pytest.raises(StaleToken):
            store.apply("order:18", claim2.fencing_token, write(store, "zombie"))
        assert [row[2] for row in ledger(store)] == ["live"]
        assert store.newest_generation("order:18", task2.id) is None
    finally:
        store.close()
        q.close()


def test_lease_check_through_a_queue_on_another_database(q, tmp_path):
    store = FencedStore(f"sqlite:///{tmp_path / 'shop.db'}", lease_check=QueueLeaseCheck(q))
    try:
        store.migrate()
        with store.transaction() as conn:
            conn.execute("CREATE TABLE ledger (account TEXT NOT NULL, amount INTEGER NOT NULL, note TEXT)")
        task, worker, claim = claimed(q, lease=0.4)
        token = claim.fencing_token
        assert store.apply("order:17", token, write(store, "live")) == {"note": "live"}
        wait_expired(q, task.id)
        with pytest.raises(StaleToken, match=f"task {task.id} generation 1"):
            store.apply("order:17", token, write(store, "zombie"))
        assert [row[2] for row in ledger(store)] == ["live"]
    finally:
        store.close()


def test_lease_check_must_be_a_lease_check(fence_dsn):
    with pytest.raises(leaseq.InvalidInput, match="lease_check"):
        FencedStore(fence_dsn, lease_check=lambda *a: True)
    with pytest.raises(leaseq.InvalidInput, match="queue"):
        QueueLeaseCheck("postgresql://elsewhere")
