"""Approval gates: a task that waits for a person before it may run.

A task enqueued with ``approval="required"`` is written in status
``awaiting_approval``: it holds no lease and no worker can claim it. Its
request (``leaseq_approvals``) records the digest of what an approver is
shown (the task's kind, payload and queue), who asked and the optional
deadline. :func:`approve` moves it to ``queued`` and :func:`deny` to
``denied`` (terminal); each records the approver's identity in the request,
the evidence trail and the audit log, in one transaction. An approval names
the digest the approver saw and is refused (:class:`ApprovalMismatch`) if
it is not the task's; the database refuses any later change of a gated
task's kind, payload or queue (a trigger of migration 9), so an approved
task runs exactly what was approved. :func:`expire_approvals` denies the
requests whose deadline passed unanswered.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from ..core import checks
from ..core.errors import ApprovalMismatch, InvalidInput, InvalidTransition, NotFound
from ..core.model import Approval, Status, Task
from .common import Settings, actor, audit, event, require_task, to_task
from .dependencies import settle_dependents
from .steps import BEGIN, COMMIT, Op, one, rows

#: The values of ``approval=`` (None: no gate).
APPROVAL_MODES = ("required",)
#: Who decides when a deadline passes unanswered (``decided_by`` of the request).
DEADLINE_ACTOR = "leaseq:deadline"
#: How many overdue requests one transaction of :func:`expire_approvals` denies at most.
EXPIRE_BATCH = 500
_MAX_DEADLINE = 10 * 365 * 86400.0
_APPROVAL_FIELDS = frozenset(Approval.__dataclass_fields__) - {"task"}


def approval_digest(kind: str, payload: Any, queue: str) -> str:
    """The digest an approver is shown and must pass back: ``sha256:`` and the hex
    digest of the canonical JSON of ``{"kind", "payload", "queue"}`` (keys
    sorted, no spaces, UTF-8)."""
    canonical = json.dumps({"kind": kind, "payload": payload, "queue": queue}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def digest_of(task: Task | dict[str, Any]) -> str:
    """:func:`approval_digest` of a task (a :class:`Task` or a task row)."""
    if isinstance(task, Task):
        return approval_digest(task.kind, task.payload, task.queue)
    return approval_digest(task["kind"], task["payload"], task["queue"])


def check_approval(approval: str | None, approval_deadline: float | None) -> tuple[str | None, float | None]:
    """``approval`` and ``approval_deadline`` of an enqueue, checked."""
    if approval is not None and approval not in APPROVAL_MODES:
        raise InvalidInput("approval", f"must be 'required' or None (got {approval!r})")
    if approval_deadline is not None:
        if approval is None:
            raise InvalidInput("approval_deadline", "applies only with approval='required'")
        approval_deadline = checks.check_seconds("approval_deadline", approval_deadline, allow_zero=False,
                                                 maximum=_MAX_DEADLINE)
    return approval, approval_deadline


def to_approval(row: dict[str, Any], task: Task | None = None) -> Approval:
    """An approvals row as an :class:`Approval`."""
    return Approval(**{k: v for k, v in row.items() if k in _APPROVAL_FIELDS}, task=task)


def request(s: Settings, row: dict[str, Any], requested_by: str, deadline: float | None) -> Op[dict[str, Any]]:
    """Hold a task inserted in the open transaction for approval; returns its row, now awaiting approval."""
    digest = digest_of(row)
    held: dict[str, Any] = yield one("hold_for_approval", task_id=row["id"])
    yield rows("approval_request", task_id=row["id"], digest=digest, requested_by=requested_by, deadline=deadline)
    detail: dict[str, Any] = dict(digest=digest, requested_by=requested_by)
    if deadline is not None:
        detail["deadline_seconds"] = deadline
    yield from event(s, row["id"], "approval_requested", None, None, **detail)
    return held


def _check_digest(digest: Any) -> str:
    text = checks.check_text("digest", digest, required=True)
    if text is None or not text.startswith("sha256:") or len(text) != 71:
        raise InvalidInput("digest", "must be the task's approval digest, 'sha256:' and 64 hex digits "
                                     "(see `leaseq approvals` or GET /v1/approvals)")
    return text


def _pending(task_id: int) -> Op[tuple[dict[str, Any], dict[str, Any]]]:
    """The task (locked) and its undecided request; InvalidTransition otherwise."""
    before = yield from require_task(task_id, lock=True)
    req = yield one("get_approval", task_id=task_id)
    if req is None:
        raise InvalidTransition(f"task {task_id} was not enqueued with approval='required'")
    if before["status"] != Status.AWAITING_APPROVAL or req["decision"] is not None:
        decided = (f" ({req['decision']} by {req['decided_by']})" if req["decision"] is not None else "")
        raise InvalidTransition(f"task {task_id} is {before['status']}{decided}, not awaiting_approval")
    return before, req


def approve(s: Settings, task_id: int, digest: str, note: str | None = None, *, by: str | None = None,
            via: str | None = None) -> Op[Task]:
    """:meth:`leaseq.Queue.approve`."""
    task_id = checks.check_task_id(task_id)
    digest = _check_digest(digest)
    checks.check_text("note", note)
    by, via = actor(by, via)
    yield BEGIN
    before, req = yield from _pending(task_id)
    current = digest_of(before)
    if not hmac.compare_digest(digest, current):
        raise ApprovalMismatch(task_id, digest, current)
    if not hmac.compare_digest(req["digest"], current):  # never, while the trigger of migration 9 stands
        raise ApprovalMismatch(task_id, digest, req["digest"])
    yield one("decide_approval", task_id=task_id, decision="approved", decided_by=by, decided_via=via, note=note)
    yield one("set_task_status", task_id=task_id, from_status=Status.AWAITING_APPROVAL.value,
              status=Status.QUEUED.value, set_result=False, result=None, reset_attempts=False)
    yield from event(s, task_id, "approved", None, None, by=by, digest=digest, note=note)
    yield from audit(by, via, "approve", f"task:{task_id}", digest=digest, note=note)
    yield rows("notify_work", queue=before["queue"])
    task = yield one("get_task", task_id=task_id)
    yield COMMIT
    return to_task(task)


def deny(s: Settings, task_id: int, reason: str, *, by: str | None = None, via: str | None = None) -> Op[Task]:
    """:meth:`leaseq.Queue.deny`."""
    task_id = checks.check_task_id(task_id)
    checks.check_text("reason", reason, required=True)
    by, via = actor(by, via)
    yield BEGIN
    before, req = yield from _pending(task_id)
    yield from _deny(s, before, req, reason, by, via)
    yield from audit(by, via, "deny", f"task:{task_id}", digest=req["digest"], reason=reason)
    task = yield one("get_task", task_id=task_id)
    yield COMMIT
    return to_task(task)


def _deny(s: Settings, before: dict[str, Any], req: dict[str, Any], reason: str, by: str,
          via: str | None) -> Op[None]:
    task_id = before["id"]
    yield one("decide_approval", task_id=task_id, decision="denied", decided_by=by, decided_via=via, note=reason)
    yield one("set_task_status", task_id=task_id, from_status=Status.AWAITING_APPROVAL.value,
              status=Status.DENIED.value, set_result=False, result=None, reset_attempts=False)
    yield from event(s, task_id, "denied", None, None, by=by, reason=reason, digest=req["digest"])
    yield from settle_dependents(s, [task_id])  # the tasks waiting for it are cancelled (or blocked)


def expire_approvals(s: Settings, *, limit: int = EXPIRE_BATCH) -> Op[int]:
    """:meth:`leaseq.Queue.expire_approvals`: deny every request whose deadline passed unanswered."""
    limit = checks.check_int("limit", limit, minimum=1, maximum=100_000)
    denied = 0
    while True:
        yield BEGIN
        due = [r["id"] for r in (yield rows("approvals_due", limit=limit))]
        for task_id in due:
            before = yield from require_task(task_id)
            req = yield one("get_approval", task_id=task_id)
            yield from _deny(s, before, req, "approval deadline passed: nobody decided", DEADLINE_ACTOR,
                             "deadline")
        if due:
            yield from audit(DEADLINE_ACTOR, "deadline", "expire_approvals", "approvals", denied=due)
        yield COMMIT
        denied += len(due)
        if len(due) < limit:
            return denied


def approvals(s: Settings, *, queue: str | None = None, limit: int = 100) -> Op[list[Approval]]:
    """:meth:`leaseq.Queue.approvals`: the undecided requests, oldest first, each with its task."""
    if queue is not None:
        checks.check_name("queue", queue)
    limit = checks.check_int("limit", limit, minimum=1, maximum=10_000)
    yield BEGIN
    found = yield rows("list_awaiting_approval", queue=queue, limit=limit)
    yield COMMIT
    return [Approval(task_id=r["id"], digest=r["approval_digest"], requested_by=r["approval_requested_by"],
                     requested_at=r["approval_requested_at"], deadline_at=r["approval_deadline_at"],
                     task=to_task(r)) for r in found]


def approval(s: Settings, task_id: int) -> Op[Approval]:
    """:meth:`leaseq.Queue.approval`: one task's request and decision, with the task."""
    task_id = checks.check_task_id(task_id)
    yield BEGIN
    task = yield from require_task(task_id)
    req = yield one("get_approval", task_id=task_id)
    yield COMMIT
    if req is None:
        raise NotFound(f"task {task_id} has no approval request (it was not enqueued with approval='required')")
    return to_approval(req, to_task(task))
