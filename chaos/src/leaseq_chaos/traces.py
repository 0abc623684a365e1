"""Trace validation: a task's evidence trail, replayed against the model of the lease protocol.

The events table records every claim, completion, failure, release, routing,
revocation, cancellation, intent and response of a task, in the order the
database committed them (a task's events are written under its row lock, so
their ids follow that order). :func:`validate_trail` replays them, one by
one, through the transitions of :class:`leaseq_chaos.model.TaskModel` (the
transcription of ``model/lease.pml``): the first event the model does not
allow, in that state, is a violation naming the task, the generation and the
event. Renewals leave no event; the clock's expiry is silent and is applied
when an event needs it (a routing), which is exact: expiry only ever takes
permissions away.

A revocation is in a task's trail only where it ended a lease of the task
(``lease_revoked``). Where the caller knows a database time by which a
worker's revocation had committed (``revoked``: read after
``revoke_worker()`` returned; on SQLite, which writes one transaction at a
time, the worker row's ``revoked_at``), the revocation is also placed before
the first event recorded after that time: a lease of that worker still held
there, which no ``lease_revoked`` ended, is a violation, and so is any claim
or lease-backed write of that worker after it.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Iterable

from . import model as m
from .model import TaskModel

#: Events written under the lease guard, by the attempt that holds it.
_HOLDER_EVENTS = frozenset({"completed", "failed", "lease_released", "retry_requested", "effect_intent",
                            "effect_response", "tool_replayed", "intent_recorded", "renewed", "suspended",
                            "signal_received", "wait_timed_out", "stream_started", "child_spawned", "children_awaited",
                            "budget_exceeded", "diverged"})
#: Events that end a generation by its holder's hand (report_loss refuses a report after them).
_HOLDER_ENDS = frozenset({"completed", "failed", "lease_released", "suspended", "diverged", "lease_lost"})
#: The status events that follow a routing to somewhere other than the queue.
_REASON_EVENTS = frozenset({m.DEAD, m.BLOCKED, m.RECON})
#: Evidence that changes nothing the model holds (singleton_skipped: an enqueue answered with
#: the task that holds its singleton key, in whatever state that task is; tree_cancelled: the
#: dispositions of a cancelled task's children and open effects, after its cancelled event).
_EVIDENCE_ONLY = frozenset({"parent_cancelled", "singleton_skipped", "tree_cancelled"})
#: Evidence of a durable wait (or of an attempt's first stream entry) written by its holder under
#: the lease, changing nothing the model holds.
_WAIT_EVIDENCE = frozenset({"signal_received", "wait_timed_out", "stream_started", "child_spawned", "children_awaited",
                            "budget_exceeded"})


class TraceViolation(Exception):
    """An event the model does not allow."""


def epoch_seconds(value: Any) -> float | None:
    """A database time (a datetime, epoch seconds, or its string form in a saved history) as epoch
    seconds; None for None or an unreadable one."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None


def _as_dict(event: Any) -> dict[str, Any]:
    if isinstance(event, dict):
        return event
    return dataclasses.asdict(event)


class _Replay:
    """The replay of one trail: the model's state and what the trail has said so far."""

    def __init__(self, task: dict[str, Any] | None):
        self.m = TaskModel()
        if task is not None:
            self.m.effect = task.get("effect") or self.m.effect
            self.m.max_attempts = task.get("max_attempts")
        self.started = False
        self.claimed_by: dict[int, str] = {}  # generation -> worker
        self.holder_ended: set[int] = set()  # generations ended by completed/failed/released/lost
        self.expect: tuple[str, int | None, str | None] | None = None  # (type, generation, worker)

    def fail(self, why: str) -> None:
        raise TraceViolation(why)

    def routed(self, to: str | None, allowed: set[str]) -> str:
        """The destination a routing recorded, checked against the recovery policy."""
        if to is None:  # the detail was scrubbed: the status event that follows (if any) says it
            to = next(iter(allowed)) if len(allowed) == 1 else None
        if to is not None and to not in allowed:
            self.fail(f"routed to {to}, but the recovery policy sends it to {' or '.join(sorted(allowed))}"
                      + (" (an open side-effect intent)" if self.m.recon_due() else ""))
        return to or m.QUEUED

    def after_routing(self, to: str, g: int | None, w: str | None) -> None:
        if to in _REASON_EVENTS:
            self.expect = (to, g, w)

    def step(self, e: dict[str, Any]) -> None:
        t, g, w = e["type"], e.get("generation"), e.get("worker_id")
        d = e.get("detail") or {}
        s = self.m
        if self.expect is not None:
            want, wg, _ = self.expect
            self.expect = None
            if t != want or (g is not None and wg is not None and g != wg):
                self.fail(f"expected the {want} event of generation {wg} first")
            return
        if t == "enqueued":
            s.effect = d.get("effect") or s.effect
            return
        if not self.started:  # the enqueue's own transaction decides where the task begins
            self.started = True
            if t == "waiting":
                s.status = m.WAITING
                return
        if isinstance(d.get("attempt"), int):  # the implementation's count, for the routing rule
            s.attempts = d["attempt"] - (1 if t == "claimed" else 0)
        if t in _HOLDER_EVENTS and not s.holds(w, g):
            self.fail(self.refusal(w, g))
        if t == "claimed":
            if not s.can_claim(w):
                self.fail(f"claimed while the task was {s.status}" if s.status != m.QUEUED
                          else f"claimed by worker {w} after its revocation")
            if g != s.gen + 1:
                self.fail(f"claimed as generation {g}, but the next generation is {s.gen + 1}")
            s.do_claim(w)
            self.claimed_by[g] = w
        elif t == "renewed":
            pass
        elif t == "completed":
            s.do_complete(w, g)
            self.holder_ended.add(g)
        elif t == "failed":
            to = d.get("next_status")
            allowed = {x for x in (m.QUEUED, m.DEAD, m.BLOCKED, m.RECON) if s.can_fail(w, g, x)}
            to = self.routed(to, allowed)
            s.do_fail(w, g, to)
            self.holder_ended.add(g)
            self.after_routing(to, g, w)
        elif t == "retry_requested":
            to = self.routed(d.get("next_status"), {m.RECON} if s.recon_due() else {m.QUEUED})
            s.attempts = max(s.attempts - 1, 0)
            s.do_fail(w, g, to)
            self.after_routing(to, g, w)
        elif t == "lease_released":
            if d.get("started") is False:
                s.attempts = max(s.attempts - 1, 0)
            to = self.routed(d.get("routed_to"), s.route_to())
            s.do_release(w, g, to)
            self.holder_ended.add(g)
            self.after_routing(to, g, w)
        elif t == "suspended":  # a durable wait ends the attempt like a release, given back
            # (a budget spent waits for a person: awaiting_approval)
            rests = m.AWAITING if d.get("waiting_for") == "approval" else m.WAITING
            to = self.routed(d.get("next_status"), {m.RECON} if s.recon_due() else {rests})
            s.do_suspend(w, g, to)
            self.holder_ended.add(g)
            self.after_routing(to, g, w)
        elif t == "diverged":  # the handler diverged from its recorded run: the attempt ends like a
            # durable wait's, given back, and the task goes to reconciliation
            to = self.routed(d.get("next_status"), {m.RECON})
            s.do_suspend(w, g, to)
            self.holder_ended.add(g)
            self.after_routing(to, g, w)
        elif t in _WAIT_EVIDENCE:
            pass
        elif t == "woke":
            if not s.can_wake():
                self.fail(f"woke while {s.status}")
            s.do_wake()
        elif t == "signal_sent":
            if s.status in (m.COMPLETED, m.CANCELLED, m.DENIED, m.DEAD, m.EXPIRED):
                self.fail(f"signal accepted while {s.status}")
        elif t == "answered":  # a person's answer to ctx.ask: taken only by a task that waits for it
            if s.status != m.WAITING:
                self.fail(f"answer accepted while {s.status}")
        elif t == "lease_expired":
            if not (s.status == m.RUNNING and s.gen == g and s.owner == w):
                self.fail(f"routed an expired lease of generation {g} held by {w}, but the task is "
                          f"{s.status}" + (f" under generation {s.gen} of {s.owner}" if s.status == m.RUNNING else ""))
            if s.can_expire():
                s.do_expire()  # the clock's step, silent in the trail
            if isinstance(d.get("open_intents"), int) and d["open_intents"] != len(s.intents):
                self.fail(f"routed with {d['open_intents']} open intents recorded, the trail opened {len(s.intents)}")
            to = self.routed(d.get("routed_to"), s.route_to())
            s.do_route(to)
            self.after_routing(to, g, w)
        elif t == "worker_revoked":  # the model's own marker (the trail has only lease_revoked)
            self.revoke(w, None)
        elif t == "lease_revoked":
            if not (s.status == m.RUNNING and s.owner == w and s.gen == g):
                self.fail(f"revoked the lease of generation {g} held by {w}, but the task is {s.status}"
                          + (f" under generation {s.gen} of {s.owner}" if s.status == m.RUNNING else ""))
            s.do_revoke(w)
        elif t == "lease_lost":
            if self.claimed_by.get(g) != w:
                self.fail(f"loss reported by {w}, which was never issued generation {g}")
            if g in self.holder_ended:
                self.fail(f"loss reported for generation {g}, which had already ended by its holder's hand")
            self.holder_ended.add(g)
        elif t == "effect_intent":
            fx = d.get("effect_id", 1)
            if s.intents.get(fx, (None,))[0] == g:
                self.fail(f"intent {fx} recorded twice by generation {g}")
            s.do_begin(w, g, fx, d.get("effect"))
        elif t == "effect_response":
            fx = d.get("effect_id", 1)
            if not s.can_finish(w, g, fx):
                self.fail(f"response to intent {fx}, which generation {g} does not hold open")
            s.do_finish(w, g, fx)
        elif t == "intent_recorded":  # begun and answered in one transaction: an open one is closed
            s.intents.pop(d.get("effect_id"), None)
        elif t == "tool_replayed":
            pass
        elif t == "cancelled":
            if not s.can_cancel():
                self.fail(f"cancelled while {s.status}")
            if g is not None and g != s.gen:
                self.fail(f"cancelled naming generation {g}, but the task is at generation {s.gen}")
            before = d.get("previous_status")
            if before is not None and before != s.status:
                self.fail(f"cancelled from {before}, but the task was {s.status}")
            s.do_cancel()
        elif t in _EVIDENCE_ONLY:
            pass
        elif t == "debounced":  # an enqueue collapsed into the task: trailing, only before its first claim
            if d.get("mode") == "trailing" and (s.status != m.QUEUED or s.gen != 0):
                self.fail(f"a trailing debounce collapsed into a task {s.status} at generation {s.gen}")
        elif t == "reconciled":
            if not s.can_reconcile():
                self.fail(f"reconciled while {s.status}")
            s.do_reconcile(d.get("outcome", m.R_REQUEUE))
        elif t == "requeued":
            if not s.can_requeue():
                self.fail(f"requeued while {s.status}")
            s.do_requeue()
        elif t == "unblocked":
            if not s.can_unblock():
                self.fail(f"unblocked while {s.status}")
            s.do_unblock()
        elif t == "approval_requested":
            if s.status not in (m.QUEUED, m.WAITING):
                self.fail(f"approval requested while {s.status}")
            s.status = m.AWAITING
        elif t == "approved":
            if not s.can_approve():
                self.fail(f"approved while {s.status}")
            s.do_approve()
        elif t == "denied":
            if not (s.can_deny() or s.status == m.WAITING):
                self.fail(f"denied while {s.status}")
            s.do_deny()
        elif t == "waiting":
            if s.status != m.QUEUED:
                self.fail(f"set waiting while {s.status}")
            s.status = m.WAITING
        elif t == "dependencies_met":
            if s.status != m.WAITING:
                self.fail(f"dependencies met while {s.status}")
            s.status = m.QUEUED
        elif t == m.BLOCKED and d.get("previous_status") == m.WAITING:
            if s.status != m.WAITING:
                self.fail(f"blocked by a dependency while {s.status}")
            s.status = m.BLOCKED
        elif t == "deadline_passed":
            if s.status not in (m.QUEUED, m.WAITING, m.AWAITING):
                self.fail(f"deadline passed while {s.status}")
            s.status = m.EXPIRED
        else:
            self.fail(f"the model knows no event {t!r} here")

    def refusal(self, w: str | None, g: int | None) -> str:
        s = self.m
        if s.status != m.RUNNING:
            return f"accepted from generation {g} of {w} while the task was {s.status}"
        if s.gen != g:
            return f"accepted from generation {g} of {w}, superseded by generation {s.gen}"
        if s.owner != w:
            return f"accepted from {w}, but generation {g} is held by {s.owner}"
        return f"accepted from generation {g} of {w} after its lease ended"

    def revoke(self, w: str, bound: float | None) -> None:
        """Worker ``w``'s revocation, placed here: a lease it still holds must have a lease_revoked next."""
        s = self.m
        if s.status == m.RUNNING and s.owner == w:
            if bound is not None:
                self.fail(f"worker {w} was revoked (committed by {bound:.6f}) while it held generation "
                          f"{s.gen}, and no lease_revoked ended it")
            self.expect = ("lease_revoked", s.gen, w)
        s.do_revoke(w)


def validate_trail(events: Iterable[Any], *, task: dict[str, Any] | None = None,
                   revoked: dict[str, float] | None = None) -> dict[str, Any] | None:
    """Replay one task's events (oldest first) against the model.

    ``task``: the task row (its ``effect`` and ``max_attempts`` sharpen the
    routing rule); ``revoked``: worker id -> a database time (epoch seconds)
    by which that worker's revocation had committed. Returns None when the
    model allows the whole trail, else the first violation: ``{"task",
    "generation", "event", "index", "why"}``."""
    replay = _Replay(task)
    pending = dict(revoked or {})
    trail = [_as_dict(e) for e in events]
    task_id = task.get("id") if task else (trail[0].get("task_id") if trail else None)
    e: dict[str, Any] = {}
    i = -1
    try:
        for i, e in enumerate(trail):
            at = epoch_seconds(e.get("at"))
            for w, bound in sorted(pending.items()):
                if at is not None and at > bound and e.get("type") != "enqueued":
                    del pending[w]
                    if e["type"] == "lease_revoked" and e.get("worker_id") == w:
                        continue  # the revocation's own event: it is the revocation point
                    replay.revoke(w, bound)
            if e["type"] == "lease_revoked" and e.get("worker_id") in pending:
                pending.pop(e["worker_id"])
            replay.step(e)
        if replay.expect is not None:
            want, wg, _ = replay.expect
            raise TraceViolation(f"the trail ends where the {want} event of generation {wg} was due")
        for w, bound in sorted(pending.items()):
            replay.revoke(w, bound)
    except TraceViolation as exc:
        return {"task": task_id, "generation": e.get("generation"), "event": e.get("type"),
                "index": i, "why": str(exc)}
    return None


def describe(v: dict[str, Any]) -> str:
    """A violation as one line: the task, the generation and the event named."""
    return (f"task {v['task']}: event #{v['index']} {v['event']} (generation {v['generation']}): "
            f"{v['why']}")


def validate_queue(q: Any, *, revoked: dict[str, float] | None = None, limit: int = 100_000) -> list[dict[str, Any]]:
    """Every task of ``q`` (a :class:`leaseq.Queue`), replayed; the violations found.

    On SQLite, a worker row's ``revoked_at`` bounds its revocation (one
    writer at a time); ``revoked`` adds bounds the caller read."""
    bounds = dict(revoked or {})
    if q.store.capabilities.serial_writes:
        for w in q.workers():
            at = epoch_seconds(getattr(w, "revoked_at", None) if not isinstance(w, dict) else w.get("revoked_at"))
            wid = w.id if not isinstance(w, dict) else w["id"]
            if at is not None:
                bounds.setdefault(wid, at)
    found = []
    for t, trail in _trails(q, limit):
        v = validate_trail(trail, task=dataclasses.asdict(t), revoked=bounds)
        if v is not None:
            found.append(v)
    return found


def _trails(q: Any, limit: int) -> Iterable[tuple[Any, list[Any]]]:
    """Every task of ``q`` with its trail: read in two statements from a :class:`leaseq.Queue`
    (``list_trails``), else one read per task (a queue of another kind)."""
    from leaseq import Queue, engine

    if isinstance(q, Queue):
        return engine.drive(q.store, engine.reads.trails(q.settings, limit=limit))
    return ((t, q.events(t.id)) for t in q.list_tasks(limit=limit))


__all__ = ["TraceViolation", "describe", "validate_queue", "validate_trail"]
