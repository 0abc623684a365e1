"""Dependencies (``enqueue(..., after=[...])``): a waiting task holds nothing, is
released in the transaction that completes its last upstream, and is cancelled
(cascading) or blocked when an upstream ends without success. Both backends."""

from __future__ import annotations

import threading
import time

import pytest

import leaseq

from .support import snapshot, wait_expired


def _run(q: leaseq.Queue, w: leaseq.Worker, task_id: int, result: object = None) -> None:
    """Claim exactly ``task_id`` (by its kind) and complete it."""
    kind = q.get(task_id).kind
    [c] = q.claim(w, kinds=[kind])
    assert c.task_id == task_id
    q.complete(w, c, result=result)


def test_a_waiting_task_holds_nothing_and_is_queued_once_every_upstream_completed(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    a, b = q.enqueue("a"), q.enqueue("b")
    merge = q.enqueue("merge", {"n": 2}, after=[b.id, a.id, a.id])
    assert (merge.status, merge.lease_owner, merge.lease_expires_at) == ("waiting", None, None)
    assert q.claim(w, kinds=["merge"]) == []  # not claimable: no lease is ever taken for it
    _run(q, w, a.id, {"part": "a"})
    assert q.get(merge.id).status == "waiting"
    assert q.claim(w, kinds=["merge"]) == []
    _run(q, w, b.id, {"part": "b"})
    assert q.get(merge.id).status == "queued"  # in the transaction that completed b
    assert q.dependency_results(merge.id) == {a.id: {"part": "a"}, b.id: {"part": "b"}}
    events = q.events(merge.id)
    assert [e.type for e in events] == ["enqueued", "waiting", "dependencies_met"]
    assert events[1].detail == {"after": [a.id, b.id], "on_dependency_failure": "cancel"}
    assert events[2].detail == {"after": [a.id, b.id]}
    [c] = q.claim(w, kinds=["merge"])
    assert c.task_id == merge.id and c.generation == 1


def test_upstreams_already_completed_make_the_task_queued_at_once(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    a = q.enqueue("a")
    _run(q, w, a.id, 7)
    t = q.enqueue("next", after=[a.id])
    assert t.status == "queued"
    assert [e.type for e in q.events(t.id)] == ["enqueued"]
    assert q.dependency_results(t.id) == {a.id: 7}


def test_an_unknown_or_failed_upstream_is_refused_and_nothing_is_written(q: leaseq.Queue, dsn: str) -> None:
    w = q.register_worker("w")
    a = q.enqueue("a")
    gone = q.enqueue("gone")
    q.cancel(gone.id, "not needed")
    dead = q.enqueue("doomed", max_attempts=1)
    [c] = q.claim(w, kinds=["doomed"])
    q.fail(w, c, "boom")
    before = snapshot(dsn)
    for after, problem in (([a.id, 999_999], "task 999999 does not exist"),
                           ([gone.id], f"task {gone.id} is cancelled"),
                           ([a.id, dead.id], f"task {dead.id} is dead")):
        with pytest.raises(leaseq.InvalidInput) as err:
            q.enqueue("child", after=after)
        assert err.value.field == "after" and problem in str(err.value)
        with pytest.raises(leaseq.InvalidInput):
            q.enqueue_many("child", [1, 2], after=after)
    for bad, field in (("12", "after"), ([0], "after[0]"), ([True], "after[0]"), ({"a": 1}, "after")):
        with pytest.raises(leaseq.InvalidInput) as err:
            q.enqueue("child", after=bad)
        assert err.value.field == field
    with pytest.raises(leaseq.InvalidInput) as err:
        q.enqueue("child", after=[a.id], on_dependency_failure="ignore")
    assert err.value.field == "on_dependency_failure"
    assert snapshot(dsn) == before


def test_a_cancelled_upstream_cancels_its_waiters_in_a_cascade(q: leaseq.Queue) -> None:
    a, other = q.enqueue("a"), q.enqueue("other")
    b = q.enqueue("b", after=[a.id, other.id])
    c = q.enqueue("c", after=[b.id])
    q.cancel(a.id, "wrong input")
    got_b, got_c = q.get(b.id), q.get(c.id)
    assert (got_b.status, got_b.last_error) == ("cancelled", f"dependency {a.id} ended cancelled")
    assert (got_c.status, got_c.last_error) == ("cancelled", f"dependency {b.id} ended cancelled")
    ev = q.events(c.id)[-1]
    assert (ev.type, ev.detail["dependency"], ev.detail["dependency_status"]) == ("cancelled", b.id, "cancelled")
    assert q.get(other.id).status == "queued"  # an upstream is never touched by its waiter's end
    assert q.wait(c.id, timeout=0).status == "cancelled"


def test_a_dead_upstream_blocks_a_waiter_that_asked_for_it(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    a = q.enqueue("a")
    b = q.enqueue("b", after=[a.id], on_dependency_failure="block")
    c = q.enqueue("c", after=[b.id])
    [claim] = q.claim(w, kinds=["a"])
    q.fail(w, claim, "bad data", retry=False)
    got = q.get(b.id)
    assert (got.status, got.last_error) == ("blocked", f"dependency {a.id} ended dead")
    assert q.events(b.id)[-1].type == "blocked"
    assert q.get(c.id).status == "waiting"  # blocked is parked, not ended: a person decides
    q.unblock(b.id, "run it anyway")
    _run(q, w, b.id, "ok")
    assert q.get(c.id).status == "queued"


def test_a_retried_failure_keeps_the_waiter_waiting(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    a = q.enqueue("a")
    b = q.enqueue("b", after=[a.id])
    [claim] = q.claim(w, kinds=["a"])
    assert q.fail(w, claim, "flaky", delay=0).status == "queued"
    assert q.get(b.id).status == "waiting"
    _run(q, w, a.id)
    assert q.get(b.id).status == "queued"


def test_an_expired_lease_routed_to_dead_cancels_the_waiter(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    a = q.enqueue("a", max_attempts=1)
    b = q.enqueue("b", after=[a.id])
    [claim] = q.claim(w, kinds=["a"], lease_seconds=0.2)
    wait_expired(q, claim)
    assert q.sweep() == 1
    assert q.get(a.id).status == "dead"
    assert (q.get(b.id).status, q.get(b.id).last_error) == ("cancelled", f"dependency {a.id} ended dead")


def test_reconciling_an_upstream_settles_its_waiters(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    a = q.enqueue("pay", effect="side_effect")
    b = q.enqueue("receipt", after=[a.id])
    [claim] = q.claim(w, kinds=["pay"])
    q.begin_effect(w, claim, "charge")
    q.fail(w, claim, "timeout talking to the bank")
    assert q.get(a.id).status == "needs_reconciliation"
    assert q.get(b.id).status == "waiting"  # parked, not ended
    q.reconcile(a.id, "completed", "the bank shows the charge", result={"charged": True})
    assert q.get(b.id).status == "queued"
    assert q.dependency_results(b.id) == {a.id: {"charged": True}}


def test_complete_many_mixes_tasks_with_and_without_waiters_and_a_lost_lease(q: leaseq.Queue) -> None:
    w, other = q.register_worker("w"), q.register_worker("other")
    plain, watched, lost = q.enqueue("p"), q.enqueue("p"), q.enqueue("p")
    waiter = q.enqueue("after", after=[watched.id])
    claims = {c.task_id: c for c in q.claim(w, kinds=["p"], limit=3)}
    q.cancel(lost.id, "taken away")
    done = q.complete_many(w, [(claims[plain.id], 1), (claims[watched.id], 2), (claims[lost.id], 3)])
    assert done == {plain.id, watched.id}
    assert q.get(waiter.id).status == "queued"
    assert q.get(lost.id).status == "cancelled" and q.get(lost.id).result is None
    assert [e.type for e in q.events(watched.id)].count("completed") == 1
    assert q.claim(other, kinds=["p"]) == []


def test_enqueue_many_waits_for_the_same_upstreams_and_dedupes(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    a = q.enqueue("a")
    ids = q.enqueue_many("part", [1, 2, 3], after=[a.id], idempotency_keys=["k1", "k2", None])
    assert [q.get(i).status for i in ids] == ["waiting"] * 3
    again = q.enqueue("part", 1, idempotency_key="k1", after=[a.id])
    assert again.id == ids[0] and again.status == "waiting"
    _run(q, w, a.id)
    assert [q.get(i).status for i in ids] == ["queued"] * 3
    assert [e.type for e in q.events(ids[0])] == ["enqueued", "waiting", "dependencies_met"]


def test_fan_in_over_many_upstreams_completed_by_racing_threads(q: leaseq.Queue) -> None:
    """Two transactions completing two upstreams of one waiter at once: each
    must not read the other's upstream as unfinished and leave the waiter
    waiting (lock_waiters orders them)."""
    for _ in range(15 if q.dialect == "postgres" else 3):
        parts = [q.enqueue("part") for _ in range(4)]
        join = q.enqueue("join", after=[p.id for p in parts])
        workers = [q.register_worker(f"w{i}") for i in range(4)]
        claims = [q.claim(wk, kinds=["part"])[0] for wk in workers]
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []

        def finish(wk: leaseq.Worker, c: leaseq.Claim) -> None:
            try:
                barrier.wait(timeout=10)
                q.complete(wk, c, result=c.task_id)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=finish, args=(wk, c)) for wk, c in zip(workers, claims)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        assert q.get(join.id).status == "queued"
        [c] = q.claim(workers[0], kinds=["join"])
        q.complete(workers[0], c)


def test_an_upstream_completing_while_its_waiter_is_enqueued_never_strands_the_waiter(
        q: leaseq.Queue) -> None:
    """The waiter's enqueue and the upstream's completion race: whichever
    commits first, the waiter ends up queued (never waiting on a completed
    upstream)."""
    if q.dialect != "postgres":
        pytest.skip("SQLite runs one write transaction at a time: the two cannot interleave")
    w = q.register_worker("w")
    helper = q.enqueue("helper")  # already has a waiter: its completion always takes the settling path
    q.enqueue("early", after=[helper.id])
    for i in range(40):
        up = q.enqueue("up") if i % 2 else helper
        [c] = q.claim(w, kinds=[up.kind])
        barrier = threading.Barrier(2)
        made: list[leaseq.Task] = []
        errors: list[BaseException] = []

        def complete() -> None:
            try:
                barrier.wait(timeout=10)
                q.complete(w, c, result=i)
            except BaseException as exc:
                errors.append(exc)

        def enqueue() -> None:
            try:
                barrier.wait(timeout=10)
                made.append(q.enqueue("down", after=[up.id]))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=complete), threading.Thread(target=enqueue)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        assert q.get(up.id).status == "completed"
        assert q.get(made[0].id).status == "queued", f"iteration {i}: the waiter was stranded"
        if up is helper:  # the helper ran once; later rounds use fresh upstreams of both kinds
            helper = q.enqueue("helper")
            q.enqueue("early", after=[helper.id])


def test_a_denied_upstream_cancels_its_waiter_and_a_gate_cannot_wait(q: leaseq.Queue) -> None:
    gated = q.enqueue("wire_money", approval="required")
    after_it = q.enqueue("notify", after=[gated.id])
    assert after_it.status == "waiting"  # awaiting_approval has not ended: the waiter waits
    q.deny(gated.id, reason="not this month")
    got = q.get(after_it.id)
    assert (got.status, got.last_error) == ("cancelled", f"dependency {gated.id} ended denied")
    with pytest.raises(leaseq.InvalidInput) as err:
        q.enqueue("both", after=[q.enqueue("x").id], approval="required")
    assert err.value.field == "after"


def test_a_deadline_passing_ends_upstream_and_waiter_and_their_waiters_follow(q: leaseq.Queue) -> None:
    from datetime import timedelta

    upstream = q.enqueue("late", deadline=timedelta(seconds=0.2))
    blocked = q.enqueue("b", after=[upstream.id], on_dependency_failure="block")
    slow = q.enqueue("slow")
    waiter = q.enqueue("w", after=[slow.id], deadline=timedelta(seconds=0.2))
    downstream = q.enqueue("d", after=[waiter.id])
    time.sleep(0.4)
    q.sweep()
    assert q.get(upstream.id).status == "expired"
    assert (q.get(blocked.id).status, q.get(blocked.id).last_error) == (
        "blocked", f"dependency {upstream.id} ended expired")
    assert q.get(waiter.id).status == "expired"  # a waiting task's own deadline passed
    assert (q.get(downstream.id).status, q.get(downstream.id).last_error) == (
        "cancelled", f"dependency {waiter.id} ended expired")
