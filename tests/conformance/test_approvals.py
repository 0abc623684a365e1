"""Approval gates and intents: the same rules on both backends."""

from __future__ import annotations

import asyncio
import threading

import pytest

import leaseq
from leaseq.store.base import load_migrations

from .support import snapshot


def _gated(q: leaseq.Queue, payload: object = None, **kw: object) -> leaseq.Task:
    return q.enqueue("payments.refund", {"order": 7, "cents": 1250} if payload is None else payload,
                     effect="side_effect", queue="payments", approval="required", by="agent-7", **kw)


def test_a_gated_task_waits_holding_no_lease_until_approved(q: leaseq.Queue) -> None:
    t = _gated(q)
    assert (t.status, t.lease_owner, t.lease_expires_at) == ("awaiting_approval", None, None)
    w = q.register_worker("payments")
    assert q.claim(w, queue="payments") == []  # not claimable while it waits
    [req] = q.approvals()
    assert (req.task_id, req.requested_by, req.decision, req.deadline_at) == (t.id, "agent-7", None, None)
    assert req.digest == leaseq.approval_digest("payments.refund", {"order": 7, "cents": 1250}, "payments", effect="side_effect")
    assert req.task is not None and req.task.payload == {"order": 7, "cents": 1250}

    approved = q.approve(t.id, req.digest, note="refund looks right", by="alice", via="cli")
    assert approved.status == "queued"
    decided = q.approval(t.id)
    assert (decided.decision, decided.decided_by, decided.decided_via, decided.note) == (
        "approved", "alice", "cli", "refund looks right")
    assert q.approvals() == []
    types = [e.type for e in q.events(t.id)]
    assert types == ["enqueued", "approval_requested", "approved"]
    ev = q.events(t.id)[-1]
    assert ev.detail == {"by": "alice", "digest": req.digest, "note": "refund looks right"}
    with q.store.transaction() as tx:
        [entry] = [r for r in tx.rows("audit_list", limit=10) if r["action"] == "approve"]
    assert (entry["actor"], entry["target"], entry["detail"]["via"]) == ("alice", f"task:{t.id}", "cli")
    [c] = q.claim(w, queue="payments")
    assert c.task_id == t.id


def test_deny_is_terminal_and_recorded(q: leaseq.Queue, dsn: str) -> None:
    t = _gated(q)
    denied = q.deny(t.id, reason="customer already refunded", by="bob")
    assert denied.status == "denied"
    assert q.approval(t.id).decision == "denied" and q.approval(t.id).note == "customer already refunded"
    assert q.events(t.id)[-1].type == "denied" and q.events(t.id)[-1].detail["by"] == "bob"
    w = q.register_worker("payments")
    assert q.claim(w, queue="payments") == []
    before = snapshot(dsn)
    for act in (lambda: q.approve(t.id, q.approval(t.id).digest), lambda: q.deny(t.id, "again")):
        with pytest.raises(leaseq.InvalidTransition, match="denied"):
            act()
    assert snapshot(dsn) == before


def test_an_approval_must_name_the_digest_that_was_shown(q: leaseq.Queue, dsn: str) -> None:
    t = _gated(q)
    other = leaseq.approval_digest("payments.refund", {"order": 7, "cents": 999999}, "payments", effect="side_effect")
    before = snapshot(dsn)
    with pytest.raises(leaseq.ApprovalMismatch) as refused:
        q.approve(t.id, other, by="alice")
    assert (refused.value.given, refused.value.current) == (other, q.approval(t.id).digest)
    assert snapshot(dsn) == before  # nothing decided
    for bad in ("", "md5:abc", "sha256:xyz", None):
        with pytest.raises(leaseq.InvalidInput, match="digest"):
            q.approve(t.id, bad)  # type: ignore[arg-type]
    assert snapshot(dsn) == before


def test_a_gated_task_cannot_change_under_its_approval(q: leaseq.Queue) -> None:
    """The trigger of the approvals migration: a payload written after the
    approval would run on it; the database refuses the change instead."""
    t = _gated(q)
    q.approve(t.id, q.approval(t.id).digest, by="alice")
    for column, value in (("payload", "'{\"order\": 7, \"cents\": 999999}'"), ("kind", "'other'"),
                          ("queue", "'default'")):
        with pytest.raises(Exception, match="approval-gated"):
            with q.store.transaction() as tx:
                tx.script(f"UPDATE leaseq_tasks SET {column} = {value} WHERE id = {t.id}")
    assert q.get(t.id).payload == {"order": 7, "cents": 1250}
    plain = q.enqueue("job", {"n": 1})
    with q.store.transaction() as tx:  # an ungated task is not the trigger's business
        tx.script(f"UPDATE leaseq_tasks SET payload = '{{\"n\": 2}}' WHERE id = {plain.id}")
    assert q.get(plain.id).payload == {"n": 2}


def test_bad_approval_options_are_refused_and_nothing_is_written(q: leaseq.Queue, dsn: str) -> None:
    before = snapshot(dsn)
    for kw, field in ((dict(approval="maybe"), "approval"), (dict(approval_deadline=5), "approval_deadline"),
                      (dict(approval="required", approval_deadline=-1), "approval_deadline"),
                      (dict(approval="required", by=7), "by")):
        with pytest.raises(leaseq.InvalidInput) as refused:
            q.enqueue("job", {}, **kw)  # type: ignore[arg-type]
        assert refused.value.field == field
    assert snapshot(dsn) == before
    t = q.enqueue("job", {})
    with pytest.raises(leaseq.InvalidTransition, match="approval='required'"):
        q.approve(t.id, leaseq.approval_digest("job", {}, "default"))
    with pytest.raises(leaseq.NotFound):
        q.approval(t.id)
    with pytest.raises(leaseq.InvalidInput, match="reason"):
        q.deny(_gated(q).id, reason="  ")


def test_the_same_key_is_the_same_gated_task(q: leaseq.Queue) -> None:
    a = _gated(q, idempotency_key="refund-7")
    b = _gated(q, idempotency_key="refund-7")
    assert a.id == b.id and len(q.approvals()) == 1


def test_an_undecided_request_is_denied_at_its_deadline(q: leaseq.Queue) -> None:
    soon = _gated(q, approval_deadline=0.05)
    later = _gated(q, {"order": 8}, approval_deadline=3600)
    assert q.approval(soon.id).deadline_at is not None
    deadline = q.approval(soon.id).deadline_at
    while q.now() <= deadline:
        pass
    assert q.expire_approvals() == 1
    assert q.get(soon.id).status == "denied" and q.get(later.id).status == "awaiting_approval"
    decided = q.approval(soon.id)
    assert (decided.decision, decided.decided_by, decided.decided_via) == ("denied", "leaseq:deadline", "deadline")
    assert q.events(soon.id)[-1].type == "denied"
    assert q.expire_approvals() == 0
    with pytest.raises(leaseq.InvalidTransition):
        q.approve(soon.id, decided.digest)


def test_approve_and_deny_racing_decide_once(dsn: str) -> None:
    """Threads, each with its own connection, decide the same requests at once: one decision each."""
    with leaseq.connect(dsn) as q:
        q.migrate()
        ids = [_gated(q, {"order": i}).id for i in range(8)]
        digests = {i: q.approval(i).digest for i in ids}
    start = threading.Barrier(2)
    won: dict[str, list[int]] = {"approve": [], "deny": []}

    def run(which: str) -> None:
        with leaseq.connect(dsn) as mine:
            start.wait(timeout=30)
            for i in ids:
                try:
                    if which == "approve":
                        mine.approve(i, digests[i], by="alice")
                    else:
                        mine.deny(i, "no", by="bob")
                    won[which].append(i)
                except leaseq.InvalidTransition:
                    pass

    threads = [threading.Thread(target=run, args=(w,)) for w in won]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert sorted(won["approve"] + won["deny"]) == ids
    with leaseq.connect(dsn) as q:
        for i in ids:
            assert q.get(i).status == ("queued" if i in won["approve"] else "denied")
            assert len([e for e in q.events(i) if e.type in ("approved", "denied")]) == 1


def test_async_approvals(dsn: str) -> None:
    async def story() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            await aq.migrate()
            t = await aq.enqueue("job", {"x": 1}, approval="required", approval_deadline=60)
            [req] = await aq.approvals()
            assert (await aq.approve(t.id, req.digest, note="ok")).status == "queued"
            u = await aq.enqueue("job", {"x": 2}, approval="required")
            assert (await aq.deny(u.id, "no")).status == "denied"
            assert (await aq.approval(u.id)).decision == "denied"
            assert await aq.expire_approvals() == 0

    asyncio.run(story())


# -- intents ---------------------------------------------------------------------------

def _agent(q: leaseq.Queue, effect: str = "idempotent") -> tuple[leaseq.Worker, leaseq.Claim]:
    w = q.register_worker("agent")
    q.enqueue("agent.run", {"ticket": 1}, effect=effect, queue="agents", idempotency_key="ticket-1")
    [c] = q.claim(w, queue="agents", lease_seconds=60)
    return w, c


def test_an_intent_is_a_child_task_recorded_once_per_key(q: leaseq.Queue) -> None:
    w, c = _agent(q)
    child = q.intend(w, c, "payments.refund", {"order": 7}, key="refund", queue="payments", approval="required")
    assert (child.kind, child.queue, child.status, child.effect) == (
        "payments.refund", "payments", "awaiting_approval", "side_effect")
    assert child.idempotency_key == "ticket-1/intent/refund"
    assert q.approval(child.id).requested_by == f"task:{c.task_id}"
    again = q.intend(w, c, "payments.refund", {"order": 7}, key="refund", queue="payments", approval="required")
    assert again.id == child.id
    [fx] = q.effects(c.task_id)
    assert (fx.action, fx.idempotency_key, fx.status, fx.response["task_id"]) == (
        "intend:payments.refund", "intent:refund", "done", child.id)
    assert q.get(c.task_id).open_effects == 0
    [ev] = [e for e in q.events(c.task_id) if e.type == "intent_recorded"]
    assert ev.detail["child_task_id"] == child.id


def test_a_retried_parent_never_records_a_second_intent(q: leaseq.Queue) -> None:
    w, c = _agent(q)
    first = q.intend(w, c, "payments.refund", {"order": 7}, key="refund", queue="payments")
    q.fail(w, c, "the model timed out", delay=0)
    [c2] = q.claim(w, queue="agents")
    assert c2.generation == c.generation + 1
    second = q.intend(w, c2, "payments.refund", {"order": 7}, key="refund", queue="payments")
    assert second.id == first.id
    assert [t.id for t in q.list_tasks(queue="payments")] == [first.id]
    with pytest.raises(leaseq.LeaseLost):  # the earlier attempt holds nothing any more
        q.intend(w, c, "payments.refund", {"order": 8}, key="other", queue="payments")
    assert len(q.list_tasks(queue="payments")) == 1


def test_intents_follow_the_declared_actions(q: leaseq.Queue, dsn: str) -> None:
    w, c = _agent(q, effect="read_only")
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput, match="read_only"):
        q.intend(w, c, "payments.refund", {}, key="r", queue="payments")
    assert snapshot(dsn) == before
    q.enqueue("agent.scoped", {}, effect="idempotent", queue="scoped", actions=["intend:mail.send"])
    [c2] = q.claim(w, queue="scoped")
    with pytest.raises(leaseq.InvalidInput, match="not an action"):
        q.intend(w, c2, "payments.refund", {}, key="r", queue="payments")
    assert q.intend(w, c2, "mail.send", {}, key="m", queue="mail").kind == "mail.send"


def test_a_migration_makes_the_approvals_table(q: leaseq.Queue) -> None:
    names = [m.name for m in load_migrations(q.dialect)]
    assert "approvals" in names
