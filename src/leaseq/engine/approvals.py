"""Approval gates: a task that waits for a person before it may run.

A task enqueued with ``approval="required"`` is written in status
``awaiting_approval``: it holds no lease and no worker can claim it. Its
request (``leaseq_approvals``) records the digest of what an approver is
shown (:func:`approval_digest`: the task's kind, payload and queue and every
option it runs with), who asked (for display, and as the identities a
decision is checked against) and the optional deadline. :func:`approve`
moves it to ``queued`` and :func:`deny` to ``denied`` (terminal); each
records the approver's identity in the request, the evidence trail and the
audit log, in one transaction. An approval names the digest the approver
saw and is refused (:class:`ApprovalMismatch`) if it is not the task's; the
database refuses any later change of what the digest covers (the trigger of
migrations 9 and 14), so an approved task runs exactly what was approved.

A decision is refused (:class:`AccessDenied`, nothing changed) when it is
made by the request's requester: the worker that recorded an intent (from
any handler it runs, or on its behalf), the task that recorded it (from its
handler, on any worker), the service token that asked. It is refused too
when it comes after the request's deadline by the database clock
(:class:`ApprovalExpired`): the request is then denied by the deadline in
that call's transaction, as :func:`expire_approvals` would deny it, before
the error is raised. The claim never takes a task whose approval was
recorded at or after its deadline (only a decision written by hand or by an
older leaseq can be), and :func:`expire_approvals` denies those too.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..core import checks
from ..core.errors import (AccessDenied, ApprovalExpired, ApprovalMismatch, InvalidInput, InvalidTransition,
                           NotFound)
from ..core.model import Approval, Status, Task
from .common import Settings, acting, audit, event, require_task, to_task, worker_token
from .dependencies import settle_dependents
from .steps import BEGIN, COMMIT, Op, one, rows

#: The values of ``approval=`` (None: no gate).
APPROVAL_MODES = ("required",)
#: Who decides when a deadline passes unanswered (``decided_by`` of the request).
DEADLINE_ACTOR = "leaseq:deadline"
#: Why the deadline denies a request nobody decided in time.
DEADLINE_REASON = "approval deadline passed: nobody decided"
#: How many overdue requests one transaction of :func:`expire_approvals` denies at most.
EXPIRE_BATCH = 500
#: The version of the digest new requests record (see :func:`approval_digest`).
DIGEST_VERSION = 2
_MAX_DEADLINE = 10 * 365 * 86400.0
_APPROVAL_FIELDS = frozenset(Approval.__dataclass_fields__) - {"task"}
_DIGEST = re.compile(r"v2:sha256:[0-9a-f]{64}")
_DIGEST_V1 = re.compile(r"sha256:[0-9a-f]{64}")


def _canonical(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _utc(field: str, value: datetime | str | None) -> str | None:
    """A time as the digest writes it: UTC, to the microsecond (``2030-01-31T09:00:00.000000Z``)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value
        try:
            value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInput(field, f"must be an ISO 8601 time (got {text[:40]!r})") from None
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(field, f"must be a timezone-aware time, or None (got {value!r})")
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def approval_digest(kind: str, payload: Any, queue: str, *, effect: str = "read_only",
                    actions: Iterable[str] | None = None, priority: int = 0, max_attempts: int = 5,
                    lease_seconds: float = checks.DEFAULT_LEASE_SECONDS, timeout_seconds: float | None = None,
                    deadline_at: datetime | str | None = None, limits: Iterable[str] | None = None,
                    units: int = 1, resources: Iterable[str] | None = None) -> str:
    """The digest an approver is shown and must pass back: ``v2:sha256:`` and
    the hex SHA-256 of the canonical JSON (keys sorted, no spaces, UTF-8) of
    everything the task runs with::

        {"v": 2, "kind", "payload", "queue", "effect", "actions", "priority",
         "max_attempts", "lease_seconds", "timeout_seconds", "deadline_at",
         "limits", "units"}

    plus ``"resources"`` (sorted, deduplicated) when the task declared any:
    a task declaring none keeps the digest it had before resources existed.
    ``actions`` and ``limits`` are sorted and deduplicated (``actions=[]``,
    no action allowed, is not ``None``, any action); ``lease_seconds`` and
    ``timeout_seconds`` are written as floats; ``deadline_at`` (an aware
    datetime or its ISO 8601 text, as the task shows it) as UTC to the
    microsecond. The keyword defaults are :meth:`leaseq.Queue.enqueue`'s, and
    the names the fields of :class:`leaseq.Task`: a task's own digest is
    ``approval_digest(t.kind, t.payload, t.queue, effect=t.effect, ...)``.
    Two tasks that differ in any of these have different digests, so an
    approval given for one is refused for the other.

    Version 1 digests (``sha256:<hex>`` of the kind, payload and queue only),
    recorded by requests made before leaseq's schema version 14, are no
    longer accepted from an approver: such a request is decided with its
    task's version 2 digest, which every listing shows.
    """
    doc = {
        "v": DIGEST_VERSION, "kind": kind, "payload": payload, "queue": queue, "effect": effect,
        "actions": None if actions is None else sorted(set(actions)),
        "priority": int(priority), "max_attempts": int(max_attempts), "lease_seconds": float(lease_seconds),
        "timeout_seconds": None if timeout_seconds is None else float(timeout_seconds),
        "deadline_at": _utc("deadline_at", deadline_at),
        "limits": (sorted(set(limits)) or None) if limits is not None else None,
        "units": int(units),
    }
    if resources:
        doc["resources"] = sorted(set(resources))
    return "v2:sha256:" + hashlib.sha256(_canonical(doc).encode("utf-8")).hexdigest()


def _field(task: Task | dict[str, Any], name: str, default: Any = None) -> Any:
    if isinstance(task, Task):
        return getattr(task, name)
    value = task.get(name, default)
    if name in ("actions", "resources", "limits") and isinstance(value, str):  # a JSON column not yet decoded
        return json.loads(value)
    return value


def digest_of(task: Task | dict[str, Any]) -> str:
    """:func:`approval_digest` of a task (a :class:`Task` or a task row): the one
    place a task's digest is taken, for the request, the decision and every listing."""
    def f(name: str, default: Any = None) -> Any:
        return _field(task, name, default)

    return approval_digest(f("kind"), f("payload"), f("queue"), effect=f("effect"), actions=f("actions"),
                           priority=f("priority", 0), max_attempts=f("max_attempts"),
                           lease_seconds=f("lease_seconds"), timeout_seconds=f("timeout_seconds"),
                           deadline_at=f("deadline_at"), limits=f("limits"), units=f("units", 1),
                           resources=f("resources"))


def _digest_v1(task: Task | dict[str, Any]) -> str:
    """A version 1 digest (kind, payload and queue), to check a request recorded before version 2."""
    doc = {"kind": _field(task, "kind"), "payload": _field(task, "payload"), "queue": _field(task, "queue")}
    return "sha256:" + hashlib.sha256(_canonical(doc).encode("utf-8")).hexdigest()


def _recorded_matches(recorded: str, task: dict[str, Any]) -> bool:
    """Whether the digest a request recorded (either version) is still its task's."""
    current = digest_of(task) if _DIGEST.fullmatch(recorded) else _digest_v1(task)
    return hmac.compare_digest(recorded, current)


#: What retention leaves in place of an ended task's approval digest (the scrub_approvals query).
CLEARED_DIGEST = "cleared"


def shown_digest(recorded: str, task: Task | dict[str, Any]) -> str:
    """The digest an approver is shown: the one recorded, or for a request recorded
    with a version 1 digest, the task's version 2 digest (the one a decision takes).
    A digest retention cleared stays cleared (never one made from the cleared task)."""
    if recorded == CLEARED_DIGEST or _DIGEST.fullmatch(recorded):
        return recorded
    return digest_of(task)


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


def to_approval(row: dict[str, Any], task: dict[str, Any]) -> Approval:
    """An approvals row, with its task's row, as an :class:`Approval` (the digest as shown: :func:`shown_digest`)."""
    fields = {k: v for k, v in row.items() if k in _APPROVAL_FIELDS}
    fields["digest"] = shown_digest(row["digest"], task)
    return Approval(**fields, task=to_task(task))


@dataclass(frozen=True)
class Decider:
    """Who makes a decision, as the identities its request's requester is checked against.

    ``workers``: the workers it is made on behalf of (the one running the
    handler it is made from, and any named); ``task``: the task whose handler
    makes it; ``token``: the service token making it. Left empty, an operator
    with the database's credentials, nobody the requester could be.
    """

    workers: tuple[str, ...] = ()
    task: int | None = None
    token: str | None = None


def request(s: Settings, row: dict[str, Any], requested_by: str, deadline: float | None, *,
            worker: str | None = None, token: str | None = None) -> Op[dict[str, Any]]:
    """Hold a task inserted in the open transaction for approval; returns its row, now awaiting approval.

    ``requested_by`` is shown to approvers; ``worker`` (the worker that held the
    recording task's lease, for an intent) and ``token`` (the service token that
    asked) are the requester's identities, which may not decide the request.
    """
    held: dict[str, Any] = yield one("hold_for_approval", task_id=row["id"])
    digest = digest_of(held)  # of the row as stored: what every decision reads back
    yield rows("approval_request", task_id=row["id"], digest=digest, requested_by=requested_by, deadline=deadline,
               requested_worker=worker, requested_token=token)
    detail: dict[str, Any] = dict(digest=digest, requested_by=requested_by)
    if deadline is not None:
        detail["deadline_seconds"] = deadline
    yield from event(s, row["id"], "approval_requested", None, None, **detail)
    return held


def _check_digest(digest: Any) -> str:
    text = checks.check_text("digest", digest, required=True)
    if text is not None and _DIGEST_V1.fullmatch(text):
        raise InvalidInput("digest", "a version 1 digest ('sha256:...', of the kind, payload and queue only) is "
                                     "no longer accepted: pass the task's digest as `leaseq approvals` or GET "
                                     "/v1/approvals shows it now ('v2:sha256:...', which covers every option "
                                     "the task runs with)")
    if text is None or not _DIGEST.fullmatch(text):
        raise InvalidInput("digest", "must be the task's approval digest, 'v2:sha256:' and 64 hex digits "
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


def _refuse_requester(before: dict[str, Any], req: dict[str, Any], decider: Decider | None) -> Op[None]:
    """AccessDenied when ``decider`` is the request's requester: the worker or task that
    recorded the intent, the token that asked, or the token that registered that worker."""
    if decider is None:
        return
    worker, token = req.get("requested_worker"), req.get("requested_token")
    who = None
    if worker is not None and worker in decider.workers:
        who = f"worker {worker}"
    elif decider.task is not None and (decider.task == before.get("parent_task_id")
                                       or (req.get("reason") == "budget" and decider.task == before["id"])):
        who = f"task {decider.task}, whose handler makes this decision"
    elif decider.token and token is not None and hmac.compare_digest(decider.token, token):
        who = f"token {token}"
    elif decider.token and worker is not None:
        link = yield from worker_token(worker)
        if link is not None and hmac.compare_digest(decider.token, link):
            who = f"worker {worker}, registered with token {decider.token}"
    if who is not None:
        raise AccessDenied(f"task {before['id']}: its approval was requested by {who}, which may not decide it: "
                           "a request is decided by someone other than its requester")


def _budget_owner(before: dict[str, Any], req: dict[str, Any]) -> int:
    """The task whose budget a request for more names: the requester's own, or (budgets cover
    the tree) the budgeted ancestor's whose tree spent it (``owner`` in the figures)."""
    detail = _detail(req.get("detail")) if req.get("reason") == "budget" else None
    owner = None if detail is None else detail.get("owner")
    return owner if isinstance(owner, int) and not isinstance(owner, bool) else int(before["id"])


def _decide(task_id: int, decision: str, by: str, via: str | None, note: str | None) -> Op[dict[str, Any] | None]:
    """Record a person's decision while the request's deadline has not passed (None: it has)."""
    decided: dict[str, Any] | None = yield one("decide_approval_in_time", task_id=task_id, decision=decision,
                                                decided_by=by, decided_via=via, note=note)
    return decided


def _too_late(s: Settings, before: dict[str, Any], req: dict[str, Any], action: str, by: str) -> Op[None]:
    """A decision came after the deadline: the request is denied by the deadline, as
    :func:`expire_approvals` would deny it, and committed; then ApprovalExpired."""
    task_id = before["id"]
    yield from _deny_by_deadline(s, before, req, f"{DEADLINE_REASON} in time ({action} by {by} came after it)")
    yield from audit(DEADLINE_ACTOR, "deadline", "expire_approvals", "approvals", denied=[task_id],
                     late_decision={"action": action, "by": by})
    yield COMMIT
    raise ApprovalExpired(task_id, req["deadline_at"], action)


def approve(s: Settings, task_id: int, digest: str, note: str | None = None, *, by: str | None = None,
            via: str | None = None, decider: Decider | None = None, raise_budget: Any = None) -> Op[Task]:
    """:meth:`leaseq.Queue.approve`."""
    from .budgets import check_budget, raised
    task_id = checks.check_task_id(task_id)
    digest = _check_digest(digest)
    checks.check_text("note", note)
    check_budget(raise_budget, "raise_budget")
    yield BEGIN
    by, via = yield from acting(by, via)
    found: dict[str, Any] | None = None
    if raise_budget is not None:
        # A raise writes the budget of the owner that ran out, an ancestor for a child's request:
        # the tree is locked root first, as a cancel takes it and charge_budgets charges it, so
        # the owner the request names (read unlocked) is locked before the task.
        peek = yield one("get_approval", task_id=task_id)
        first = None if peek is None else _budget_owner({"id": task_id}, peek)
        if first is not None and first != task_id:
            found = yield one("lock_task", task_id=first)
    before, req = yield from _pending(task_id)
    yield from _refuse_requester(before, req, decider)
    owner = _budget_owner(before, req)  # whose budget a raise raises: the one that ran out
    if owner != task_id and raise_budget is not None:
        if found is None or found["id"] != owner:
            # the request changed since it was read (decided, and a later pause names another
            # owner): that owner is locked after the task, the one order this rare case breaks
            found = yield one("lock_task", task_id=owner)
        if found is None:
            raise InvalidInput("raise_budget", f"the budget that ran out was task {owner}'s, which retention "
                                               "has removed since: approve without a raise")
        budget = raised(found.get("budget"), raise_budget)
    else:
        budget = raised(before.get("budget"), raise_budget)  # InvalidInput for a key the budget does not name
    current = digest_of(before)
    if not hmac.compare_digest(digest, current):
        raise ApprovalMismatch(task_id, digest)
    if not _recorded_matches(req["digest"], before):  # never, while the trigger of migration 14 stands
        raise ApprovalMismatch(task_id, digest)
    if (yield from _decide(task_id, "approved", by, via, note)) is None:
        yield from _too_late(s, before, req, "approve", by)
    raise_detail: dict[str, Any] = {}
    if budget is not None:  # BUDGETS: the approval raises the task's budget (schema 31), or its tree's (34)
        yield one("raise_budget" if owner == task_id else "raise_owner_budget", task_id=owner, budget=budget)
        yield rows("raise_budget_rows", task_id=owner, budget=budget)
        raise_detail = {"raise_budget": check_budget(raise_budget, "raise_budget"), "budget": budget}
        if owner != task_id:
            raise_detail["owner"] = owner
    yield one("set_task_status", task_id=task_id, from_status=Status.AWAITING_APPROVAL.value,
              status=Status.QUEUED.value, set_result=False, result=None, reset_attempts=False)
    yield from event(s, task_id, "approved", None, None, by=by, digest=digest, note=note, **raise_detail)
    yield from audit(by, via, "approve", f"task:{task_id}", digest=digest, note=note, **raise_detail)
    yield rows("notify_work", queue=before["queue"])
    task = yield one("get_task", task_id=task_id)
    yield COMMIT
    return to_task(task)


def deny(s: Settings, task_id: int, reason: str, *, by: str | None = None, via: str | None = None,
         decider: Decider | None = None) -> Op[Task]:
    """:meth:`leaseq.Queue.deny`."""
    task_id = checks.check_task_id(task_id)
    checks.check_text("reason", reason, required=True)
    yield BEGIN
    by, via = yield from acting(by, via)
    before, req = yield from _pending(task_id)
    yield from _refuse_requester(before, req, decider)
    if (yield from _decide(task_id, "denied", by, via, reason)) is None:
        yield from _too_late(s, before, req, "deny", by)
    yield from _end_denied(s, before, req, reason, by)
    yield from audit(by, via, "deny", f"task:{task_id}", digest=req["digest"], reason=reason)
    task = yield one("get_task", task_id=task_id)
    yield COMMIT
    return to_task(task)


def _end_denied(s: Settings, before: dict[str, Any], req: dict[str, Any], reason: str, by: str, *,
                from_status: Status = Status.AWAITING_APPROVAL) -> Op[None]:
    """The task of a denied request ends ``denied``; the tasks waiting for it move on, and
    what it left under way (a task paused for its budget may have spawned children, recorded
    intents) ends with it, as a cancel takes its tree."""
    from .children import cancel_below, tree_detail  # children imports enqueue, which imports this module

    task_id = before["id"]
    yield one("set_task_status", task_id=task_id, from_status=from_status.value,
              status=Status.DENIED.value, set_result=False, result=None, reset_attempts=False)
    yield from event(s, task_id, "denied", None, None, by=by, reason=reason, digest=req["digest"])
    yield from settle_dependents(s, [task_id])  # the tasks waiting for it are cancelled (or blocked)
    report, _ = yield from cancel_below(s, before, by, f"denied: {reason}")
    if report["children"]:
        yield from event(s, task_id, "tree_cancelled", before["claim_generation"] or None, None, by=by,
                         **tree_detail(report))


def _deny_by_deadline(s: Settings, before: dict[str, Any], req: dict[str, Any], reason: str) -> Op[None]:
    yield one("decide_approval", task_id=before["id"], decision="denied", decided_by=DEADLINE_ACTOR,
              decided_via="deadline", note=reason)
    yield from _end_denied(s, before, req, reason, DEADLINE_ACTOR)


def expire_approvals(s: Settings, *, limit: int = EXPIRE_BATCH) -> Op[int]:
    """:meth:`leaseq.Queue.expire_approvals`: deny every request whose deadline passed unanswered,
    and every task approved at or after its deadline (which no claim takes)."""
    limit = checks.check_int("limit", limit, minimum=1, maximum=100_000)
    denied = 0
    while True:
        yield BEGIN
        due = [r["id"] for r in (yield rows("approvals_due", limit=limit))]
        for task_id in due:
            before = yield from require_task(task_id)
            req = yield one("get_approval", task_id=task_id)
            yield from _deny_by_deadline(s, before, req, DEADLINE_REASON)
        late = [r["id"] for r in (yield rows("late_approvals", limit=limit))]
        for task_id in late:
            before = yield from require_task(task_id)
            req = yield one("get_approval", task_id=task_id)
            yield from _end_denied(s, before, req, f"approved at {req['decided_at'].isoformat()}, not before its "
                                                   f"approval deadline ({req['deadline_at'].isoformat()}): the "
                                                   "approval does not count", DEADLINE_ACTOR,
                                   from_status=Status.QUEUED)
        if due or late:
            yield from audit(DEADLINE_ACTOR, "deadline", "expire_approvals", "approvals", denied=due + late)
        yield COMMIT
        denied += len(due) + len(late)
        if len(due) < limit and len(late) < limit:
            return denied


def approvals(s: Settings, *, queue: str | None = None, limit: int = 100) -> Op[list[Approval]]:
    """:meth:`leaseq.Queue.approvals`: the undecided requests, oldest first, each with its task."""
    if queue is not None:
        checks.check_name("queue", queue)
    limit = checks.check_int("limit", limit, minimum=1, maximum=10_000)
    yield BEGIN
    found = yield rows("list_awaiting_approval", queue=queue, limit=limit)
    yield COMMIT
    return [Approval(task_id=r["id"], digest=shown_digest(r["approval_digest"], r),
                     requested_by=r["approval_requested_by"], requested_at=r["approval_requested_at"],
                     deadline_at=r["approval_deadline_at"], requested_worker=r["approval_requested_worker"],
                     requested_token=r["approval_requested_token"], reason=r.get("approval_reason"),
                     detail=_detail(r.get("detail")), task=to_task(r)) for r in found]


def _detail(value: Any) -> dict[str, Any] | None:
    """A request's figures (a JSON object; text where the read left it undecoded)."""
    found: dict[str, Any] | None = json.loads(value) if isinstance(value, str) else value
    return found


def approval(s: Settings, task_id: int) -> Op[Approval]:
    """:meth:`leaseq.Queue.approval`: one task's request and decision, with the task."""
    task_id = checks.check_task_id(task_id)
    yield BEGIN
    task = yield from require_task(task_id)
    req = yield one("get_approval", task_id=task_id)
    yield COMMIT
    if req is None:
        raise NotFound(f"task {task_id} has no approval request (it was not enqueued with approval='required')")
    return to_approval(req, task)
