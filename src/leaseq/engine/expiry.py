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

BOUNDED: one pass of that sweep examines at most :data:`SWEEP_MAX_QUEUES` queues
(its caller may say another number), in name order from where the previous pass
stopped (:class:`~leaseq.engine.common.SweepCursor`), so a database with ten
thousand queues costs each pass what a thousand do, and every queue is reached
in turn. The queues with work
share transactions: a transaction locks each queue's rows with a statement of its
own (the statements are scoped to one queue, as a server that distributes the
tables by queue needs, rather than one statement over a list of queues), then
routes, wakes or expires all it locked with one statement each.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import InvalidInput
from ..core.model import Status
from . import limits
from .common import Settings, event_params, heartbeats
from .dependencies import FAILED_ENDS, settle_dependents
from .steps import BEGIN, BEGIN_ONE, COMMIT, Op, rows, together

#: How many expired leases one claim transaction routes at most.
ROUTE_BATCH = 500
#: How many queues one pass of the sweep of every queue examines at most (``sweep_queues``'s
#: walk), unless the caller says otherwise: the pass's cost (time, statements, transactions)
#: is bounded by it, whatever the number of queues; the next pass resumes after the last queue
#: this one examined.
SWEEP_MAX_QUEUES = 1000
#: The most a caller may ask one pass to examine.
SWEEP_MAX_QUEUES_LIMIT = 100_000
#: How many queues one transaction of the sweep takes its steps in at most, and how many rows
#: (leases, sleepers, overdue tasks, tokens) it locks at most: many queues with little work each
#: share a transaction (one locking statement per queue, each scoped to its queue), a queue
#: with much work takes several.
SWEEP_TX_QUEUES = 100
SWEEP_TX_ROWS = ROUTE_BATCH
#: The sweeps of a queue, in the order a transaction takes them (each sees what the ones before
#: it wrote, as when each had a transaction of its own).
SWEEPS = ("expired", "sleepers", "overdue", "tokens")


def check_max_queues(value: Any, name: str = "max_queues") -> int:
    """How many queues a sweep pass examines (None: :data:`SWEEP_MAX_QUEUES`), checked:
    :class:`~leaseq.InvalidInput` names the field ``name``."""
    if value is None:
        return SWEEP_MAX_QUEUES
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(name, f"must be a whole number (got {value!r})")
    if not 1 <= value <= SWEEP_MAX_QUEUES_LIMIT:
        raise InvalidInput(name, f"must be from 1 to {SWEEP_MAX_QUEUES_LIMIT} (got {value})")
    return value


def sweep(s: Settings, max_queues: int | None = None) -> Op[int]:
    """One pass of :meth:`leaseq.Queue.sweep`: in each queue with work (``sweep_queues``,
    whether a worker claims from it or not) among the at most ``max_queues`` it examines,
    route every expired lease, wake the sleepers whose wake time has come, expire every task
    whose deadline passed before it started, then delete the action tokens an hour past their
    expiry. The pass starts after ``s.sweep_cursor`` and moves it to the last queue it examined,
    or back to the first queue when its walk reached the last one. The queues share
    transactions (:data:`SWEEP_TX_QUEUES` and :data:`SWEEP_TX_ROWS` at most each), and every
    statement that locks reads one queue. Returns how many leases were routed."""
    cursor = s.sweep_cursor
    scan = check_max_queues(max_queues)
    yield BEGIN_ONE
    found = yield rows("sweep_queues", after=cursor.after, scan=scan, within=None)
    yield COMMIT
    # rows come in queue order; one flagged at_bound is the last the walk examined
    resume = found[-1]["queue"] if found and found[-1]["at_bound"] else None
    pending = [(r["queue"], [step for step in SWEEPS if r[step]]) for r in found]
    pending = [(queue, steps) for queue, steps in pending if steps]
    total = 0
    while pending:
        yield BEGIN
        total += yield from sweep_some(s, pending[:SWEEP_TX_QUEUES])
        yield COMMIT
        pending = [(queue, steps) for queue, steps in pending if steps]
    cursor.after = resume
    return total


def sweep_some(s: Settings, pending: list[tuple[str, list[str]]]) -> Op[int]:
    """One transaction of a sweep pass, in the open transaction: the steps of ``pending`` (queues,
    each with the sweeps it still needs, taken off as each is done), :data:`SWEEP_TX_ROWS` rows
    locked at most. Each sweep locks its rows queue by queue (one statement per queue, scoped to
    it; the statements sent together, in one round trip where the backend can), each queue
    taking an equal share of the rows left, then acts on all of them in one statement. A queue
    that filled its share keeps the sweep for the next transaction. Returns how many leases
    were routed."""
    budget = SWEEP_TX_ROWS
    routed = 0
    for step in SWEEPS:
        due = [(queue, steps) for queue, steps in pending if step in steps]
        if not due or budget <= 0:
            continue
        share = max(1, budget // len(due))
        due = due[:budget // share]
        found = yield together([rows(_LOCKS[step], queue=queue, limit=share) for queue, _ in due])
        locked: list[dict[str, Any]] = []
        for (queue, steps), got in zip(due, found):
            if len(got) < share:  # all of them (or another sweep holds the rest)
                steps.remove(step)
            budget -= len(got)
            locked += got
        if not locked or step == "tokens":  # the tokens' statement deletes what it finds
            continue
        if step == "expired":
            yield from route(s, locked, event_type="lease_expired", reason="lease expired without renewal")
            routed += len(locked)
        elif step == "sleepers":
            yield from _wake(s, locked)
        else:
            yield from _expire(s, locked)
    return routed


_LOCKS = {"expired": "lock_expired", "sleepers": "lock_sleepers", "overdue": "lock_overdue",
          "tokens": "prune_action_tokens"}


def expire_overdue(s: Settings, queue: str) -> Op[int]:
    """Tasks of ``queue`` past their deadline that are not running end ``expired``, with a
    ``deadline_passed`` event each saying why (never started, waited past it, or retried too late)."""
    overdue = yield rows("lock_overdue", queue=queue, limit=ROUTE_BATCH)
    if overdue:
        yield from _expire(s, overdue)
    return len(overdue)


def _expire(s: Settings, overdue: list[dict[str, Any]]) -> Op[None]:
    """End the locked overdue tasks ``overdue`` (``lock_overdue``'s rows), with their evidence."""
    expired = {r["id"]: r["reason"] for r in (yield rows("expire_overdue", task_ids=[r["id"] for r in overdue]))}
    events = [event_params(s, r["id"], "deadline_passed", r["claim_generation"] or None, None,
                           deadline_at=r["deadline_at"].isoformat(), previous_status=r["status"],
                           reason=expired[r["id"]])
              for r in overdue if r["id"] in expired]
    if events:
        yield rows("insert_events", events=events)
    if expired:  # the tasks waiting for them are cancelled (or blocked), in this transaction
        yield from settle_dependents(s, expired)


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
    if due:
        yield from _wake(s, due)
    return len(due)


def _wake(s: Settings, due: list[dict[str, Any]]) -> Op[None]:
    """Make the locked sleepers ``due`` (``lock_sleepers``'s rows) claimable, with their evidence."""
    woken = {r["id"] for r in (yield rows("wake_tasks", task_ids=[r["id"] for r in due]))}
    events = [event_params(s, r["id"], "woke", r["claim_generation"] or None, None,
                           reason="timeout" if r["wait_signal"] is not None else "timer",
                           wake_at=r["wake_at"].isoformat(),
                           **({"signal": r["wait_signal"]} if r["wait_signal"] is not None else {}))
              for r in due if r["id"] in woken]
    if events:
        yield rows("insert_events", events=events)


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
