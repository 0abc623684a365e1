"""The JSON API for everyone but the worker loop: enqueue and read, operator actions, admin.

Rights (see :mod:`leaseq.auth`): ``read`` for viewers and up, ``operate`` for
operators and admins, ``admin`` for admins. Every operator and admin action
passes the caller's identity to :class:`leaseq.Queue` (``by=``), which writes
it into the task's evidence trail, and is also written to the audit log.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request

from .. import auth
from ..core import policy
from ..queue import Queue
from .access import WORKER_ID_PATTERN, api_principal, need, require_queue
from .views import present_effect, present_event, present_task, queue_overview, task_timeline
from .wire import to_json
from .worker_api import Body, TaskId

router = APIRouter(prefix="/v1")
QueueName = Path(pattern=r"^[A-Za-z0-9_.:\-]{1,100}$", description="Queue name")


class EnqueueBody(Body):
    kind: str
    payload: Any = None
    effect: str = "read_only"
    queue: str = "default"
    idempotency_key: str | None = None
    priority: int = 0
    delay: float = 0
    max_attempts: int = 5
    lease_seconds: float = policy.DEFAULT_LEASE_SECONDS
    actions: list[str] | None = None


class CancelBody(Body):
    reason: str = "cancelled"


class ReconcileBody(Body):
    outcome: Literal["completed", "requeue", "cancel"]
    note: str
    result: Any = None


class NoteBody(Body):
    note: str


class TokenBody(Body):
    name: str
    role: Literal["worker", "viewer", "operator", "admin"]
    queues: list[str] | None = None
    read_payloads: bool | None = None
    expires_in: float | None = None


class PruneBody(Body):
    older_than_seconds: float
    payloads_older_than_seconds: float | None = None


def _queue(request: Request) -> Queue:
    return request.app.state.queue


def _audit(request: Request, principal: auth.Principal, action: str, target: str, **detail: Any) -> None:
    auth.record_action(_queue(request), principal.actor, action, target, **detail)


# -- enqueue and read -----------------------------------------------------------------

@router.post("/tasks", status_code=201, tags=["tasks"], summary="Enqueue a task")
def enqueue(body: EnqueueBody, request: Request, principal: auth.Principal = Depends(need("enqueue"))) -> dict:
    policy.check_name("queue", body.queue)
    require_queue(principal, body.queue)
    task = _queue(request).enqueue(body.kind, body.payload, effect=body.effect, queue=body.queue,
                                   idempotency_key=body.idempotency_key, priority=body.priority, delay=body.delay,
                                   max_attempts=body.max_attempts, lease_seconds=body.lease_seconds,
                                   actions=body.actions)
    return present_task(task, principal)


@router.get("/tasks/{task_id}", tags=["tasks"], summary="One task")
def get_task(request: Request, task_id: int = TaskId, principal: auth.Principal = Depends(api_principal)) -> dict:
    if not (principal.can("read") or principal.can("work")):
        raise auth.AccessDenied(f"the {principal.role} role cannot read tasks")
    task = _queue(request).get(task_id)
    if not principal.can("read"):
        require_queue(principal, task.queue)  # a worker reads tasks of its own queues only
    return present_task(task, principal)


@router.get("/tasks", tags=["tasks"], summary="Tasks, newest first")
def list_tasks(request: Request, status: str | None = Query(None), queue: str | None = Query(None),
               limit: int = Query(100, ge=1, le=1000),
               principal: auth.Principal = Depends(need("read"))) -> dict:
    tasks = _queue(request).list(status=status, queue=queue, limit=limit)
    return {"tasks": [present_task(t, principal) for t in tasks]}


@router.get("/tasks/{task_id}/events", tags=["tasks"], summary="A task's evidence trail")
def task_events(request: Request, task_id: int = TaskId, principal: auth.Principal = Depends(need("read"))) -> dict:
    return {"events": [present_event(e, principal) for e in _queue(request).events(task_id)]}


@router.get("/tasks/{task_id}/effects", tags=["tasks"], summary="A task's action ledger")
def task_effects(request: Request, task_id: int = TaskId, principal: auth.Principal = Depends(need("read"))) -> dict:
    return {"effects": [present_effect(fx, principal) for fx in _queue(request).effects(task_id)]}


@router.get("/tasks/{task_id}/timeline", tags=["tasks"], summary="The evidence trail by claim generation")
def timeline(request: Request, task_id: int = TaskId, principal: auth.Principal = Depends(need("read"))) -> dict:
    q = _queue(request)
    task = q.get(task_id)
    return task_timeline(task, q.events(task_id), q.effects(task_id), principal)


@router.get("/queues", tags=["queues"], summary="Counts by status, oldest queued age, paused state")
def queues(request: Request, principal: auth.Principal = Depends(need("read"))) -> dict:
    return {"queues": queue_overview(_queue(request))}


@router.get("/workers", tags=["workers"], summary="Registered workers and the leases they hold")
def workers(request: Request, principal: auth.Principal = Depends(need("read"))) -> dict:
    return {"workers": to_json(_queue(request).workers())}


@router.get("/whoami", tags=["access"], summary="The calling token's identity and rights")
def whoami(principal: auth.Principal = Depends(api_principal)) -> dict:
    return {"token_id": principal.token_id, "name": principal.name, "role": principal.role,
            "queues": sorted(principal.queues) if principal.queues is not None else None,
            "read_payloads": principal.read_payloads, "rights": sorted(auth.RIGHTS[principal.role]),
            "expires_at": to_json(principal.expires_at)}


# -- operator actions ------------------------------------------------------------------

@router.post("/tasks/{task_id}/cancel", tags=["operator"], summary="Cancel a task")
def cancel(body: CancelBody, request: Request, task_id: int = TaskId,
           principal: auth.Principal = Depends(need("operate"))) -> dict:
    task = _queue(request).cancel(task_id, body.reason, by=principal.actor)
    _audit(request, principal, "cancel", f"task:{task_id}", reason=body.reason)
    return present_task(task, principal)


@router.post("/tasks/{task_id}/reconcile", tags=["operator"], summary="Resolve a needs_reconciliation task")
def reconcile(body: ReconcileBody, request: Request, task_id: int = TaskId,
              principal: auth.Principal = Depends(need("operate"))) -> dict:
    task = _queue(request).reconcile(task_id, body.outcome, body.note, result=body.result, by=principal.actor)
    _audit(request, principal, "reconcile", f"task:{task_id}", outcome=body.outcome, note=body.note)
    return present_task(task, principal)


@router.post("/tasks/{task_id}/unblock", tags=["operator"], summary="Return a blocked task to the queue")
def unblock(body: NoteBody, request: Request, task_id: int = TaskId,
            principal: auth.Principal = Depends(need("operate"))) -> dict:
    task = _queue(request).unblock(task_id, body.note, by=principal.actor)
    _audit(request, principal, "unblock", f"task:{task_id}", note=body.note)
    return present_task(task, principal)


@router.post("/tasks/{task_id}/requeue", tags=["operator"], summary="Return a dead task to the queue")
def requeue(body: NoteBody, request: Request, task_id: int = TaskId,
            principal: auth.Principal = Depends(need("operate"))) -> dict:
    task = _queue(request).requeue(task_id, body.note, by=principal.actor)
    _audit(request, principal, "requeue", f"task:{task_id}", note=body.note)
    return present_task(task, principal)


@router.post("/queues/{name}/pause", tags=["operator"], summary="Turn a queue's off-switch on")
def pause(request: Request, name: str = QueueName, principal: auth.Principal = Depends(need("operate"))) -> dict:
    _queue(request).pause(name, by=principal.actor)
    _audit(request, principal, "pause", f"queue:{name}")
    return {"queue": name, "paused": True}


@router.post("/queues/{name}/resume", tags=["operator"], summary="Turn a queue's off-switch off")
def resume(request: Request, name: str = QueueName, principal: auth.Principal = Depends(need("operate"))) -> dict:
    _queue(request).resume(name, by=principal.actor)
    _audit(request, principal, "resume", f"queue:{name}")
    return {"queue": name, "paused": False}


@router.post("/workers/{worker_id}/revoke", tags=["operator"], summary="Revoke one worker")
def revoke_worker(request: Request, worker_id: str = Path(pattern=WORKER_ID_PATTERN),
                  principal: auth.Principal = Depends(need("operate"))) -> dict:
    _queue(request).revoke_worker(worker_id)
    _audit(request, principal, "revoke_worker", f"worker:{worker_id}")
    return {"worker_id": worker_id, "revoked": True}


# -- admin -----------------------------------------------------------------------------

@router.get("/tokens", tags=["admin"], summary="Every token (never a secret)")
def list_tokens(request: Request, principal: auth.Principal = Depends(need("admin"))) -> dict:
    return {"tokens": to_json(auth.list_tokens(_queue(request)))}


@router.post("/tokens", status_code=201, tags=["admin"], summary="Create a token; it is shown once")
def create_token(body: TokenBody, request: Request, principal: auth.Principal = Depends(need("admin"))) -> dict:
    token, record = auth.create_token(_queue(request), name=body.name, role=body.role, queues=body.queues,
                                      read_payloads=body.read_payloads, expires_in=body.expires_in,
                                      created_by=principal.actor)
    return {"token": token, **to_json(record)}


@router.delete("/tokens/{token_id}", tags=["admin"], summary="Revoke a token and its workers")
def revoke_token(request: Request, token_id: str = Path(pattern=r"^[0-9a-f]{12}$"),
                 principal: auth.Principal = Depends(need("admin"))) -> dict:
    workers_ = auth.revoke_token(_queue(request), token_id, by=principal.actor)
    return {"token_id": token_id, "revoked": True, "revoked_workers": workers_}


@router.post("/prune", tags=["admin"], summary="Apply retention now")
def prune(body: PruneBody, request: Request, principal: auth.Principal = Depends(need("admin"))) -> dict:
    counts = _queue(request).prune(body.older_than_seconds,
                                   payloads_older_than_seconds=body.payloads_older_than_seconds)
    _audit(request, principal, "prune", "retention", older_than_seconds=body.older_than_seconds,
           payloads_older_than_seconds=body.payloads_older_than_seconds, **counts)
    return counts


@router.get("/audit", tags=["admin"], summary="The newest audit entries")
def audit(request: Request, limit: int = Query(100, ge=1, le=10_000),
          principal: auth.Principal = Depends(need("admin"))) -> dict:
    return {"entries": to_json(auth.audit_log(_queue(request), limit))}

