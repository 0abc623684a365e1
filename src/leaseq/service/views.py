"""Read models shared by the JSON API and the dashboard: queue overview, task timeline.

Plain functions over what :class:`leaseq.Queue` returns; no I/O of their own
beyond those calls, and redaction applied here so both faces agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import access
from ..access import Principal
from ..core.model import Approval, Effect, Event, Status, Task
from ..queue import Queue
from .wire import REDACTED, parse_time, record_json, redact_detail, redact_task, to_json

STATUSES = [s.value for s in Status]
#: Event types that end a lease, and how to say why.
LEASE_ENDINGS = {
    "completed": "completed by the holder",
    "failed": "the holder reported a failure",
    "lease_expired": "expired without renewal",
    "lease_released": "released by the holder",
    "cancelled": "cancelled by an operator",
}


def present_task(task: Task, principal: Principal) -> dict[str, Any]:
    """A task as JSON, redacted (payload, result, error, idempotency key) unless the token may read payloads."""
    data = to_json(task)
    return data if principal.read_payloads else redact_task(data)


def present_approval(approval: Approval, principal: Principal) -> dict[str, Any]:
    """An approval request as JSON: its task redacted, and its note and digest hidden, unless the
    token may read payloads.

    The digest is a plain hash of the payload (with the kind, queue and options), so
    a small payload is recovered from it by trying candidates: it is shown only to
    those who may read the payload itself, who are also the only ones who may
    approve (:func:`leaseq.access.authorize`).
    """
    data = record_json(approval)
    if approval.task is not None:
        data["task"] = present_task(approval.task, principal)
    if not principal.read_payloads:
        for key in ("note", "digest"):
            if data.get(key) is not None:
                data[key] = REDACTED
    return data


#: Keys of event details that people and workers fill with free text (a cancel
#: reason, a reconcile note, a worker's release or loss reason): hidden like
#: payloads from tokens without ``read_payloads``.
FREE_TEXT_KEYS = ("reason", "note")
#: Events whose reason leaseq writes itself (routing, expiry, revocation): shown to every reader.
SYSTEM_REASON_EVENTS = frozenset({"lease_expired", "lease_revoked", "dead", "blocked", "needs_reconciliation"})


def present_event(event: Event, principal: Principal) -> dict[str, Any]:
    """An event as JSON, its errors, results and free text redacted unless the token may read payloads."""
    data = record_json(event)
    data["at"] = to_json(parse_time(data["at"]))  # SQLite hands back epoch seconds for a column named "at"
    if not principal.read_payloads:
        detail = redact_detail(data.get("detail") or {})
        if data.get("type") not in SYSTEM_REASON_EVENTS:  # unknown event types: hidden too
            detail = {k: (REDACTED if k in FREE_TEXT_KEYS and v is not None else v) for k, v in detail.items()}
        data["detail"] = detail
    return data


def present_effect(effect: Effect, principal: Principal) -> dict[str, Any]:
    """An effect as JSON, its response, idempotency key and arguments' digest redacted unless the
    token may read payloads."""
    data = record_json(effect)
    data.pop("token", None)  # a signed action token authorises an action: never shown to readers
    if not principal.read_payloads:  # a key or an arguments' digest gives a payload away as the payload would
        for key in ("response", "idempotency_key", "args_digest"):
            if data.get(key) is not None:
                data[key] = REDACTED
    return data


def queue_overview(q: Queue) -> list[dict[str, Any]]:
    """Per queue: counts by status, oldest due queued age, expired leases, paused state."""
    queues: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return queues.setdefault(name, {"name": name, "paused": False, "counts": {s: 0 for s in STATUSES},
                                        "total": 0, "oldest_queued_seconds": None, "expired_leases": 0})

    for row in q.stats():
        e = entry(row["queue"])
        e["counts"][row["status"]] = row["count"]
        e["total"] += row["count"]
        if row["status"] == "queued" and row["oldest_queued_seconds"] is not None:
            e["oldest_queued_seconds"] = round(float(row["oldest_queued_seconds"]), 3)
        e["expired_leases"] += row["expired_leases"] or 0
    for row in q.queues():
        entry(row["name"])["paused"] = bool(row["paused"])
    return [queues[name] for name in sorted(queues)]


def readable_tasks(q: Queue, principal: Principal, *, status: str | None = None, queue: str | None = None,
                   limit: int = 100) -> list[Task]:
    """Tasks, newest first, of the queues ``principal`` may read (:func:`leaseq.access.readable_queues`
    decides: a queue-limited token its queues only, another queue named is refused)."""
    queues = access.readable_queues(principal, queue)
    if queues is None:
        return q.list_tasks(status=status, limit=limit)
    found = (t for name in queues for t in q.list_tasks(status=status, queue=name, limit=limit))
    return sorted(found, key=lambda t: t.id, reverse=True)[:limit]


def readable_approvals(q: Queue, principal: Principal, *, queue: str | None = None,
                       limit: int = 100) -> list[Approval]:
    """The undecided approval requests, oldest first, of the queues ``principal`` may read."""
    queues = access.readable_queues(principal, queue)
    if queues is None:
        return q.approvals(limit=limit)
    found = (a for name in queues for a in q.approvals(queue=name, limit=limit))
    return sorted(found, key=lambda a: (a.requested_at, a.task_id))[:limit]


def readable_overview(q: Queue, principal: Principal) -> list[dict[str, Any]]:
    """:func:`queue_overview`, the rows of the queues ``principal`` may read."""
    access.authorize(principal, "read_queues")
    return [row for row in queue_overview(q) if principal.may_use_queue(row["name"])]


#: The statuses that wait for a person, and the dashboard page that lists each.
ATTENTION = {"needs_reconciliation": "/inbox", "awaiting_approval": "/approvals",
             "blocked": "/tasks?status=blocked", "dead": "/tasks?status=dead"}
#: Ended statuses the overview counts in one column beside completed.
OTHER_ENDINGS = ("cancelled", "denied", "expired")


def attention_counts(queues: list[dict[str, Any]]) -> dict[str, int]:
    """Tasks waiting for a person, by status (see :data:`ATTENTION`), over every queue of :func:`queue_overview`."""
    return {s: sum(e["counts"].get(s, 0) for e in queues) for s in ATTENTION}


@dataclass
class Attempt:
    """One claim generation of a task, as the timeline shows it."""

    generation: int
    worker_id: str | None = None
    claimed_at: datetime | None = None
    attempt: int | None = None
    lease_seconds: float | None = None
    heartbeats: dict[str, Any] = field(default_factory=dict)
    effects: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    ended: str | None = None
    ended_at: datetime | None = None
    routed_to: str | None = None
    #: what the attempt appended to the task's stream (ctx.emit): items, durable, first_seq,
    #: last_seq, first_at, last_at; None: nothing
    stream: dict[str, Any] | None = None


def task_timeline(task: Task, events: list[Event], effects: list[Effect], principal: Principal,
                  streamed: dict[str, Any] | None = None) -> dict[str, Any]:
    """The evidence trail grouped by claim generation.

    Each attempt shows who held it, its heartbeat summary, its effect intents
    and responses, what it appended to the task's stream (``stream``, from
    ``streamed``: :meth:`leaseq.Queue.stream_stats`; the whole stream's size is
    ``stream`` beside the attempts), and why the lease ended; events outside any claim
    (enqueue, an approval, operator actions between claims) are listed on
    their own. ``order`` says how to read them in time order: each entry is
    ``{"event": i}`` (the i-th of ``other_events``) or ``{"generation": g}``,
    placed where the generation's first event falls (the evidence trail is
    read in the order it was written, as ``leaseq show`` prints it).
    """
    attempts: dict[int, Attempt] = {}
    outside: list[dict[str, Any]] = []
    order: list[dict[str, int]] = []
    for ev in events:
        shown = present_event(ev, principal)
        detail = shown.get("detail") or {}
        if not ev.generation:
            order.append({"event": len(outside)})
            outside.append(shown)
            continue
        if ev.generation not in attempts:
            order.append({"generation": ev.generation})
        a = attempts.setdefault(ev.generation, Attempt(generation=ev.generation))
        a.events.append(shown)
        if ev.type == "claimed":
            a.worker_id, a.claimed_at = ev.worker_id, parse_time(ev.at)
            a.attempt, a.lease_seconds = detail.get("attempt"), detail.get("lease_seconds")
        if "heartbeats" in detail:
            a.heartbeats = {k: detail.get(k) for k in ("heartbeats", "last_heartbeat_at", "longest_heartbeat_gap")}
        if ev.type in LEASE_ENDINGS and a.ended is None and (ev.type != "cancelled" or detail.get("revoked_lease_of")):
            a.ended, a.ended_at = LEASE_ENDINGS[ev.type], parse_time(ev.at)
            a.routed_to = detail.get("routed_to") or detail.get("next_status")
            if detail.get("reason") and ev.type in ("lease_released", "cancelled"):
                a.ended += f": {detail['reason']}"
    for fx in effects:
        if fx.generation not in attempts:  # an effect whose claim left no event: after everything else
            order.append({"generation": fx.generation})
        attempts.setdefault(fx.generation, Attempt(generation=fx.generation)).effects.append(
            present_effect(fx, principal))
    for emitted in (streamed or {}).get("attempts", []):
        generation = emitted["generation"]
        if generation not in attempts:
            order.append({"generation": generation})
        attempts.setdefault(generation, Attempt(generation=generation)).stream = {
            k: emitted[k] for k in ("items", "durable", "first_seq", "last_seq", "first_at", "last_at")}
    current = task.claim_generation
    if task.status == Status.RUNNING and current in attempts and not attempts[current].heartbeats:
        attempts[current].heartbeats = {"heartbeats": task.heartbeat_count,
                                        "last_heartbeat_at": to_json(task.last_heartbeat_at),
                                        "longest_heartbeat_gap": round(task.longest_heartbeat_gap, 3)}
    found: dict[str, Any] = {"task": present_task(task, principal),
                             "attempts": [to_json(attempts[g]) for g in sorted(attempts)],
                             "other_events": outside, "order": order}
    if streamed is not None:
        found["stream"] = to_json({k: streamed[k] for k in ("items", "durable", "last_seq")})
    return found
