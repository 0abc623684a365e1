"""Approval gates and intents: the same rules on both backends."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import leaseq
from leaseq.auth import AccessDenied
from leaseq.engine.approvals import DEADLINE_ACTOR, digest_of
from leaseq.store.base import load_migrations

from pg_modes import own_connection

from .support import run_out, snapshot, wait_until


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
    right = q.approval(t.id).digest
    assert refused.value.given == other and not hasattr(refused.value, "current")
    assert right not in str(refused.value) and right not in repr(refused.value.wire_fields())  # not given away
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


# -- what the digest covers ------------------------------------------------------------

#: The gated refund an approver looks at, as enqueue options.
BENIGN: dict[str, Any] = dict(kind="payments.refund", payload={"order": 7, "cents": 1250}, queue="payments",
                              effect="side_effect", actions=["payments.refund"], priority=0, max_attempts=5,
                              lease_seconds=30.0, timeout=60.0,
                              deadline=datetime(2030, 1, 31, 9, 0, tzinfo=timezone.utc), limits=["payments"],
                              units=1, resources=["order:7"])
#: One variant per field the digest covers: the benign refund with that one field changed.
VARIANTS: dict[str, dict[str, Any]] = {
    "kind": dict(kind="payments.refund_all"),
    "payload": dict(payload={"order": 7, "cents": 999999}),
    "queue": dict(queue="payments-fast"),
    "effect": dict(effect="idempotent"),
    "actions (undeclared: any action)": dict(actions=None),
    "actions (another)": dict(actions=["payments.refund", "payments.payout"]),
    "priority": dict(priority=100),
    "max_attempts": dict(max_attempts=10000),
    "lease_seconds": dict(lease_seconds=604800.0),
    "timeout (none)": dict(timeout=None),
    "timeout (longer)": dict(timeout=86400.0),
    "deadline (none)": dict(deadline=None),
    "deadline (later)": dict(deadline=datetime(2031, 1, 31, 9, 0, tzinfo=timezone.utc)),
    "limits": dict(limits=None),
    "units": dict(units=500),
    "resources (none)": dict(resources=None),
    "resources (another)": dict(resources=["order:7", "order:8"]),
}


def _enqueue_gated(q: leaseq.Queue, key: str, **options: Any) -> leaseq.Task:
    o = {**BENIGN, **options}
    return q.enqueue(o.pop("kind"), o.pop("payload"), approval="required", idempotency_key=key, by="agent-7", **o)


def _task_digest(t: leaseq.Task) -> str:
    """The public function over the task's fields, as an approver outside leaseq would compute it."""
    return leaseq.approval_digest(t.kind, t.payload, t.queue, effect=t.effect, actions=t.actions,
                                  priority=t.priority, max_attempts=t.max_attempts, lease_seconds=t.lease_seconds,
                                  timeout_seconds=t.timeout_seconds, deadline_at=t.deadline_at, limits=t.limits,
                                  units=t.units, resources=t.resources)


def test_the_digest_covers_every_option_the_task_runs_with(q: leaseq.Queue, dsn: str) -> None:
    """Two requests that differ in any one field the task runs with have different digests, and an
    approval given with the benign request's digest is refused for each variant, deciding nothing."""
    benign = _enqueue_gated(q, "benign")
    variants = {name: _enqueue_gated(q, f"variant-{i}", **change) for i, (name, change) in enumerate(VARIANTS.items())}
    shown = {a.task_id: a.digest for a in q.approvals(limit=100)}
    assert len(shown) == len(VARIANTS) + 1
    digests = {name: shown[t.id] for name, t in variants.items()}
    assert len(set(digests.values()) | {shown[benign.id]}) == len(VARIANTS) + 1, digests
    for t in [benign, *variants.values()]:
        stored = q.get(t.id)
        assert shown[t.id] == q.approval(t.id).digest == digest_of(stored) == _task_digest(stored)
        assert shown[t.id].startswith("v2:sha256:") and len(shown[t.id]) == 74
    before = snapshot(dsn)
    for name, t in variants.items():
        with pytest.raises(leaseq.ApprovalMismatch) as refused:
            q.approve(t.id, shown[benign.id], by="alice")
        assert refused.value.given == shown[benign.id] and shown[t.id] not in str(refused.value), name
    assert snapshot(dsn) == before  # nothing decided
    assert q.approve(benign.id, shown[benign.id], by="alice").status == "queued"


def test_the_benign_digest_does_not_approve_the_dangerous_request(q: leaseq.Queue, dsn: str) -> None:
    """Issue 28: the kind, payload and queue alone (the version 1 digest) did not tell these two apart."""
    benign = _enqueue_gated(q, "benign")
    dangerous = _enqueue_gated(q, "dangerous", effect="idempotent", actions=None, max_attempts=10000,
                               lease_seconds=604800.0)
    v1 = {t.id: "sha256:" + hashlib.sha256(json.dumps(
        {"kind": t.kind, "payload": t.payload, "queue": t.queue}, sort_keys=True,
        separators=(",", ":")).encode()).hexdigest() for t in (benign, dangerous)}
    assert v1[benign.id] == v1[dangerous.id]  # what version 1 bound: the same
    seen = q.approval(benign.id).digest
    assert q.approval(dangerous.id).digest != seen
    before = snapshot(dsn)
    with pytest.raises(leaseq.ApprovalMismatch):
        q.approve(dangerous.id, seen, note="the refund I looked at", by="alice")
    with pytest.raises(leaseq.InvalidInput, match="version 1"):  # nor does the old digest, which matched both
        q.approve(dangerous.id, v1[benign.id], by="alice")
    assert snapshot(dsn) == before
    assert q.get(dangerous.id).status == "awaiting_approval"


def test_a_request_recorded_with_a_version_1_digest_is_decided_with_its_version_2_digest(
        q: leaseq.Queue, dsn: str) -> None:
    """A request made before schema version 14 keeps its version 1 digest: still checked against the
    task at the decision, while the approver is shown, and must pass, the task's version 2 digest."""
    t, other = _enqueue_gated(q, "old"), _enqueue_gated(q, "tampered")
    v1 = {task.id: "sha256:" + hashlib.sha256(json.dumps(
        {"kind": task.kind, "payload": payload, "queue": task.queue}, sort_keys=True,
        separators=(",", ":")).encode()).hexdigest()
        for task, payload in ((t, t.payload), (other, {"order": 7, "cents": 1}))}  # other's: not its payload
    with q.store.transaction() as tx:
        for task_id, digest in v1.items():
            tx.script(f"UPDATE leaseq_approvals SET digest = '{digest}' WHERE task_id = {task_id}")
    shown = {a.task_id: a.digest for a in q.approvals()}
    assert shown[t.id] == q.approval(t.id).digest == digest_of(q.get(t.id)) != v1[t.id]
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput, match="version 1") as refused:
        q.approve(t.id, v1[t.id], by="alice")
    assert refused.value.field == "digest"
    with pytest.raises(leaseq.ApprovalMismatch):  # the recorded version 1 digest no longer matches its task
        q.approve(other.id, shown[other.id], by="alice")
    assert snapshot(dsn) == before
    assert q.approve(t.id, shown[t.id], by="alice").status == "queued"


def test_nothing_the_digest_covers_can_change_under_the_approval(q: leaseq.Queue) -> None:
    t = _enqueue_gated(q, "fixed")
    q.approve(t.id, q.approval(t.id).digest, by="alice")
    changes = {"effect": "'idempotent'", "actions": "NULL", "priority": "100", "max_attempts": "10000",
               "lease_seconds": "604800", "timeout_seconds": "NULL", "deadline_at": "NULL", "limits": "NULL",
               "units": "500", "resources": "NULL"}
    for column, value in changes.items():
        with pytest.raises(Exception, match="approval-gated"):
            with q.store.transaction() as tx:
                tx.script(f"UPDATE leaseq_tasks SET {column} = {value} WHERE id = {t.id}")
    assert digest_of(q.get(t.id)) == q.approval(t.id).digest
    with q.store.transaction() as tx:  # what the digest does not cover may change
        tx.script(f"UPDATE leaseq_tasks SET trace_context = NULL, last_error = 'noted' WHERE id = {t.id}")


# -- the deadline ------------------------------------------------------------------------

def _past_deadline(q: leaseq.Queue, task_id: int) -> datetime:
    deadline = q.approval(task_id).deadline_at
    assert deadline is not None
    wait_until(q, deadline)
    return deadline


def test_a_decision_after_the_deadline_is_refused_and_the_deadline_denies(q: leaseq.Queue) -> None:
    """Without a sweep (no `leaseq serve`), a late approval used to be accepted."""
    late, also_late = _gated(q, approval_deadline=0.05), _gated(q, {"order": 8}, approval_deadline=0.05)
    digest = q.approval(late.id).digest
    _past_deadline(q, late.id)
    _past_deadline(q, also_late.id)
    for task_id, decide, action in ((late.id, lambda: q.approve(late.id, digest, by="alice"), "approve"),
                                    (also_late.id, lambda: q.deny(also_late.id, "no", by="bob"), "deny")):
        with pytest.raises(leaseq.ApprovalExpired) as refused:
            decide()
        assert isinstance(refused.value, leaseq.InvalidTransition)
        assert (refused.value.task_id, refused.value.decision) == (task_id, action)
        assert refused.value.deadline_at == q.approval(task_id).deadline_at.isoformat()
        decided = q.approval(task_id)
        assert (decided.decision, decided.decided_by, decided.decided_via) == ("denied", DEADLINE_ACTOR, "deadline")
        assert decided.decided_at >= decided.deadline_at
        assert q.get(task_id).status == "denied"
        ev = q.events(task_id)[-1]
        assert (ev.type, ev.detail["by"]) == ("denied", DEADLINE_ACTOR)
        assert f"{action} by {'alice' if action == 'approve' else 'bob'} came after it" in ev.detail["reason"]
    w = q.register_worker("payments")
    assert q.claim(w, queue="payments") == []
    assert q.expire_approvals() == 0  # nothing left for the sweep
    with q.store.transaction() as tx:
        entries = tx.rows("audit_list", limit=10)
    # the refused decisions are not in the audit log; the deadline's denials are, naming them
    assert [e["actor"] for e in entries] == [DEADLINE_ACTOR] * 2
    assert sorted(e["detail"]["late_decision"]["action"] for e in entries) == ["approve", "deny"]


def test_an_approval_made_in_time_stands_after_the_deadline(q: leaseq.Queue) -> None:
    t = _gated(q, approval_deadline=1.0)
    q.approve(t.id, q.approval(t.id).digest, by="alice")
    deadline = _past_deadline(q, t.id)
    decided = q.approval(t.id)
    assert decided.decided_at < deadline
    assert q.expire_approvals() == 0
    w = q.register_worker("payments")
    [c] = q.claim(w, queue="payments")
    assert c.task_id == t.id


def _approve_late_by_hand(q: leaseq.Queue, task_id: int) -> None:
    """What an approval written after the deadline leaves (by hand, or by a leaseq before version 14,
    whose decision was not judged against the deadline): the request approved late, the task queued."""
    clock = "clock_timestamp()" if q.dialect == "postgres" else "(julianday('now') - 2440587.5) * 86400.0"
    with q.store.transaction() as tx:
        if q.dialect == "postgres":  # by hand: as the schema's owner (a trigger refuses lease writes by others)
            tx.script("SET LOCAL ROLE leaseq_owner")
        tx.script(f"UPDATE leaseq_approvals SET decision = 'approved', decided_by = 'old-replica', "
                  f"decided_via = 'api', decided_at = {clock} WHERE task_id = {task_id}")
        tx.script(f"UPDATE leaseq_tasks SET status = 'queued' WHERE id = {task_id}")


def test_the_claim_never_takes_a_task_approved_after_its_deadline(q: leaseq.Queue) -> None:
    # the one approved in time has a deadline no slow machine reaches before its approval
    late, in_time = _gated(q, approval_deadline=0.05), _gated(q, {"order": 8}, approval_deadline=60)
    q.approve(in_time.id, q.approval(in_time.id).digest, by="alice")
    _past_deadline(q, late.id)
    _approve_late_by_hand(q, late.id)
    decided = q.approval(late.id)
    assert decided.decision == "approved" and decided.decided_at >= decided.deadline_at
    w = q.register_worker("payments")
    claimed = [c.task_id for c in q.claim(w, queue="payments", limit=10)]
    assert claimed == [in_time.id]  # the late one is passed over
    assert q.claim(w, queue="payments") == []
    assert q.expire_approvals() == 1  # and the deadline job ends it
    assert q.get(late.id).status == "denied" and q.get(in_time.id).status == "running"
    ev = q.events(late.id)[-1]
    assert (ev.type, ev.detail["by"]) == ("denied", DEADLINE_ACTOR) and "does not count" in ev.detail["reason"]
    assert q.expire_approvals() == 0


def test_a_decision_that_waits_for_the_task_past_its_deadline_is_too_late(q: leaseq.Queue, dsn: str) -> None:
    """The decision and the deadline interleave: an approval begins before the deadline and waits for
    the task's row (another transaction holds it) until after it. Judged when it is made, it is too late."""
    t = _gated(q, approval_deadline=0.6)
    digest, deadline = q.approval(t.id).digest, q.approval(t.id).deadline_at
    assert deadline is not None
    until_deadline = (deadline - q.now()).total_seconds()  # read now: SQLite's clock reads wait for its lock
    outcome: list[Any] = []
    if q.dialect == "postgres":
        holder: Any = own_connection(dsn)
        holder.execute("SELECT 1 FROM leaseq_tasks WHERE id = %s FOR UPDATE", (t.id,))
    else:
        import sqlite3

        from leaseq.store.base import parse_dsn

        holder = sqlite3.connect(parse_dsn(dsn)[1], isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")

    def approve() -> None:
        with leaseq.connect(dsn) as mine:
            try:
                outcome.append(mine.approve(t.id, digest, by="alice"))
            except Exception as exc:  # asserted below
                outcome.append(exc)

    try:
        deciding = threading.Thread(target=approve)
        deciding.start()
        time.sleep(0.2)  # the approval is waiting for the task (its transaction began before the deadline)
        assert outcome == []
        time.sleep(max(until_deadline, 0.0) + 0.2)
    finally:
        holder.rollback() if q.dialect == "postgres" else holder.execute("ROLLBACK")
        holder.close()
    deciding.join(timeout=60)
    [refused] = outcome
    assert isinstance(refused, leaseq.ApprovalExpired), refused
    decided = q.approval(t.id)
    assert (decided.decision, decided.decided_by, q.get(t.id).status) == ("denied", DEADLINE_ACTOR, "denied")
    assert decided.decided_at >= decided.deadline_at


def test_decisions_racing_the_deadline_are_made_in_time_or_refused(dsn: str) -> None:
    """Approvals aimed just before and just after each request's deadline, a deadline job and a claimer,
    each on its own connection: every request is decided once, an approval that stands was made before
    its deadline by the database clock, and no task approved late is ever claimed."""
    n = 24
    with leaseq.connect(dsn) as q:
        q.migrate()
        ids = [_gated(q, {"order": i}, approval_deadline=2.0 + 0.06 * i).id for i in range(n)]
        shown = {a.task_id: a for a in q.approvals(limit=100)}
    outcomes: dict[int, str] = {}
    claimed: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def approver() -> None:
        with leaseq.connect(dsn) as mine:
            for n_, task_id in enumerate(ids):  # even: 100 ms before its deadline, odd: 25 ms after
                deadline = shown[task_id].deadline_at
                assert deadline is not None
                aim = deadline + timedelta(seconds=0.025 if n_ % 2 else -0.1)
                while mine.now() < aim:
                    time.sleep(0.002)
                try:
                    mine.approve(task_id, shown[task_id].digest, by="alice")
                    outcomes[task_id] = "approved"
                except leaseq.ApprovalExpired:
                    outcomes[task_id] = "too late"
                except leaseq.InvalidTransition:
                    outcomes[task_id] = "denied first"

    def sweeper() -> None:
        with leaseq.connect(dsn) as mine:
            while not stop.is_set():
                mine.expire_approvals()
                time.sleep(0.1)

    def claimer() -> None:
        with leaseq.connect(dsn) as mine:
            w = mine.register_worker("payments")
            while not stop.is_set():
                claimed.extend(c.task_id for c in mine.claim(w, queue="payments", limit=10))
                time.sleep(0.01)

    def guarded(fn: Any) -> Any:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported below
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guarded(fn)) for fn in (approver, sweeper, claimer)]
    for th in threads:
        th.start()
    threads[0].join(timeout=120)
    stop.set()
    for th in threads[1:]:
        th.join(timeout=60)
    assert errors == []
    with leaseq.connect(dsn) as q:
        q.expire_approvals()
        w = q.register_worker("late")
        claimed.extend(c.task_id for c in q.claim(w, queue="payments", limit=100))
        for task_id in ids:
            decided, task = q.approval(task_id), q.get(task_id)
            assert len([e for e in q.events(task_id) if e.type in ("approved", "denied")]) == 1, task_id
            assert decided.deadline_at is not None and decided.decided_at is not None
            if outcomes[task_id] == "approved":
                assert decided.decision == "approved" and decided.decided_at < decided.deadline_at
                assert task.status == "running" and task_id in claimed
            else:
                assert (decided.decision, decided.decided_by, task.status) == ("denied", DEADLINE_ACTOR, "denied")
                assert task_id not in claimed
    assert len(claimed) == len(set(claimed))
    # the approvals straddled the deadlines: some stood, some came too late
    assert "approved" in outcomes.values() and set(outcomes.values()) - {"approved"}, outcomes


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


def test_an_intent_whose_ended_child_retention_removed_is_refused_naming_it(q: leaseq.Queue, dsn: str) -> None:
    w, c = _agent(q)
    child = q.intend(w, c, "payments.refund", {"order": 7}, key="refund", queue="payments")
    [cc] = q.claim(q.register_worker("executor"), queue="payments")
    q.complete(cc.worker_id, cc, result={"refunded": True})
    time.sleep(0.01)
    assert q.prune(older_than_seconds=0.001)["tasks"] == 1  # the child ended and was removed
    before = snapshot(dsn)
    with pytest.raises(leaseq.NotFound, match=f"recorded task {child.id}, which has ended and was removed"):
        q.intend(w, c, "payments.refund", {"order": 7}, key="refund", queue="payments")  # a replay
    assert snapshot(dsn) == before


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


# -- the requester never decides -----------------------------------------------------------

def test_the_worker_that_recorded_an_intent_never_decides_it(q: leaseq.Queue, dsn: str) -> None:
    w, c = _agent(q)
    child = q.intend(w, c, "payments.refund", {"order": 7}, key="refund", queue="payments", approval="required")
    [req] = q.approvals()
    assert (req.requested_by, req.requested_worker, req.requested_token) == (f"task:{c.task_id}", w.id, None)
    assert q.get(child.id).parent_task_id == c.task_id
    before = snapshot(dsn)
    for decide in (lambda: q.approve(child.id, req.digest, by="agent", worker=w),
                   lambda: q.deny(child.id, "withdrawn", by="agent", worker=w.id)):
        with pytest.raises(AccessDenied, match=f"requested by worker {w.id}"):
            decide()
    assert snapshot(dsn) == before  # nothing decided, nothing recorded
    supervisor = q.register_worker("supervisor")
    assert q.approve(child.id, req.digest, by="supervisor", worker=supervisor).status == "queued"


def test_the_task_that_recorded_an_intent_never_decides_it_from_any_worker(q: leaseq.Queue, dsn: str) -> None:
    """A retried agent task, on another worker, deciding from its handler: still the requester."""
    import logging

    from leaseq.worker.context import TaskContext
    from leaseq.worker.tools import current_context

    w, c = _agent(q)
    child = q.intend(w, c, "payments.refund", {"order": 7}, key="refund", queue="payments", approval="required")
    digest = q.approval(child.id).digest
    q.fail(w, c, "the model timed out", delay=0)
    other = q.register_worker("agent-2")
    [c2] = q.claim(other, queue="agents")
    handler = TaskContext(q, other, c2, logging.LoggerAdapter(logging.getLogger("test"), {}))
    before = snapshot(dsn)
    async def deny_from_an_async_handler() -> None:
        try:
            await leaseq.AsyncQueue(q).deny(child.id, "withdrawn", by="agent")
        finally:
            await q.close_async()  # this loop's connections

    running = current_context.set(handler)  # what the worker runtime sets around the handler of c2
    try:
        with pytest.raises(AccessDenied, match=f"requested by task {c.task_id}"):
            q.approve(child.id, digest, by="agent")
        with pytest.raises(AccessDenied, match=f"requested by task {c.task_id}"):
            asyncio.run(deny_from_an_async_handler())
    finally:
        current_context.reset(running)
    assert snapshot(dsn) == before
    assert q.approve(child.id, digest, by="alice").status == "queued"  # a person, outside any handler


def test_the_token_that_enqueued_a_gated_task_never_decides_it(q: leaseq.Queue, dsn: str) -> None:
    t = _gated(q, token_id="0123456789ab")
    req = q.approval(t.id)
    assert (req.requested_by, req.requested_token, req.requested_worker) == ("agent-7", "0123456789ab", None)
    before = snapshot(dsn)
    for decide in (lambda: q.approve(t.id, req.digest, by="olga", token_id="0123456789ab"),
                   lambda: q.deny(t.id, "mine", by="olga", token_id="0123456789ab")):
        with pytest.raises(AccessDenied, match="requested by token 0123456789ab"):
            decide()
    assert snapshot(dsn) == before
    assert q.approve(t.id, req.digest, by="oscar", token_id="ba9876543210").status == "queued"


def test_the_token_that_registered_the_intents_worker_never_decides_it(q: leaseq.Queue, dsn: str) -> None:
    """The worker that recorded the intent was registered with a token (as the service registers
    them): that token, deciding, is the requester too, though the intent was recorded without it."""
    w = q.register_worker("agent", token_id="0123456789ab")
    q.enqueue("agent.run", {"ticket": 1}, effect="idempotent", queue="agents")
    [c] = q.claim(w, queue="agents")
    child = q.intend(w, c, "payments.refund", {"order": 7}, key="refund", queue="payments", approval="required")
    req = q.approval(child.id)
    assert (req.requested_worker, req.requested_token) == (w.id, None)
    before = snapshot(dsn)
    with pytest.raises(AccessDenied, match="registered with token 0123456789ab"):
        q.approve(child.id, req.digest, by="olga", token_id="0123456789ab")
    assert snapshot(dsn) == before
    assert q.approve(child.id, req.digest, by="oscar", token_id="ba9876543210").status == "queued"


# -- cancelling the task that recorded intents --------------------------------------------------

def _cancel(dsn: str, mode: str, task_id: int, **options: Any) -> leaseq.Task:
    """Cancel on a connection of its own, with the sync Queue or the AsyncQueue."""
    if mode == "sync":
        with leaseq.connect(dsn) as other:
            return other.cancel(task_id, **options)

    async def cancel() -> leaseq.Task:
        async with await leaseq.connect_async(dsn) as aq:
            return await aq.cancel(task_id, **options)

    return asyncio.run(cancel())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cancelling_a_task_cancels_its_intents_that_have_not_started(q: leaseq.Queue, dsn: str, mode: str) -> None:
    w, c = _agent(q)
    gated = q.intend(w, c, "payments.refund", {"order": 7}, key="refund", queue="payments", approval="required")
    queued = q.intend(w, c, "mail.send", {"to": "ann"}, key="mail", queue="mail")
    running = q.intend(w, c, "crm.note", {"n": 1}, key="note", queue="crm")
    report = q.enqueue("report", {}, queue="reports", after=[queued.id])  # waits for one of the intents
    unrelated = q.enqueue("mail.send", {"to": "bob"}, queue="mail")
    executor = q.register_worker("executor")
    [on_crm] = q.claim(executor, queue="crm")
    assert {q.get(i).parent_task_id for i in (gated.id, queued.id, running.id)} == {c.task_id}
    assert q.get(unrelated.id).parent_task_id is None and q.get(c.task_id).parent_task_id is None

    assert _cancel(dsn, mode, c.task_id, reason="the customer withdrew", by="olga").status == "cancelled"

    for child, previous in ((gated, "awaiting_approval"), (queued, "queued")):
        t = q.get(child.id)
        assert (t.status, t.last_error) == ("cancelled", f"cancelled: its parent task {c.task_id} was cancelled")
        assert t.parent_cancelled_at is not None
        ev = q.events(child.id)[-1]
        assert (ev.type, ev.detail) == ("cancelled", {
            "by": "olga", "reason": f"its parent task {c.task_id} was cancelled: the customer withdrew",
            "previous_status": previous, "parent_task_id": c.task_id})
    assert q.get(report.id).status == "cancelled"  # the task waiting for a cancelled intent moves on
    assert q.approvals() == []
    assert q.claim(executor, queue="payments") == []  # the executors run none of them
    assert [x.task_id for x in q.claim(executor, queue="mail", limit=10)] == [unrelated.id]
    # the intent already running is left to its lease, and its executor can see why it might stop
    r = q.get(running.id)
    assert (r.status, r.lease_owner) == ("running", executor.id) and r.parent_cancelled_at is not None
    [told] = [e for e in q.events(running.id) if e.type == "parent_cancelled"]
    assert told.detail == {"by": "olga", "reason": "the customer withdrew", "parent_task_id": c.task_id,
                           "status": "running"}
    q.complete(executor, on_crm, {"noted": True})
    assert q.get(running.id).status == "completed"
    if q.dialect == "postgres":  # one transaction: one now()
        assert q.get(gated.id).updated_at == q.get(queued.id).updated_at == q.get(c.task_id).updated_at
    with q.store.transaction() as tx:
        [entry] = [r for r in tx.rows("audit_list", limit=20) if r["action"] == "cancel"]
    assert (entry["detail"]["cancelled_intents"], entry["detail"]["marked_intents"]) == (
        sorted([gated.id, queued.id]), [running.id])


def test_a_cancelled_intent_cancels_its_own_and_a_reconciliation_cancels_them_too(q: leaseq.Queue) -> None:
    """The agent task ends needs_reconciliation and is reconciled with cancel: its intent, queued again
    after an attempt that recorded an intent of its own, is cancelled, and so is that one."""
    w, c = _agent(q, effect="side_effect")
    step = q.intend(w, c, "exec.step", {}, key="step", queue="exec", effect="idempotent")
    executor = q.register_worker("exec")
    [on_exec] = q.claim(executor, queue="exec")
    mail = q.intend(executor, on_exec, "mail.send", {"to": "ann"}, key="mail", queue="mail")
    q.fail(executor, on_exec, "flaky", delay=0)
    assert q.get(step.id).status == "queued" and q.get(mail.id).parent_task_id == step.id
    q.begin_effect(w, c, "payments.charge")  # a side effect left open when the lease runs out
    run_out(q, w, c)
    q.sweep()
    assert q.get(c.task_id).status == "needs_reconciliation"
    q.reconcile(c.task_id, "cancel", "the charge never went out", by="olga")
    assert (q.get(step.id).status, q.get(mail.id).status) == ("cancelled", "cancelled")
    ev = q.events(mail.id)[-1]
    assert (ev.type, ev.detail["parent_task_id"], ev.detail["by"]) == ("cancelled", step.id, "olga")
