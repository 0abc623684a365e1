"""Expiry: leases that end without their holder, by the recovery policy.

An expired lease is not permission to retry: ``route_expired`` (the query)
applies the recovery policy, and every routing leaves its evidence. The
claim routes a batch of its own queue's before it claims; :func:`sweep` routes
them all, queue by queue, and ends the tasks whose deadline passed before they
started.

BY QUEUE: every statement here that locks rows (``FOR UPDATE SKIP LOCKED``)
reads one queue, so that a server distributing the tables by queue (Citus)
runs each on one shard. A claim routes its own queue's expired leases and
sleepers only; those of a queue no worker claims from are routed by the sweep
(:meth:`leaseq.Queue.sweep`, ``leaseq sweep``, ``leaseq serve``'s maintenance),
which asks ``sweep_queues`` which queues have work, then sweeps each.
"""

from __future__ import annotations

from typing import Any

from ..core.model import Status
from . import limits
from .common import Settings, event_params, heartbeats
from .dependencies import FAILED_ENDS, settle_dependents
from .steps import BEGIN, BEGIN_ONE, COMMIT, Op, rows

#: How many expired leases one claim transaction routes at most.
ROUTE_BATCH = 500


def sweep(s: Settings) -> Op[int]:
    """:meth:`leaseq.Queue.sweep`: in every queue with work (``sweep_queues``, whether a
    worker claims from it or not), route every expired lease, wake the sleepers whose
    wake time has come, expire every task whose deadline passed before it started, then
    delete the action tokens an hour past their expiry, a batch per transaction and
    queue. Returns how many leases were routed."""
    yield BEGIN_ONE
    due = yield rows("sweep_queues")
    yield COMMIT
    total = 0
    for work in due:
        total += yield from sweep_queue(s, work)
    return total


def sweep_queue(s: Settings, work: dict[str, Any]) -> Op[int]:
    """The sweep of one queue, the steps ``work`` (a row of ``sweep_queues``) says have work.
    Returns how many leases were routed."""
    queue = work["queue"]
    total = 0
    while work["expired"]:
        yield BEGIN
        n = yield from route_expired(s, queue)
        yield COMMIT
        total += n
        if n < ROUTE_BATCH:
            break
    while work["sleepers"]:  # sleepers whose wake time has come
        yield BEGIN
        n = yield from wake_due(s, queue)
        yield COMMIT
        if n < ROUTE_BATCH:
            break
    while work["overdue"]:
        yield BEGIN
        n = yield from expire_overdue(s, queue)
        yield COMMIT
        if n < ROUTE_BATCH:
            break
    while work["tokens"]:  # action tokens an hour past their expiry: refused anyway, so deleted
        yield BEGIN
        pruned = yield rows("prune_action_tokens", queue=queue, limit=ROUTE_BATCH)
        yield COMMIT
        if len(pruned) < ROUTE_BATCH:
            break
    return total


def expire_overdue(s: Settings, queue: str) -> Op[int]:
    """Tasks of ``queue`` past their deadline that are not running end ``expired``, with a
    ``deadline_passed`` event each saying why (never started, waited past it, or retried too late)."""
    overdue = yield rows("lock_overdue", queue=queue, limit=ROUTE_BATCH)
    if not overdue:
        return 0
    expired = {r["id"]: r["reason"] for r in (yield rows("expire_overdue", task_ids=[r["id"] for r in overdue]))}
    events = [event_params(s, r["id"], "deadline_passed", r["claim_generation"] or None, None,
                           deadline_at=r["deadline_at"].isoformat(), previous_status=r["status"],
                           reason=expired[r["id"]])
              for r in overdue if r["id"] in expired]
    if events:
        yield rows("insert_events", events=events)
    if expired:  # the tasks waiting for them are cancelled (or blocked), in this transaction
        yield from settle_dependents(s, expired)
    return len(overdue)


def route_expired(s: Settings, queue: str) -> Op[int]:
    """A batch of ``queue``'s expired leases routed by the recovery policy, in the open
    transaction. Returns how many."""
    expired = yield rows("lock_expired", queue=queue, limit=ROUTE_BATCH)
    if expired:
        yield from route(s, expired, event_type="lease_expired", reason="lease expired without renewal")
    return len(expired)


def wake_due(s: Settings, queue: str) -> Op[int]:
    """Waiting tasks of ``queue`` whose wake time has come (a sleep's end, a signal wait's
    timeout) are claimable again, with a ``woke`` event each, in the open transaction.
    Returns how many."""
    due = yield rows("lock_sleepers", queue=queue, limit=ROUTE_BATCH)
    if not due:
        return 0
    woken = {r["id"] for r in (yield rows("wake_tasks", task_ids=[r["id"] for r in due]))}
    events = [event_params(s, r["id"], "woke", r["claim_generation"] or None, None,
                           reason="timeout" if r["wait_signal"] is not None else "timer",
                           wake_at=r["wake_at"].isoformat(),
                           **({"signal": r["wait_signal"]} if r["wait_signal"] is not None else {}))
              for r in due if r["id"] in woken]
    if events:
        yield rows("insert_events", events=events)
    return len(due)


def route(s: Settings, leases: list[dict[str, Any]], *, event_type: str, reason: str, **detail: Any) -> Op[None]:
    """Apply the recovery policy (the ``route_expired`` query) to locked, expired leases, with their
    evidence (``detail``: more fields for each routing event)."""
    routed = {r["id"]: r for r in (yield rows("route_expired", task_ids=[r["id"] for r in leases]))}
    yield from limits.release(s, routed.values())  # the leases ended: their slots come back
    events = []
    for lease in leases:
        r = routed.get(lease["id"])
        if r is None:
            continue
        events.append(event_params(
            s, lease["id"], event_type, lease["claim_generation"], lease["lease_owner"], reason=reason,
            routed_to=r["status"], open_intents=r["open_effects"], attempt=r["attempts"],
            lease_expires_at=lease["lease_expires_at"].isoformat(), **heartbeats(lease), **detail))
        if r["status"] != Status.QUEUED:  # the query says why it did not simply queue the task again
            events.append(event_params(s, lease["id"], r["status"], lease["claim_generation"],
                                       lease["lease_owner"], reason=r["reason"]))
    if events:
        yield rows("insert_events", events=events)
    ended = [r["id"] for r in routed.values() if r["status"] in FAILED_ENDS]
    if ended:
        yield from settle_dependents(s, ended)


def end_worker_leases(s: Settings, wid: str, reason: str) -> Op[int]:
    """End every lease of a just-revoked worker, with a ``lease_revoked`` event each, in the open
    transaction. Returns how many leases ended."""
    ended = yield rows("end_worker_leases", worker_id=wid)
    if ended:
        yield rows("insert_events", events=[event_params(s, r["id"], "lease_revoked", r["claim_generation"], wid,
                                                         reason=reason) for r in ended])
    return len(ended)
