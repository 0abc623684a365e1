"""The lean claim: a queue whose tasks never named a fairness key, a limit or a singleton key
is claimed by a smaller statement (``claim_plain``, PostgreSQL); a queue that gains such a
task is claimed in full (``claim_batch``) at once. Every transport, both backends (SQLite
always claims in full: the same answers are asked of it)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import leaseq
from pg_modes import own_connection

from .test_transports import TRANSPORTS, over

#: each way a task makes its queue need the full claim
KEYED: dict[str, dict[str, Any]] = {
    "fairness_key": dict(fairness_key="tenant-a"),
    "limit": dict(limits=["lean-claim"]),
    "singleton_key": dict(singleton_key="only-one"),
}


@pytest.mark.parametrize("keyed", sorted(KEYED))
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_queue_that_gains_a_keyed_task_is_claimed_in_full_at_once(q: leaseq.Queue, kind: str,
                                                                      keyed: str) -> None:
    q.set_limit("lean-claim", max_running=5)
    with over(kind, q, "worker") as t:
        w = t.register_worker("a")
        q.enqueue("job", {"n": 0})
        [first] = t.claim(w)  # the queue's claims so far: the lean one, where there is one
        plain = q.enqueue("job", {"n": 1})
        hi = q.enqueue("job", {"n": 2}, priority=5, **KEYED[keyed])
        # priority first, whatever the task names: a claim that passed over it
        # (the lean statement) would hand out the plain task before it
        assert [c.task_id for c in t.claim(w)] == [hi.id]
        assert [c.task_id for c in t.claim(w)] == [plain.id]
        assert t.claim(w) == []
        assert q.get(first.task_id).status == "running"


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_plain_queue_claims_by_priority_with_every_guard(q: leaseq.Queue, kind: str) -> None:
    """The lean claim keeps the full claim's rules: paused queues, kinds, scheduled
    time, deadlines, priority then FIFO order, a revoked worker."""
    with over(kind, q, "worker") as t:
        w = t.register_worker("a")
        later = q.enqueue("job", {"n": 0}, delay=3600)
        low = q.enqueue("job", {"n": 1})
        high = q.enqueue("job", {"n": 2}, priority=3)
        other = q.enqueue("mail", {"n": 3})
        q.pause("default", create=True, by="ops")
        assert t.claim(w, limit=10) == []
        q.resume("default", by="ops")
        assert [c.task_id for c in t.claim(w, limit=10, kinds=["job"])] == [high.id, low.id]
        b = t.register_worker("b")
        q.revoke_worker(b.id, by="ops")
        with pytest.raises(leaseq.UnknownWorker):
            t.claim(b)
        assert [c.task_id for c in t.claim(w, limit=10)] == [other.id]
        assert q.get(later.id).status == "queued"


def test_a_task_changed_to_name_a_key_switches_its_queue(q: leaseq.Queue, dsn: str) -> None:
    """Not only an enqueue: a queued task changed (by hand, as the owner) to name a limit
    sends its queue's next claim down the full path, which takes it by its priority."""
    if not dsn.startswith("postgres"):
        pytest.skip("the queues that need the full claim are recorded on PostgreSQL only")
    q.set_limit("lean-claim", max_running=5)
    w = q.register_worker("a")
    q.enqueue("job", {"n": 0})
    q.claim(w)  # lean from now on
    plain = q.enqueue("job", {"n": 1})
    capped = q.enqueue("job", {"n": 2}, priority=5)
    with own_connection(dsn, autocommit=True) as conn:
        conn.execute("UPDATE leaseq_tasks SET limits = ARRAY['lean-claim'] WHERE id = %s", (capped.id,))
    assert [c.task_id for c in q.claim(w)] == [capped.id]
    assert [c.task_id for c in q.claim(w)] == [plain.id]
    assert q.limits("lean-claim")[0]["running"] == 1  # its slot taken, as the full claim takes it


@pytest.mark.parametrize("keyed", sorted(KEYED))
def test_a_keyed_task_enqueued_during_a_lean_claim(q: leaseq.Queue, dsn: str, keyed: str) -> None:
    """The race: a task naming a key is enqueued while a lean claim of its queue runs (the
    claim held at the worker row's lock, its snapshot taken). The claim answers as one made
    before the enqueue; the queue's next claim, at once, is the full one."""
    if not dsn.startswith("postgres"):
        pytest.skip("SQLite writes one transaction at a time: a claim and an enqueue never overlap")
    q.set_limit("lean-claim", max_running=5)
    w = q.register_worker("a")
    q.enqueue("job", {"n": 0})
    q.claim(w)  # lean from now on
    first = q.enqueue("job", {"n": 1})
    second = q.enqueue("job", {"n": 2})
    got: list[list[int]] = []
    with own_connection(dsn) as locker:
        locker.execute("SELECT 1 FROM leaseq_workers WHERE id = %s FOR UPDATE", (w.id,))
        [[pid]] = locker.execute("SELECT pg_backend_pid()").fetchall()
        claimer = threading.Thread(target=lambda: got.append([c.task_id for c in q.claim(w)]))
        claimer.start()
        with own_connection(dsn, autocommit=True) as watch:
            deadline = time.monotonic() + 10
            while not watch.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                    (pid,)).fetchone()[0]:  # type: ignore[index]
                assert time.monotonic() < deadline, "the claim never reached the worker row"
                time.sleep(0.01)
        hi = q.enqueue("job", {"n": 3}, priority=5, **KEYED[keyed])
        locker.rollback()
        claimer.join(timeout=10)
    assert got == [[first.id]]  # as before the enqueue
    assert [c.task_id for c in q.claim(w)] == [hi.id]  # in full at once: priority first
    assert [c.task_id for c in q.claim(w)] == [second.id]


# -- the lean completion ------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_completion_believing_a_task_names_no_limit_still_gives_its_slot_back(q: leaseq.Queue,
                                                                                kind: str) -> None:
    """The lean completion (``complete_plain``, PostgreSQL) is chosen from the caller's claims;
    the row decides: a task that names a limit is left to ``complete_batch``, which gives its
    slot back, in the same call. A claim that says otherwise (stale, or forged) changes nothing."""
    from dataclasses import replace

    q.set_limit("lean-complete", max_running=1)
    task = q.enqueue("job", {"n": 0}, limits=["lean-complete"])
    plain = q.enqueue("job", {"n": 1})
    with over(kind, q, "worker") as t:
        w = t.register_worker("a")
        claims = t.claim(w, limit=2)
        assert sorted(c.task_id for c in claims) == [task.id, plain.id]
        assert q.limits("lean-complete")[0]["running"] == 1
        believed = [replace(c, task=replace(c.task, limits=None)) for c in claims]
        assert t.complete_many(w, [(c, {"n": c.task_id}) for c in believed]) == {task.id, plain.id}
    assert q.limits("lean-complete")[0]["running"] == 0
    assert q.get(task.id).status == q.get(plain.id).status == "completed"
    assert q.get(task.id).result == {"n": task.id}


def test_the_lean_completion_sent_by_hand_leaves_a_task_with_a_limit_running(q: leaseq.Queue) -> None:
    """Sent by hand for a task that names a limit, complete_plain completes nothing and
    writes nothing: its slot could otherwise be kept by a lease that ended."""
    if q.dialect != "postgres":
        pytest.skip("the lean completion is PostgreSQL's (SQLite's completion has no limit steps)")
    import json

    q.set_limit("lean-complete", max_running=1)
    task = q.enqueue("job", {"n": 0}, limits=["lean-complete"])
    w = q.register_worker("a")
    [claim] = q.claim(w)
    items = json.dumps([{"task_id": task.id, "generation": claim.generation, "result": None}])
    with own_connection(q.store.dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT * FROM leaseq_q_complete_plain(false, %s, %s::bigint[], %s::jsonb, false, false)",
                            (w.id, [task.id], items)).fetchall()
    assert rows == []
    assert q.get(task.id).status == "running" and q.limits("lean-complete")[0]["running"] == 1
    q.complete(w, claim)
    assert q.limits("lean-complete")[0]["running"] == 0
