"""Dependencies: a task that waits for others (``enqueue(..., after=[...])``).

A task enqueued with ``after`` is created ``waiting`` when any task it waits
for (an *upstream*) has not completed yet. It holds no lease and no slot:
the claim only takes ``queued`` tasks. Whatever ends an upstream (a
completion, a failure to ``dead``, a cancel, a reconciliation, the routing
of an expired lease, a denial or an expiry) calls :func:`settle_dependents`
in its own transaction, which moves each waiter on:

- every upstream ``completed``: the waiter becomes ``queued`` (``dependencies_met``);
- an upstream ended without success (``dead``, ``cancelled``, ``denied``,
  ``expired``): the waiter is ``cancelled`` with that reason, and its own
  waiters after it (a cascade), or ``blocked`` when it was enqueued with
  ``on_dependency_failure="block"`` (an operator may unblock it).

An upstream parked in ``blocked`` or ``needs_reconciliation`` has not ended:
its waiters keep waiting for a person's decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..core import checks
from ..core.errors import InvalidInput
from ..core.model import Status
from .common import Settings, event_params, rows_of_task
from .steps import Op, rows

#: Upstream statuses that end a waiter's hope: it is cancelled (or blocked).
FAILED_ENDS = frozenset({Status.DEAD.value, Status.CANCELLED.value, Status.DENIED.value, Status.EXPIRED.value})
#: What a waiter does when an upstream ends in one of :data:`FAILED_ENDS`.
ON_FAILURE = ("cancel", "block")
#: Most upstreams one task may wait for.
MAX_UPSTREAMS = 1000


def check_after(after: Iterable[int] | None, on_dependency_failure: str) -> list[int]:
    """The upstream ids of ``after``, checked, deduplicated and sorted (empty: no dependencies)."""
    if on_dependency_failure not in ON_FAILURE:
        raise InvalidInput("on_dependency_failure", f"must be one of {', '.join(ON_FAILURE)} "
                                                    f"(got {on_dependency_failure!r})")
    if after is None:
        return []
    if isinstance(after, (str, bytes, dict)) or not isinstance(after, Iterable):
        raise InvalidInput("after", f"must be a list of task ids (got {after!r})")
    ids = sorted({checks.check_task_id(i, f"after[{n}]") for n, i in enumerate(after)})
    if len(ids) > MAX_UPSTREAMS:
        raise InvalidInput("after", f"names {len(ids)} tasks; at most {MAX_UPSTREAMS}")
    return ids


def no_such_upstream(upstream: int) -> InvalidInput:
    """The refusal of an ``after`` naming a task that does not exist, or that the caller may not
    name (:func:`leaseq.access.authorize_upstreams`): one answer for both, so it tells nothing."""
    return InvalidInput("after", f"task {upstream} does not exist")


def hold(s: Settings, task_ids: Sequence[int], after: list[int], on_failure: str) -> Op[None]:
    """Make the just-inserted ``task_ids`` wait for ``after``, in the enqueue's open transaction.

    Raises InvalidInput (field ``after``, nothing written: the enqueue's
    transaction rolls back) for an upstream that does not exist or has
    already ended without success: a task waiting for it could never run.
    """
    if not task_ids or not after:
        return
    found = {r["id"]: r["status"] for r in (yield rows("mark_upstreams", task_ids=after))}
    for upstream in after:
        status = found.get(upstream)
        if status is None:
            raise no_such_upstream(upstream)
        if status in FAILED_ENDS:
            raise InvalidInput("after", f"task {upstream} is {status}: a task waiting for it could never run")
    yield rows("insert_dependencies", waiters=list(task_ids), upstreams=after, on_failure=on_failure)
    if any(status != Status.COMPLETED.value for status in found.values()):
        held = yield rows("hold_tasks", task_ids=list(task_ids))
        yield rows("insert_events", events=[
            event_params(s, r["id"], "waiting", None, None, after=after, on_dependency_failure=on_failure)
            for r in held])


def settle_dependents(s: Settings, task_ids: Iterable[int]) -> Op[list[int]]:
    """Move on the waiters of ``task_ids``, which just ended, in the open transaction.

    Called by every operation that ends a task. A parent waiting for the task
    (``ctx.wait_for``) is woken once the last child it waits for has ended
    (:func:`wake_parents`). Waiters whose upstreams all completed are queued; waiters with an upstream that ended without success
    are cancelled (then their own waiters, and so on) or blocked. Returns the
    ids of the waiters it moved.
    """
    frontier = sorted(set(task_ids))
    moved: list[int] = []
    while frontier:
        yield from wake_parents(s, frontier)
        locked = [r["id"] for r in (yield rows("lock_waiters", task_ids=frontier))]
        if not locked:
            break
        upstreams: dict[int, list[dict[str, Any]]] = {}
        for r in (yield rows("waiter_upstreams", task_ids=locked)):
            upstreams.setdefault(r["waiter"], []).append(r)
        items, events = [], []
        for waiter in locked:
            deps = upstreams.get(waiter, [])
            failed = next((d for d in deps if d["status"] in FAILED_ENDS), None)
            if failed is not None:
                to = Status.BLOCKED.value if deps[0]["on_failure"] == "block" else Status.CANCELLED.value
                reason = f"dependency {failed['upstream']} ended {failed['status']}"
                items.append({"task_id": waiter, "status": to, "reason": reason})
                events.append(event_params(s, waiter, to, None, None, reason=reason, previous_status="waiting",
                                           dependency=failed["upstream"], dependency_status=failed["status"]))
            elif all(d["status"] == Status.COMPLETED.value for d in deps):
                items.append({"task_id": waiter, "status": Status.QUEUED.value, "reason": None})
                events.append(event_params(s, waiter, "dependencies_met", None, None,
                                           after=[d["upstream"] for d in deps]))
        if not items:
            break
        settled = yield rows("settle_waiters", items=items)
        if events:
            yield rows("insert_events", events=events)
        for queue in sorted({r["queue"] for r in settled if r["status"] == Status.QUEUED.value}):
            yield rows("notify_work", queue=queue)
        moved.extend(r["id"] for r in settled)
        # a cancelled waiter has ended without success too: its own waiters are next
        frontier = sorted(r["id"] for r in settled if r["status"] == Status.CANCELLED.value)
    return moved


def wake_parents(s: Settings, task_ids: list[int]) -> Op[list[int]]:
    """Make claimable, in the open transaction, the parents waiting (``ctx.wait_for``) for the
    just-ended ``task_ids`` whose every awaited child has now ended, each with a ``woke`` event
    (reason ``children``). The parents are locked first, in id order, and their children read
    by the next statement: two transactions ending two children of one parent take turns, and
    the second sees the first's end. Returns the ids of the parents woken."""
    waiting: list[dict[str, Any]] = yield rows("lock_waiting_parents", task_ids=task_ids)
    if not waiting:
        return []
    woken = yield rows("wake_parents", task_ids=task_ids)
    if not woken:
        return []
    ids = {r["id"] for r in woken}
    ended = set(task_ids)
    yield rows("insert_events", events=[
        event_params(s, r["id"], "woke", r["claim_generation"] or None, None, reason="children",
                     children=list(r["wait_children"] or []),
                     ended=[c for c in (r["wait_children"] or []) if c in ended])
        for r in waiting if r["id"] in ids])
    for queue in sorted({r["queue"] for r in woken}):
        yield rows("notify_work", queue=queue)
    return sorted(ids)


def dependency_results(s: Settings, task_id: int) -> Op[dict[int, Any]]:
    """:meth:`leaseq.Queue.dependency_results`: ``{upstream id: result}``, in id order."""
    found = yield from rows_of_task(task_id, "dependency_results")
    return {r["id"]: r["result"] for r in found}
