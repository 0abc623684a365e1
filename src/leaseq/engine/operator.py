"""Operator actions: workers in and out, cancel, reconcile, unblock, requeue, pause.

Each action takes ``by`` (who acts: recorded in the evidence trail and the
audit log) and ``via`` (how: "api", "dashboard", "cli"), and writes its audit
entry in its own transaction: if the entry cannot be written, the action
does not happen either. None of these is lease-backed: an operator decides
over a task whoever holds it, and the holder's next guarded write is refused.
"""

from __future__ import annotations

import json
from typing import Any

from ..core import checks
from ..core.errors import InvalidInput, InvalidTransition, UnknownWorker
from ..core.model import Status, Task, Worker
from ..signature import check_spec
from .common import Settings, acting, audit, event, require_task, to_task, worker_id
from .dependencies import settle_dependents
from .effects import check_actions
from . import limits
from . import children
from .expiry import end_worker_leases
from .steps import BEGIN, COMMIT, Op, one, rows


def register_worker(s: Settings, name: str = "worker", *, token_id: str | None = None,
                    kinds: list[dict[str, Any]] | None = None, heartbeat_seconds: float | None = None,
                    lease_seconds: float | None = None, version: str | None = None,
                    compatible_versions: list[str] | None = None) -> Op[Worker]:
    """:meth:`leaseq.Queue.register_worker`."""
    checks.check_name("name", name)
    declared = check_declarations(kinds)
    heartbeat, lease = check_liveness(heartbeat_seconds, lease_seconds)
    version, compatible = check_versions(version, compatible_versions)
    yield BEGIN
    row = yield one("register_worker", name=name, heartbeat_seconds=heartbeat, lease_seconds=lease,
                    code_version=version, compatible_versions=compatible)
    if token_id is not None:
        yield rows("link_worker_token", worker_id=row["id"], token_id=checks.check_name("token_id", token_id))
    if declared:
        yield rows("declare_worker_kinds", worker_id=row["id"], declarations=declared)
    yield COMMIT
    return Worker(id=row["id"], name=row["name"], registered_at=row["registered_at"], code_version=version,
                  compatible_versions=compatible)


#: The most versions a worker may declare compatible.
MAX_VERSIONS = 100


def check_versions(version: Any, compatible: Any) -> tuple[str | None, list[str] | None]:
    """A worker's code version and the versions whose started tasks it serves, checked: its own
    version is always among them (default: only it); no version, no list (it serves any task).
    Raises :class:`InvalidInput` naming ``version`` or ``compatible_versions``."""
    if version is None:
        if compatible is not None:
            raise InvalidInput("compatible_versions", "is given only with a version (a worker without a "
                                                      "version serves tasks of any version)")
        return None, None
    version = checks.check_name("version", version)
    if compatible is None:
        return version, [version]
    if isinstance(compatible, (str, bytes)) or not isinstance(compatible, (list, tuple, set, frozenset)) \
            or len(compatible) > MAX_VERSIONS:
        raise InvalidInput("compatible_versions", f"must be a list of at most {MAX_VERSIONS} versions "
                                                  f"(got {compatible!r})")
    out = sorted({checks.check_name("compatible_versions", v) for v in compatible} | {version})
    return version, out


#: The most kinds one registration may declare.
MAX_KINDS = 1000


def check_declarations(kinds: Any) -> list[dict[str, Any]]:
    """The kinds a worker declares it serves (``[{kind, queue, effect, actions, signature}]``,
    see :meth:`leaseq.worker.registry.Registry.declarations`), checked; raises
    :class:`InvalidInput` naming ``kinds``."""
    if kinds is None:
        return []
    if not isinstance(kinds, list) or len(kinds) > MAX_KINDS:
        raise InvalidInput("kinds", f"must be a list of at most {MAX_KINDS} declarations")
    out, seen = [], set()
    for d in kinds:
        if not isinstance(d, dict) or not {"kind", "queue", "effect"} <= d.keys() \
                or not d.keys() <= {"kind", "queue", "effect", "actions", "signature"}:
            raise InvalidInput("kinds", "each declaration is an object with kind, queue, effect, and "
                                        "optionally actions and signature")
        kind = checks.check_kind(d["kind"], "kinds")
        if kind in seen:
            raise InvalidInput("kinds", f"{kind!r} is declared twice")
        seen.add(kind)
        effect = checks.check_effect(d["effect"])
        actions = None if d.get("actions") is None else check_actions(d["actions"], effect)
        out.append({"kind": kind, "queue": checks.check_name("queue", d["queue"]), "effect": effect,
                    "actions": None if actions is None else json.loads(actions),
                    "signature": None if d.get("signature") is None else check_spec(d["signature"], "kinds")})
    return out


def check_liveness(heartbeat_seconds: Any, lease_seconds: Any) -> tuple[float | None, float | None]:
    """A worker's heartbeat interval and lease length: both or neither (a worker
    registered by hand does not heartbeat); the interval shorter than the lease."""
    if heartbeat_seconds is None and lease_seconds is None:
        return None, None
    if heartbeat_seconds is None or lease_seconds is None:
        raise InvalidInput("heartbeat_seconds", "give heartbeat_seconds and lease_seconds together, or neither")
    heartbeat = checks.check_seconds("heartbeat_seconds", heartbeat_seconds, allow_zero=False)
    lease = checks.check_seconds("lease_seconds", lease_seconds, allow_zero=False)
    if heartbeat >= lease:
        raise InvalidInput("heartbeat_seconds", f"must be shorter than lease_seconds ({heartbeat} >= {lease})")
    return heartbeat, lease


def heartbeat_worker(s: Settings, worker: Worker | str) -> Op[None]:
    """:meth:`leaseq.Queue.heartbeat_worker`."""
    wid = worker_id(worker)
    yield BEGIN
    if (yield one("worker_heartbeat", worker_id=wid)) is None and (yield one("get_worker", worker_id=wid)) is None:
        raise UnknownWorker(f"worker {wid!r} was never registered")
    yield COMMIT


def stop_worker(s: Settings, worker: Worker | str, reason: str = "stopped") -> Op[None]:
    """:meth:`leaseq.Queue.stop_worker`."""
    wid = worker_id(worker)
    checks.check_text("reason", reason, required=True)
    yield BEGIN
    if (yield one("worker_stopped", worker_id=wid, reason=reason[:MAX_STOP_REASON])) is None \
            and (yield one("get_worker", worker_id=wid)) is None:
        raise UnknownWorker(f"worker {wid!r} was never registered")
    yield COMMIT


#: A stop reason is kept to this many characters.
MAX_STOP_REASON = 500


def revoke_worker(s: Settings, worker: Worker | str, *, by: str | None = None,
                  via: str | None = None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.revoke_worker`."""
    wid = worker_id(worker)
    yield BEGIN
    by, via = yield from acting(by, via)
    if (yield one("revoke_worker", worker_id=wid)) is None:
        if (yield one("get_worker", worker_id=wid)) is None:
            raise UnknownWorker(f"worker {wid!r} was never registered")
        yield from audit(by, via, "revoke_worker", f"worker:{wid}", already_revoked=True)
        yield COMMIT
        return {"worker_id": wid, "revoked": True}  # revoked before: its leases ended then
    ended = yield from end_worker_leases(s, wid, "worker revoked")
    yield from audit(by, via, "revoke_worker", f"worker:{wid}", ended_leases=ended)
    yield COMMIT
    return {"worker_id": wid, "revoked": True}


def cancel(s: Settings, task_id: int, reason: str = "cancelled", *, by: str | None = None,
           via: str | None = None, tree: bool = False) -> Op[Task | dict[str, Any]]:
    """:meth:`leaseq.Queue.cancel`: the task, or with ``tree`` the cancel tree's report."""
    task_id = checks.check_task_id(task_id)
    checks.check_text("reason", reason, required=True)
    if type(tree) is not bool:
        raise InvalidInput("tree", f"must be true or false, not {tree!r}")
    yield BEGIN
    by, via = yield from acting(by, via)
    before = yield from require_task(task_id, lock=True)
    report = yield from _cancel_locked(s, before, reason, by, via, tree=tree)
    if report is None:
        raise InvalidTransition(f"task {task_id} is {before['status']}; only unfinished tasks can be cancelled")
    task = yield one("get_task", task_id=task_id)
    yield COMMIT
    if tree:
        return {"task_id": task_id, "status": task["status"], "previous_status": before["status"], **report}
    return to_task(task)


def _cancel_locked(s: Settings, before: dict[str, Any], reason: str, by: str, via: str | None, *,
                   tree: bool = False) -> Op[dict[str, Any] | None]:
    """Cancel the task ``before`` (its row, locked in the open transaction) and what it leaves
    under way (:func:`leaseq.engine.children.cancel_below`), with its evidence and audit entry;
    the cancel tree's report, or None (nothing written) when it has ended already. The report
    goes into the evidence trail (``tree_cancelled``) when the task spawned children, or with
    ``tree``."""
    task_id = before["id"]
    if (yield one("cancel_task", task_id=task_id, reason=f"cancelled: {reason}")) is None:
        return None
    if before["status"] == Status.RUNNING:  # the lease ends here: its limit slots come back
        yield from limits.release(s, [before])
    detail: dict[str, Any] = dict(by=by, reason=reason, previous_status=before["status"])
    if before["status"] == Status.RUNNING:
        detail["revoked_lease_of"] = before["lease_owner"]
        detail["open_intents"] = before["open_effects"]
    yield from event(s, task_id, "cancelled", before["claim_generation"] or None, None, **detail)
    yield from settle_dependents(s, [task_id])
    # its intents (ctx.intend): those not started end with it, the others are told; its
    # children (ctx.spawn) that have not ended end with it, and theirs
    report, intents = yield from children.cancel_below(s, before, by, reason)
    if tree or report["children"]:
        yield from event(s, task_id, "tree_cancelled", before["claim_generation"] or None, None, by=by,
                         **children.tree_detail(report))
    extra: dict[str, Any] = {}
    if report["children"]:
        extra["cancelled_children"] = [c["task_id"] for c in report["children"] if c["status"] != c["previous_status"]]
    yield from audit(by, via, "cancel", f"task:{task_id}", reason=reason, previous_status=before["status"],
                     **_intents_detail(intents), **extra)
    return report


def _intents_detail(intents: dict[str, list[int]]) -> dict[str, list[int]]:
    """The audit detail of a cancellation's intents: the lists that are not empty."""
    return {f"{k}_intents": v for k, v in intents.items() if v}


_OUTCOMES = {"completed": Status.COMPLETED, "requeue": Status.QUEUED, "cancel": Status.CANCELLED}


def reconcile(s: Settings, task_id: int, outcome: str, note: str, *, result: Any = None, by: str | None = None,
              via: str | None = None) -> Op[Task]:
    """:meth:`leaseq.Queue.reconcile`."""
    task_id = checks.check_task_id(task_id)
    if not isinstance(outcome, str) or outcome not in _OUTCOMES:
        raise InvalidInput("outcome", f"must be one of completed, requeue, cancel (got {outcome!r})")
    checks.check_text("note", note, required=True)
    checks.check_json("result", result)
    yield BEGIN
    by, via = yield from acting(by, via)
    before = yield from require_task(task_id, lock=True)
    row = yield one("set_task_status", task_id=task_id, from_status=Status.NEEDS_RECONCILIATION.value,
                    status=_OUTCOMES[outcome].value, set_result=outcome == "completed", result=result,
                    reset_attempts=False)
    if row is None:
        raise InvalidTransition(f"task {task_id} is {before['status']}, not needs_reconciliation")
    settled = yield rows("settle_open_effects", task_id=task_id)
    yield from event(s, task_id, "reconciled", before["claim_generation"] or None, None, by=by, outcome=outcome,
                     note=note, settled_intents=[e["idempotency_key"] for e in settled])
    if outcome != "requeue":  # completed or cancelled: the task has ended, and its waiters move on
        yield from settle_dependents(s, [task_id])
    intents: dict[str, list[int]] = {}
    if outcome == "cancel":  # cancelled: so are the intents it recorded that have not started, and its children
        _, intents = yield from children.cancel_below(s, before, by, note)
    yield from audit(by, via, "reconcile", f"task:{task_id}", outcome=outcome, note=note, **_intents_detail(intents))
    task = yield one("get_task", task_id=task_id)
    yield COMMIT
    return to_task(task)


def unblock(s: Settings, task_id: int, note: str, *, by: str | None = None, via: str | None = None) -> Op[Task]:
    """:meth:`leaseq.Queue.unblock`."""
    return (yield from _resume(s, task_id, Status.BLOCKED, "unblocked", "unblock", note, by, via,
                               reset_attempts=False))


def requeue(s: Settings, task_id: int, note: str = "requeued by operator", *, by: str | None = None,
            via: str | None = None) -> Op[Task]:
    """:meth:`leaseq.Queue.requeue`."""
    return (yield from _resume(s, task_id, Status.DEAD, "requeued", "requeue", note, by, via, reset_attempts=True))


def _resume(s: Settings, task_id: int, from_status: Status, event_type: str, action: str, note: str,
            by: str | None, via: str | None, *, reset_attempts: bool) -> Op[Task]:
    task_id = checks.check_task_id(task_id)
    checks.check_text("note", note, required=True)
    yield BEGIN
    by, via = yield from acting(by, via)
    before = yield from require_task(task_id, lock=True)
    if before.get("scrubbed_at") is not None and before["status"] == from_status.value:
        # retention cleared its payload: another attempt would run on nothing
        raise InvalidTransition(f"task {task_id} is {before['status']} and retention cleared its payload; "
                                f"enqueue it anew instead")
    if not (yield from _resume_locked(s, before, from_status, event_type, action, note, by, via,
                                      reset_attempts=reset_attempts)):
        raise InvalidTransition(f"task {task_id} is {before['status']}, not {from_status.value}")
    task = yield one("get_task", task_id=task_id)
    yield COMMIT
    return to_task(task)


def _resume_locked(s: Settings, before: dict[str, Any], from_status: Status, event_type: str, action: str,
                   note: str, by: str, via: str | None, *, reset_attempts: bool) -> Op[bool]:
    """Return the task ``before`` (its row, locked in the open transaction) from ``from_status`` to
    the queue, with its evidence and audit entry; False (nothing written) when it is not there."""
    task_id = before["id"]
    row = yield one("set_task_status", task_id=task_id, from_status=from_status.value, status=Status.QUEUED.value,
                    set_result=False, result=None, reset_attempts=reset_attempts)
    if row is None:
        return False
    yield from event(s, task_id, event_type, before["claim_generation"] or None, None, by=by, note=note,
                     previous_attempts=before["attempts"])
    yield from audit(by, via, action, f"task:{task_id}", note=note)
    yield rows("notify_work", queue=before["queue"])
    return True


# -- bulk actions by filter: dead letters and redrive ---------------------------------------

#: The statuses Queue.redrive returns to the queue: dead (a fresh attempt budget, as requeue)
#: and blocked (as unblock).
REDRIVE_STATUSES = ("dead", "blocked")
#: The statuses Queue.cancel_where may cancel (those Queue.cancel may).
CANCEL_STATUSES = ("queued", "running", "waiting", "awaiting_approval", "blocked", "needs_reconciliation", "dead")
#: The most tasks one bulk action moves (a larger backlog: run it again).
MAX_BULK = 10_000


def check_filter(statuses: Any, allowed: tuple[str, ...], *, queue: Any, kind: Any, error: Any, older_than: Any,
                 limit: Any) -> dict[str, Any]:
    """A bulk action's filter, checked (InvalidInput names the field)."""
    if isinstance(statuses, str):
        statuses = [statuses]
    if not isinstance(statuses, (list, tuple)) or not statuses or any(
            not isinstance(x, str) or x not in allowed for x in statuses):
        raise InvalidInput("status", f"must be one or more of {', '.join(allowed)} (got {statuses!r})")
    return dict(statuses=sorted(set(statuses)),
                queue=None if queue is None else checks.check_name("queue", queue),
                kind=None if kind is None else checks.check_kind(kind),
                error=None if error is None else checks.check_text("error", error, required=True),
                older_than=None if older_than is None else checks.check_seconds(
                    "older_than", older_than, allow_zero=True, maximum=100 * 365 * 86400.0),
                row_limit=checks.check_int("limit", limit, minimum=1, maximum=MAX_BULK))


def act_where(s: Settings, action: str, flt: dict[str, Any], text: str, *, dry_run: bool, by: str | None,
              via: str | None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.redrive` (``action`` "redrive") and :meth:`leaseq.Queue.cancel_where`
    (``action`` "cancel_where"), ``flt`` checked by :func:`check_filter`: in one transaction, the
    matching tasks are locked and each is moved as the single action moves it (requeue or
    unblock; cancel), with its evidence and audit entry, then one audit entry for the whole;
    ``dry_run`` counts them and changes nothing."""
    if not isinstance(dry_run, bool):
        raise InvalidInput("dry_run", f"must be true or false (got {dry_run!r})")
    checks.check_text("note" if action == "redrive" else "reason", text, required=True)
    yield BEGIN
    by, via = yield from acting(by, via)
    found = list((yield rows("tasks_where", **flt)))
    moved: list[int] = []
    skipped: list[int] = []
    if not dry_run:
        for row in found:
            if action == "cancel_where":
                done = (yield from _cancel_locked(s, row, text, by, via)) is not None
            elif row.get("scrubbed_at") is not None:  # retention cleared its payload: nothing to run on
                done = False
            elif row["status"] == Status.DEAD.value:
                done = yield from _resume_locked(s, row, Status.DEAD, "requeued", "requeue", text, by, via,
                                                 reset_attempts=True)
            else:
                done = yield from _resume_locked(s, row, Status.BLOCKED, "unblocked", "unblock", text, by, via,
                                                 reset_attempts=False)
            (moved if done else skipped).append(row["id"])
        shown = {k: v for k, v in flt.items() if v is not None and k != "row_limit"}
        yield from audit(by, via, action, "tasks", filter=shown, limit=flt["row_limit"], matched=len(found),
                         moved=len(moved), skipped=skipped, note=text)
    yield COMMIT
    return {"action": action, "dry_run": dry_run, "matched": len(found),
            "task_ids": [r["id"] for r in found] if dry_run else moved, "skipped": skipped,
            "more": len(found) == flt["row_limit"]}


#: The most known queues an "unknown queue" refusal names.
KNOWN_QUEUES_SHOWN = 20


def set_paused(s: Settings, queue: str, paused: bool, *, create: bool = False, by: str | None = None,
               via: str | None = None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.pause` and :meth:`leaseq.Queue.resume`: the queue's off-switch.

    Only for a known queue (one that has had a task, or has a switch already)
    unless ``create``: a mistyped name is refused (:class:`InvalidInput`, field
    ``queue``, naming the known queues), not switched on its own.
    """
    checks.check_name("queue", queue)
    if not isinstance(create, bool):
        raise InvalidInput("create", f"must be true or false (got {create!r})")
    yield BEGIN
    by, via = yield from acting(by, via)
    if (yield one("set_paused", queue=queue, paused=paused, actor=by, create=create)) is None:
        known = [r["name"] for r in (yield rows("known_queues", limit=KNOWN_QUEUES_SHOWN + 1))]
        raise InvalidInput("queue", unknown_queue(queue, known, "pause" if paused else "resume"))
    yield from audit(by, via, "pause" if paused else "resume", f"queue:{queue}")
    yield COMMIT
    return {"queue": queue, "paused": paused}


def unknown_queue(queue: str, known: list[str], verb: str) -> str:
    """The refusal of a pause or resume of a queue that is not known (``known``: the names, at most
    one more than are shown)."""
    if known:
        shown = ", ".join(known[:KNOWN_QUEUES_SHOWN]) + (", …" if len(known) > KNOWN_QUEUES_SHOWN else "")
        names = f"known queues: {shown}"
    else:
        names = "no queue is known yet"
    return (f"{queue!r} is not a known queue: it has had no task and has no off-switch ({names}); "
            f"to {verb} it before its first task, pass create=True (leaseq {verb} --create; "
            f'over HTTP "create": true)')


def redrive(s: Settings, *, status: Any = "dead", queue: Any = None, kind: Any = None, error: Any = None,
            older_than: Any = None, limit: Any = 1000, dry_run: Any = False, note: Any = "redriven",
            by: str | None = None, via: str | None = None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.redrive`."""
    flt = check_filter(status, REDRIVE_STATUSES, queue=queue, kind=kind, error=error, older_than=older_than,
                       limit=limit)
    return (yield from act_where(s, "redrive", flt, note, dry_run=dry_run, by=by, via=via))


def cancel_where(s: Settings, *, status: Any, queue: Any = None, kind: Any = None, error: Any = None,
                 older_than: Any = None, limit: Any = 1000, dry_run: Any = False, reason: Any = "cancelled",
                 by: str | None = None, via: str | None = None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.cancel_where`."""
    flt = check_filter(status, CANCEL_STATUSES, queue=queue, kind=kind, error=error, older_than=older_than,
                       limit=limit)
    return (yield from act_where(s, "cancel_where", flt, reason, dry_run=dry_run, by=by, via=via))
