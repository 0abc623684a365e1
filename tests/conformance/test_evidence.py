"""The evidence trail: every transition writes an event, in order, with the
facts an incident review needs (generation, holder, heartbeats, why)."""

from __future__ import annotations

from datetime import timedelta

import pytest

import leaseq

from .support import WORKING_LEASE, snapshot, wait_until


def test_one_task_through_every_transition(q: leaseq.Queue) -> None:
    a, b = q.register_worker("a"), q.register_worker("b")
    t = q.enqueue("refund", {"order": 1}, effect="side_effect", idempotency_key="refund-1", max_attempts=9)

    # A claims, heartbeats twice, records one answered and one unanswered call, then stalls
    [ca] = q.claim(a, lease_seconds=WORKING_LEASE)
    wait_until(q, ca.task.claimed_at + timedelta(seconds=0.1))
    q.heartbeat(a, ca)
    wait_until(q, q.get(t.id).last_heartbeat_at + timedelta(seconds=0.15))
    q.heartbeat(a, ca)
    last_beat = q.get(t.id).last_heartbeat_at
    fx = q.begin_effect(a, ca, "crm.lookup")
    q.finish_effect(a, ca, fx, response={"customer": 7})
    q.begin_effect(a, ca, "payments.refund")
    wait_until(q, q.get(t.id).lease_expires_at)
    assert q.claim(b) == []  # the claim routes A's expired lease first

    q.reconcile(t.id, "requeue", note="provider has no refund", by="alice")
    [c2] = q.claim(b)
    q.fail(b, c2, "401 card vault token revoked", block=True)
    q.unblock(t.id, note="token rotated", by="alice")
    [c3] = q.claim(b)
    q.fail(b, c3, "order is malformed", retry=False)
    q.requeue(t.id, note="order fixed", by="bob")
    [c4] = q.claim(b)
    q.complete(b, c4, result={"refund": "r-1"})

    events = q.events(t.id)
    types = [e.type for e in events]
    assert types == [
        "enqueued",
        "claimed", "effect_intent", "effect_response", "effect_intent", "lease_expired", "needs_reconciliation",
        "reconciled",
        "claimed", "failed", "blocked", "unblocked",
        "claimed", "failed", "dead", "requeued",
        "claimed", "completed",
    ]
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert all(x.at <= y.at for x, y in zip(events, events[1:]))
    by_type: dict[str, list[leaseq.Event]] = {}
    for e in events:
        by_type.setdefault(e.type, []).append(e)

    enqueued = by_type["enqueued"][0]
    assert enqueued.detail["idempotency_key"] == "refund-1" and enqueued.detail["effect"] == "side_effect"
    assert [(e.generation, e.worker_id) for e in by_type["claimed"]] == [(1, a.id), (2, b.id), (3, b.id), (4, b.id)]

    intent, _, open_intent = by_type["effect_intent"][0], by_type["effect_response"][0], by_type["effect_intent"][1]
    assert (intent.detail["action"], intent.generation) == ("crm.lookup", 1)
    assert "refund-1" in open_intent.detail["idempotency_key"] and open_intent.detail["action"] == "payments.refund"
    assert by_type["effect_response"][0].detail["action"] == "crm.lookup"

    expired = by_type["lease_expired"][0]
    assert (expired.generation, expired.worker_id) == (1, a.id)
    assert expired.detail["routed_to"] == "needs_reconciliation"
    assert expired.detail["heartbeats"] == 2
    assert expired.detail["last_heartbeat_at"] == last_beat.isoformat()
    assert expired.detail["longest_heartbeat_gap"] >= 0.1
    assert expired.detail["reason"]

    reconciled = by_type["reconciled"][0]
    assert (reconciled.detail["outcome"], reconciled.detail["by"]) == ("requeue", "alice")
    assert reconciled.detail["settled_intents"] == [open_intent.detail["idempotency_key"]]

    blocked_fail, dead_fail = by_type["failed"]
    assert (blocked_fail.generation, blocked_fail.worker_id) == (2, b.id)
    assert blocked_fail.detail["error"] == "401 card vault token revoked"
    assert by_type["blocked"][0].detail["reason"]
    assert by_type["unblocked"][0].detail["by"] == "alice"
    assert dead_fail.detail["error"] == "order is malformed" and by_type["dead"][0].generation == 3
    assert by_type["requeued"][0].detail["by"] == "bob"
    done = by_type["completed"][0]
    assert (done.generation, done.worker_id) == (4, b.id)


def test_cancel_records_who_and_why(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    t = q.enqueue("job")
    [c] = q.claim(a)
    q.cancel(t.id, reason="wrong customer", by="alice")
    cancelled = q.events(t.id)[-1]
    assert cancelled.type == "cancelled"
    assert (cancelled.detail["by"], cancelled.detail["reason"]) == ("alice", "wrong customer")
    assert cancelled.detail["previous_status"] == "running"
    assert cancelled.detail["revoked_lease_of"] == a.id
    assert cancelled.generation == c.generation


def test_released_lease_and_retry_are_recorded(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    t = q.enqueue("job", max_attempts=5)
    [c1] = q.claim(a)
    q.release(a, c1, reason="deploy")
    [c2] = q.claim(a)
    q.fail(a, c2, "timeout 30s", delay=0)
    events = q.events(t.id)
    assert [e.type for e in events] == ["enqueued", "claimed", "lease_released", "claimed", "failed"]
    released, failed = events[2], events[4]
    assert (released.generation, released.detail["routed_to"], released.detail["reason"]) == (1, "queued", "deploy")
    assert (failed.generation, failed.detail["error"], failed.detail["next_status"]) == (2, "timeout 30s", "queued")
    assert "retry_at" in failed.detail


def test_refused_calls_add_no_events(q: leaseq.Queue) -> None:
    a, b = q.register_worker("a"), q.register_worker("b")
    t = q.enqueue("job")
    [ca] = q.claim(a, lease_seconds=0.2)
    wait_until(q, ca.expires_at)
    [cb] = q.claim(b)
    count = len(q.events(t.id))
    for call in (lambda: q.complete(a, ca), lambda: q.heartbeat(a, ca), lambda: q.begin_effect(a, ca, "x")):
        with pytest.raises(leaseq.LeaseLost):
            call()
    assert len(q.events(t.id)) == count
    q.complete(b, cb)
    assert q.events(t.id)[-1].type == "completed"


def test_the_enqueued_entry_is_the_task_row_itself(q: leaseq.Queue, dsn: str) -> None:
    """No event row is stored for an enqueue: the trail's first entry is read
    from the task's own unchanging columns, for single and batch enqueues."""
    one = q.enqueue("mail", {"to": "a"}, effect="idempotent", queue="out", priority=4, idempotency_key="m-1")
    [many] = q.enqueue_many("mail", [{"to": "b"}], queue="out", idempotency_keys=["m-2"])
    assert not [r for r in snapshot(dsn)["leaseq_events"] if "enqueued" in r]
    for task_id, key, effect, priority in ((one.id, "m-1", "idempotent", 4), (many, "m-2", "read_only", 0)):
        [entry] = q.events(task_id)
        assert (entry.id, entry.type, entry.generation, entry.worker_id) == (0, "enqueued", None, None)
        assert entry.at == q.get(task_id).created_at
        assert entry.detail == {"queue": "out", "kind": "mail", "effect": effect, "idempotency_key": key,
                                "priority": priority}


def test_every_trail_read_at_once_is_each_tasks_own(q: leaseq.Queue) -> None:
    """The trails the lease model's replay reads in two statements (engine.reads.trails):
    every task newest first, each with exactly the trail q.events reads for it, in order."""
    from leaseq import engine

    a = q.register_worker("a")
    first = q.enqueue("job", {"n": 1}, queue="one")
    q.enqueue("job", {"n": 2}, queue="two", effect="idempotent")
    q.enqueue("job", {"n": 3})  # no event of its own: its trail is its enqueued entry
    [c] = q.claim(a, queue="one")
    q.heartbeat(a, c)
    q.complete(a, c, {"ok": True})
    [c] = q.claim(a, queue="two")
    q.fail(a, c, "try again", delay=0)
    [c] = q.claim(a, queue="two")
    q.release(a, c)

    tasks = q.list_tasks()
    read = engine.drive(q.store, engine.reads.trails(q.settings))
    assert [t for t, _ in read] == tasks
    assert {t.id: trail for t, trail in read} == {t.id: q.events(t.id) for t in tasks}
    assert [[e.type for e in trail] for _, trail in read] == [
        ["enqueued"], ["enqueued", "claimed", "failed", "claimed", "lease_released"], ["enqueued", "claimed", "completed"]]
    newest = engine.drive(q.store, engine.reads.trails(q.settings, limit=2))
    assert [(t.id, trail) for t, trail in newest] == [(t.id, q.events(t.id)) for t in tasks[:2]]
    with pytest.raises(leaseq.InvalidInput, match="limit"):
        engine.drive(q.store, engine.reads.trails(q.settings, limit=0))
