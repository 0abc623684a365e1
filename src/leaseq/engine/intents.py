"""Intents: a handler records an action for an executor instead of taking it.

``ctx.intend(kind, payload, key=...)`` writes a child task (optionally
approval-gated) for a worker pool that holds the credentials the calling
task must not hold, on a queue of its own. The call is an effect of the
calling task, written under its lease in one transaction with the child:
the effect (action ``intend:<kind>``, key ``intent:<key>``) is recorded
with its response, the child's id, so a retried task that intends the same
``key`` again is answered from the ledger and never writes a second
intent. The child's idempotency key is derived from the calling task's
attempt-stable key and ``key`` (:func:`child_key`), so even a second
enqueue of it would find the first.

The child records its parent (``parent_task_id``). A gated child's request
names the worker that held the parent's lease (and the service token it
came through) as its requester, which may not decide it. When the parent
is cancelled, :func:`cancel_with_parents` cancels its intents that have not
started, in the cancellation's transaction, and marks the others
(``parent_cancelled_at``) for their executor.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from ..core import checks
from ..core.errors import InvalidInput, LeaseLost, NotFound, QueuePaused
from ..core.model import Held, Task, Worker
from . import approvals
from .common import Settings, check_claim, event, event_params, to_task, worker_id
from .dependencies import settle_dependents
from .effects import action_refusal, effect_refusal
from .enqueue import existing_task, inserted_row, same_task, task_params
from .steps import BEGIN, COMMIT, Op, one, rows

#: Longest idempotency key (see leaseq.core.checks.check_key).
_KEY_MAX = 255
#: The statuses of an intent that has not started: it is cancelled with its parent.
UNSTARTED = frozenset({"queued", "waiting", "awaiting_approval"})


def intent_action(kind: str) -> str:
    """The action name under which a task records an intent of ``kind`` (declare it in ``actions=``)."""
    return f"intend:{kind}"


def child_key(parent_key: str, key: str) -> str:
    """The idempotency key of the intent ``key`` of the task whose key is ``parent_key``.

    Readable when it fits (``<parent key>/intent/<key>``), else a digest of both.
    """
    readable = f"{parent_key}/intent/{key}"
    if len(readable) <= _KEY_MAX:
        return readable
    return "intent:sha256:" + hashlib.sha256(f"{parent_key}\0{key}".encode("utf-8")).hexdigest()


def intend(s: Settings, worker: Worker | str, claim: Held, kind: str, payload: Any = None, *, key: str,
           queue: str = "default", effect: str = "side_effect", approval: str | None = None,
           approval_deadline: float | None = None, priority: int = 0, max_attempts: int = 5,
           lease_seconds: float = checks.DEFAULT_LEASE_SECONDS, actions: Iterable[str] | None = None,
           token_id: str | None = None) -> Op[Task]:
    """:meth:`leaseq.Queue.intend`: the child task (the first one written, on a replay).

    ``token_id``: the service token the worker calls through (the service
    passes it), recorded as a requester of a gated child.
    """
    wid = worker_id(worker)
    claim = check_claim(wid, claim)
    key = checks.check_key("key", key)
    params = task_params(kind, payload, effect=effect, queue=queue, idempotency_key=None, priority=priority,
                         delay=0, max_attempts=max_attempts, lease_seconds=lease_seconds, actions=actions)
    approval, approval_deadline = approvals.check_approval(approval, approval_deadline)
    action = checks.check_kind(intent_action(params["kind"]), "kind")
    fx_key = f"intent:{key}"
    yield BEGIN
    held = yield one("lock_lease", task_id=claim.task_id, worker_id=wid, generation=claim.generation)
    if held is None:
        raise LeaseLost(claim.task_id, claim.generation, "intend refused: lease no longer held")
    refusal = action_refusal(held, action)
    if refusal is not None:
        raise InvalidInput("kind", refusal)
    existing = yield one("get_effect", task_id=claim.task_id, idempotency_key=fx_key)
    params["idempotency_key"] = child_key(held["idempotency_key"], key)
    if existing is not None and existing["status"] == "done":  # an earlier attempt recorded it: replay
        recorded = existing["response"]
        child = yield one("tasks_by_key", queue=recorded.get("queue", params["queue"]),
                          keys=[params["idempotency_key"]])
        if child is not None and child["id"] == recorded["task_id"]:
            # the same intent, if asked for the same way (one idempotency rule for every enqueue)
            same_task(child, params, approval=approval, approval_deadline=approval_deadline)
        else:  # never in practice (the child keeps its key): read it by its id
            child = yield one("get_task", task_id=recorded["task_id"])
        if child is None:  # it ended and retention deleted it: there is no task to return
            raise NotFound(f"intent {key!r} of task {claim.task_id} recorded task {recorded['task_id']}, which "
                           f"has ended and was removed by retention since; nothing was written")
        yield COMMIT
        return to_task(child)
    if held["paused"]:
        raise QueuePaused(f"queue {held['queue']!r} is paused: no new actions may start")
    from .budgets import gate
    yield from gate(s, claim, wid, held, fx_key)  # a spent budget of the tree stops the attempt here
    row = yield one("insert_task", **params)
    if row is None:  # the derived key is taken in that queue: the intent exists, if asked for the same way
        row = yield from existing_task(params, approval=approval, approval_deadline=approval_deadline)
    else:
        row = yield one("set_parent_task", task_id=row["id"], parent_task_id=claim.task_id)
        if approval is not None:
            row = yield from approvals.request(s, row, f"task:{claim.task_id}", approval_deadline, worker=wid,
                                               token=checks.check_text("token_id", token_id) or None)
    response = {"task_id": row["id"], "kind": row["kind"], "queue": row["queue"]}
    if existing is None:
        fx = yield one("insert_effect", task_id=claim.task_id, generation=claim.generation, worker_id=wid,
                       action=action, idempotency_key=fx_key, effect=held["effect"], args_digest=None,
                       resource=None, tool=False)
        if fx is None:  # insert_effect's guard refused it (action_refusal above says why, first)
            raise InvalidInput("kind", effect_refusal(held, action, None)[1])
    else:  # an intent the ledger holds open (an operator requeued the task after reconciliation)
        fx = yield one("rebind_effect", effect_id=existing["id"], task_id=claim.task_id,
                       generation=claim.generation, worker_id=wid)
        if existing["status"] == "pending":
            yield rows("adjust_open_effects", task_id=claim.task_id, delta=-1)
    yield one("finish_effect", effect_id=fx["id"], task_id=claim.task_id, generation=claim.generation,
              response=response)
    yield from event(s, claim.task_id, "intent_recorded", claim.generation, wid, action=action,
                     idempotency_key=fx_key, effect_id=fx["id"], child_task_id=row["id"], kind=row["kind"],
                     queue=row["queue"], approval=approval)
    yield COMMIT
    return to_task(row)


def cancel_with_parents(s: Settings, parent_ids: Iterable[int], by: str, reason: str) -> Op[dict[str, list[int]]]:
    """The intents of tasks just cancelled in the open transaction (``parent_ids``, locked).

    Each intent that has not started (queued, waiting, awaiting approval) is
    cancelled, with a ``cancelled`` event naming its parent's cancellation
    (``by``, ``reason``), and so, in turn, are the intents it recorded in an
    earlier attempt; the tasks waiting for it move on. Each other unfinished
    intent (running, left to its lease; or blocked, dead, needs
    reconciliation, left to a person) gets ``parent_cancelled_at`` and a
    ``parent_cancelled`` event, which its executor can read. Returns
    ``{"cancelled": [...], "marked": [...]}``, task ids.
    """
    cancelled: list[int] = []
    marked: list[int] = []
    frontier = sorted(set(parent_ids))
    while frontier:
        found: list[dict[str, Any]] = yield rows("lock_intents", task_ids=frontier)
        if not found:
            break
        unstarted = [r for r in found if r["status"] in UNSTARTED]
        started = [r for r in found if r["status"] not in UNSTARTED]
        events: list[dict[str, Any]] = []
        ended: list[int] = []
        if unstarted:
            done = {r["id"] for r in (yield rows("cancel_intents", task_ids=[r["id"] for r in unstarted]))}
            ended = [r["id"] for r in unstarted if r["id"] in done]
            events += [event_params(s, r["id"], "cancelled", r["claim_generation"] or None, None, by=by,
                                    reason=f"its parent task {r['parent_task_id']} was cancelled: {reason}",
                                    previous_status=r["status"], parent_task_id=r["parent_task_id"])
                       for r in unstarted if r["id"] in done]
        if started:
            done = {r["id"] for r in (yield rows("mark_parent_cancelled", task_ids=[r["id"] for r in started]))}
            marked += [r["id"] for r in started if r["id"] in done]
            events += [event_params(s, r["id"], "parent_cancelled", r["claim_generation"] or None, None, by=by,
                                    reason=reason, parent_task_id=r["parent_task_id"], status=r["status"])
                       for r in started if r["id"] in done]
        if events:
            yield rows("insert_events", events=events)
        if ended:
            yield from settle_dependents(s, ended)  # the tasks waiting for a cancelled intent move on
        cancelled += ended
        frontier = ended  # an intent cancelled with its parent cancels its own, recorded in an earlier attempt
    return {"cancelled": cancelled, "marked": marked}
