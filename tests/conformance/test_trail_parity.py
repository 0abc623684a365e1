"""The evidence trail is the same on both backends, field by field.

PostgreSQL writes most events inside the statement that makes the change (its
data-modifying CTEs build their details in SQL); SQLite's statements cannot,
and the engine writes the same events in Python beside them. Two writers of
one record drift apart unnoticed unless something compares them: this test
runs one scenario, covering every kind of transition a task goes through, on
a fresh SQLite database and a fresh PostgreSQL schema, and compares the two
trails event by event and detail field by field. Values that depend on the
moment (times, durations, ids the database hands out) are compared by their
kind only.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import leaseq

from .support import WORKING_LEASE, run_out, wait_until

_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
#: an idempotency key the queue made for a task enqueued without one
_GENERATED_KEY = re.compile(r"^[0-9a-f]{32}$")


def _scenario(q: leaseq.Queue) -> dict[str, list[int]]:
    """Every transition a task can go through, on ``q``; the tasks, by what they show."""
    q.migrate()
    a, b = q.register_worker("a"), q.register_worker("b")
    tasks: dict[str, list[int]] = {}

    # claimed, heartbeats, effects answered and open, expired with an intent open, reconciled,
    # failed and blocked, unblocked, failed for good, requeued, completed
    t = q.enqueue("refund", {"order": 1}, effect="side_effect", idempotency_key="refund-1", max_attempts=9)
    [c] = q.claim(a, lease_seconds=WORKING_LEASE)
    q.heartbeat(a, c)
    fx = q.begin_effect(a, c, "crm.lookup")
    q.finish_effect(a, c, fx, response={"customer": 7})
    q.begin_effect(a, c, "payments.refund")
    run_out(q, a, c)
    assert q.claim(b) == []  # routes the expired lease first
    q.reconcile(t.id, "requeue", note="provider has no refund", by="alice")
    [c] = q.claim(b)
    q.fail(b, c, "401 card vault token revoked", block=True)
    q.unblock(t.id, note="token rotated", by="alice")
    [c] = q.claim(b)
    q.fail(b, c, "order is malformed", retry=False)
    q.requeue(t.id, note="order fixed", by="bob")
    [c] = q.claim(b)
    q.complete(b, c, result={"refund": "r-1"})
    tasks["side effect"] = [t.id]

    # a retry on request, a failure retried, a release, a release unstarted, then completed
    t = q.enqueue("lookup", {"n": 2}, max_attempts=5)
    [c] = q.claim(a)
    q.retry(a, c, after=0, reason="rate limited")
    [c] = q.claim(a)
    q.fail(a, c, "timeout talking to the index", delay=0)
    [c] = q.claim(a)
    q.release(a, c, "worker shutting down")
    [c] = q.claim(a)
    q.release(a, c, "never started", started=False)
    [c] = q.claim(a)
    q.complete(a, c, result=[1, 2])
    tasks["retried"] = [t.id]

    # a read-only lease run out and routed back to the queue, then the same error until dead
    t = q.enqueue("index", {"n": 3}, max_attempts=2)
    [c] = q.claim(a, lease_seconds=WORKING_LEASE)
    run_out(q, a, c)
    assert q.sweep() == 1
    [c] = q.claim(b)
    q.fail(b, c, "index is gone", delay=0)
    tasks["expired"] = [t.id]

    # approvals: approved and run, denied, and run out by their deadline
    approved = q.enqueue("pay", {"order": 4}, effect="side_effect", approval="required")
    denied = q.enqueue("pay", {"order": 5}, effect="side_effect", approval="required")
    late = q.enqueue("pay", {"order": 6}, effect="side_effect", approval="required", approval_deadline=0.05)
    q.approve(approved.id, q.approval(approved.id).digest, note="looks right", by="alice")
    q.deny(denied.id, "not this one", by="alice")
    deadline = q.approval(late.id).deadline_at
    assert deadline is not None
    wait_until(q, deadline + timedelta(milliseconds=10))
    assert q.expire_approvals() == 1
    [c] = q.claim(a)
    q.complete(a, c)
    tasks["approvals"] = [approved.id, denied.id, late.id]

    # dependencies: a waiter released by its upstream, one cancelled by its failure; a cancel
    up = q.enqueue("up", {"n": 7})
    down = q.enqueue("down", {"n": 8}, after=[up.id])
    bad = q.enqueue("up", {"n": 9}, max_attempts=1)
    orphan = q.enqueue("down", {"n": 10}, after=[bad.id])
    [c1, c2] = q.claim(a, limit=2)
    q.complete(a, c1 if c1.task_id == up.id else c2)
    q.fail(a, c2 if c1.task_id == up.id else c1, "upstream broke")
    [c] = q.claim(a)
    q.complete(a, c)
    cancelled = q.enqueue("later", {"n": 11})
    q.cancel(cancelled.id, "not needed", by="bob")
    [c] = q.claim(a, limit=1) or [None]
    assert c is None
    tasks["dependencies"] = [up.id, down.id, bad.id, orphan.id, cancelled.id]

    # a worker revoked while holding a lease
    t = q.enqueue("long", {"n": 12})
    [c] = q.claim(b)
    q.revoke_worker(b, by="alice")
    tasks["revoked"] = [t.id]
    return tasks


def _kind(value: Any) -> Any:
    """What is compared of one detail value: itself, or its kind where it depends on the moment."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):  # JSON has one kind of number: 1 and 1.0 are the same
        return float(value)
    if isinstance(value, str):
        if _GENERATED_KEY.match(value):
            return "<generated key>"
        return "<time>" if _TIME.match(value) else value
    if isinstance(value, dict):
        return {k: _kind(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_kind(v) for v in value]
    return value


def _trail(q: leaseq.Queue, task_id: int, workers: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for e in q.events(task_id):
        detail = dict(e.detail or {})
        for key in ("heartbeats", "longest_heartbeat_gap", "last_heartbeat_at"):
            detail.pop(key, None)  # renewals race the database clock: their counts are the moment's
        out.append({"type": e.type, "generation": e.generation, "worker": workers.get(e.worker_id or "", e.worker_id),
                    "detail": _kind(detail)})
    return out


def _trails(q: leaseq.Queue, tasks: dict[str, list[int]]) -> dict[str, list[list[dict[str, Any]]]]:
    workers = {w.id: w.name for w in q.workers()}
    return {name: [_trail(q, i, workers) for i in ids] for name, ids in tasks.items()}


def test_both_backends_write_the_same_trail_field_by_field(tmp_path, pg_schema_dsn: str) -> None:
    with leaseq.connect(f"sqlite:///{tmp_path / 'leaseq.db'}") as lite, leaseq.connect(pg_schema_dsn) as pg:
        found = {"sqlite": _trails(lite, _scenario(lite)), "postgres": _trails(pg, _scenario(pg))}
    differences = []
    for name, lite_trails in found["sqlite"].items():
        for lite_trail, pg_trail in zip(lite_trails, found["postgres"][name]):
            for n in range(max(len(lite_trail), len(pg_trail))):
                left = lite_trail[n] if n < len(lite_trail) else None
                right = pg_trail[n] if n < len(pg_trail) else None
                if left != right:
                    differences.append(f"{name}, event {n}:\n  sqlite:   {left}\n  postgres: {right}")
                    break
    assert not differences, "the backends' trails differ:\n" + "\n".join(differences)
