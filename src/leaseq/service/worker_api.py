"""The worker API: what :class:`leaseq.client.RemoteQueue` calls.

Every route needs a ``worker`` token. A worker id in the path must have been
registered by the calling token (else 403): the identity comes from the
credential, never from the body. Each route names its action in
:data:`leaseq.access.ACTIONS`; :func:`leaseq.access.authorize` decides. The generation a request names is checked
by the lease guard in SQL, so a worker can only act under a generation it
was issued and still holds; nothing here decides lease questions.

A guarded call names the attempt by an :class:`leaseq.core.model.AttemptRef`
(task id, generation, worker id: all the lease guard reads), built from the
request's path and body; ``fail`` needs no prior read of the task either, as
its default backoff is computed in the guarded statement itself.
The hot path (claim with its long poll, renew, and the batched complete and
fail) is in :mod:`.worker_batch`. Every lease-guarded call of one task here
(complete, fail, release, the tool-call ledger, intents, loss reports) runs
as those do: the engine's operation in one transaction with the token check
(:func:`.access.serve_operation`), on the event loop where the backend has an
asyncio driver.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from .. import access, engine
from ..core import checks
from ..core.errors import BudgetSpent, InvalidInput, LeaseLost
from ..core.model import AttemptRef, Task
from ..engine.steps import Op, T
from ..queue import Queue
from .access import WORKER_ID_PATTERN, need, serve_operation
from .metrics import ServiceMetrics, span
from .wire import record_json

router = APIRouter(prefix="/v1", tags=["worker"])

TaskId = Path(ge=1, le=2**63 - 1, description="Task id")
WorkerId = Path(pattern=WORKER_ID_PATTERN, description="A worker id issued to this token")


class Item(BaseModel):
    """An element of a request body's list: unknown fields and loose types are refused; its
    text was checked by the body it is in (whose check walks the whole request once)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Body(Item):
    """Request bodies: unknown fields, loose types and NUL characters are refused."""

    @model_validator(mode="before")
    @classmethod
    def _no_nul_characters(cls, data: Any) -> Any:
        # PostgreSQL cannot store U+0000 in text or jsonb, and no database can
        # store a lone surrogate; refuse both at the edge, naming where they were,
        # rather than fail deep in the driver. The walk that names the place runs
        # only when a quick one (no paths built: a batch of completions is
        # thousands of values) has found something to name.
        if _clean_text(data):
            return data
        stack: list[tuple[str, Any]] = [("", data)]
        while stack:
            path, value = stack.pop()
            if isinstance(value, str):
                problem = _bad_text(value)
                if problem == "nul":
                    raise PydanticCustomError("nul_character", "{field}: text must not contain NUL characters",
                                              {"field": path or "body"})
                if problem == "surrogate":  # a lone surrogate from a \ud800-style escape
                    raise PydanticCustomError("bad_unicode", "{field}: text must be valid Unicode "
                                              "(no lone surrogates)", {"field": path or "body"})
            elif isinstance(value, dict):
                for key, item in value.items():
                    # the path is echoed in the error: escape what cannot be encoded
                    name = str(key).encode("utf-8", "backslashreplace").decode("utf-8")
                    stack.append((f"{path}.{name}" if path else name, key))
                    stack.append((f"{path}.{name}" if path else name, item))
            elif isinstance(value, list):
                stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
        return data


def _bad_text(value: str) -> str | None:
    """What makes ``value`` unstorable: "nul", "surrogate", or None."""
    if "\x00" in value:
        return "nul"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "surrogate"
    return None


def _clean_text(data: Any) -> bool:
    """Whether no text anywhere in ``data`` (keys included) is unstorable."""
    stack = [data]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is str:
            if "\x00" in value or (not value.isascii() and _bad_text(value) is not None):
                return False
        elif kind is int or kind is float or kind is bool or value is None:
            continue
        elif kind is dict:
            stack.extend(value)
            stack.extend(value.values())
        elif kind is list:
            stack.extend(value)
        elif isinstance(value, str):  # a str subclass: never from JSON, checked all the same
            if _bad_text(value) is not None:
                return False
        elif isinstance(value, (dict, list)):
            return False  # subclasses: the walk that names places looks at them
    return True


class RegisterBody(Body):
    name: str = "worker"
    #: the kinds it serves, with their declared options (checked by the engine)
    kinds: list[Any] | None = None
    heartbeat_seconds: float | None = None
    lease_seconds: float | None = None
    #: the version of the code it runs, and the versions whose started tasks it serves
    #: (checked by the engine)
    version: Any = None
    compatible_versions: Any = None


class StoppedBody(Body):
    reason: str = "stopped"


class CompleteBody(Body):
    generation: int
    result: Any = None


class FailBody(Body):
    generation: int
    error: str
    retry: bool = True
    block: bool = False
    delay: float | None = None
    #: seconds: not a failure but a retry on request (leaseq.Retry), ``error`` its reason
    retry_after: float | None = None


class ReleaseBody(Body):
    generation: int
    reason: str = "released"
    #: false: the handler never began, and the attempt is given back with the lease
    started: bool = True


class EffectBody(Body):
    generation: int
    action: str
    key: str | None = None
    resource: str | None = None
    effect: str | None = None
    args_digest: str | None = None


class EffectResponseBody(Body):
    generation: int
    response: Any = None


class IntentBody(Body):
    generation: int
    kind: str
    payload: Any = None
    key: str
    queue: str = "default"
    effect: str = "side_effect"
    approval: Literal["required"] | None = None
    approval_deadline: float | None = None
    priority: int = 0
    max_attempts: int = 5
    lease_seconds: float = checks.DEFAULT_LEASE_SECONDS
    actions: list[str] | None = None


class SleepBody(Body):
    generation: int
    key: str
    seconds: float | None = None
    #: Unix seconds
    until: float | None = None


class SignalWaitBody(Body):
    generation: int
    key: str
    name: str
    timeout: float | None = None
    #: a question put to a person (ctx.ask): {"question": ..., "schema": ...}
    ask: dict[str, Any] | None = None


class EmitBody(Body):
    generation: int
    item: Any = None
    #: a durable item's ledger key (None: not durable)
    key: str | None = None


class SpawnBody(Body):
    generation: int
    kind: str
    payload: Any = None
    key: str
    #: None: the spawning task's own queue
    queue: str | None = None
    effect: str = "read_only"
    priority: int = 0
    max_attempts: int = 5
    lease_seconds: float = checks.DEFAULT_LEASE_SECONDS
    actions: list[str] | None = None
    timeout: float | None = None
    limits: list[str] | None = None
    units: int = 1
    resources: list[str] | None = None


class ChildrenWaitBody(Body):
    generation: int
    key: str
    children: list[int]
    timeout: float | None = None


class ConsumeBody(Body):
    generation: int
    key: str
    limit_key: str
    units: int


class LossBody(Body):
    generation: int
    reason: str


def _queue(request: Request) -> Queue:
    queue: Queue = request.app.state.queue
    return queue


def _metrics(request: Request) -> ServiceMetrics:
    metrics: ServiceMetrics = request.app.state.metrics
    return metrics


def _attempt(worker_id: str, task_id: int, generation: int) -> AttemptRef:
    """The attempt a request names: the lease guard in SQL checks it against the row."""
    checks.check_int("generation", generation, minimum=0, maximum=2**63 - 1)
    return AttemptRef(task_id, generation, worker_id)


#: Per-task records of the worker API (see :mod:`.worker_batch`).
logger = logging.getLogger("leaseq.service.worker")


def _log(level: int, what: str, worker_id: str, started: float, task_id: int, generation: int,
         kind: str | None = None, **detail: Any) -> None:
    """One task's record: the task's fields as the record's, for JSON lines."""
    if logger.isEnabledFor(level):
        text = f"task={task_id} " + (f"kind={kind} " if kind else "") + f"gen={generation} worker={worker_id}: {what}"
        logger.log(level, "%s", text + "".join(f" {k}={v}" for k, v in detail.items()),
                   extra={"task_id": task_id, "kind": kind, "generation": generation, "worker_id": worker_id,
                          "duration": round(time.perf_counter() - started, 6)})


async def _guarded(request: Request, reason: str, worker_id: str, operation: Callable[[Queue], Op[T]]) -> T:
    """A lease-guarded operation of one task, in the request's one transaction with its
    token check (on the event loop where the backend has an asyncio driver); a refusal
    by the lease guard is counted and logged. ``reason``: the action, as authorized."""
    started = time.perf_counter()
    try:
        return await serve_operation(request, reason, worker_id, operation)
    except BudgetSpent:  # the attempt ended waiting for an approval: no refusal
        raise
    except LeaseLost as exc:
        _metrics(request).lost(reason)
        _log(logging.INFO, f"{reason} refused: lease no longer held", worker_id, started, exc.task_id,
             exc.generation)
        raise


@router.post("/workers", status_code=201, summary="Register a worker under the calling token")
def register_worker(body: RegisterBody, request: Request,
                    principal: access.Principal = Depends(need("register_worker"))) -> dict[str, Any]:
    worker = _queue(request).register_worker(body.name, token_id=principal.token_id, kinds=body.kinds,
                                             heartbeat_seconds=body.heartbeat_seconds,
                                             lease_seconds=body.lease_seconds, version=body.version,
                                             compatible_versions=body.compatible_versions)
    request.app.state.access.remember_worker(worker.id, principal.token_id)
    return record_json(worker)


@router.post("/workers/{worker_id}/heartbeat", summary="Say the worker process is alive (renews no lease)")
async def heartbeat_worker(request: Request, worker_id: str = WorkerId) -> dict[str, Any]:
    # Authorized as a renewal: the same token, its own worker.
    await serve_operation(request, "renew", worker_id,
                          lambda view: engine.operator.heartbeat_worker(view.settings, worker_id))
    return {"worker_id": worker_id}


@router.post("/workers/{worker_id}/stopped", summary="Record the worker's clean exit and why")
async def worker_stopped(body: StoppedBody, request: Request, worker_id: str = WorkerId) -> dict[str, Any]:
    await serve_operation(request, "renew", worker_id,
                          lambda view: engine.operator.stop_worker(view.settings, worker_id, body.reason))
    return {"worker_id": worker_id, "stopped": True}


@router.post("/workers/{worker_id}/tasks/{task_id}/complete", summary="Finish a task under its lease")
async def complete(body: CompleteBody, request: Request, task_id: int = TaskId,
                   worker_id: str = WorkerId) -> dict[str, Any]:
    claim = _attempt(worker_id, task_id, body.generation)
    started = time.perf_counter()
    await _guarded(request, "complete", worker_id,
                   lambda view: engine.endings.complete(view.settings, worker_id, claim, body.result))
    _log(logging.DEBUG, "completed", worker_id, started, task_id, body.generation)
    return {"completed": True, "task_id": task_id}


def _failing(view: Queue, worker_id: str, task_id: int, body: FailBody) -> Op[Task]:
    """``fail`` (or, with ``retry_after``, ``retry``) of one task."""
    claim = _attempt(worker_id, task_id, body.generation)
    if body.retry_after is not None:  # Queue.retry: the attempt ends on request, not as a failure
        if body.block or not body.retry or body.delay is not None:
            raise InvalidInput("retry_after", "asks for a retry on request: not with block, retry=false "
                                              "or delay")
        return (yield from engine.endings.retry(view.settings, worker_id, claim, body.retry_after, body.error))
    return (yield from engine.endings.fail(view.settings, worker_id, claim, body.error, retry=body.retry,
                                          block=body.block, delay=body.delay))


@router.post("/workers/{worker_id}/tasks/{task_id}/fail",
             summary="End the attempt with an error, or (retry_after) ask to run it again later")
async def fail(body: FailBody, request: Request, task_id: int = TaskId, worker_id: str = WorkerId) -> dict[str, Any]:
    checks.check_int("generation", body.generation, minimum=0, maximum=2**63 - 1)
    started = time.perf_counter()
    task = await _guarded(request, "fail", worker_id, lambda view: _failing(view, worker_id, task_id, body))
    _log(logging.INFO, f"failed -> {task.status}", worker_id, started, task.id, task.claim_generation, task.kind)
    return record_json(task)


@router.post("/workers/{worker_id}/tasks/{task_id}/release", summary="Give a lease back early")
async def release(body: ReleaseBody, request: Request, task_id: int = TaskId,
                  worker_id: str = WorkerId) -> dict[str, Any]:
    claim = _attempt(worker_id, task_id, body.generation)
    task = await _guarded(request, "release", worker_id, lambda view: engine.endings.release(
        view.settings, worker_id, claim, body.reason, started=body.started))
    if task.status == "queued":
        request.app.state.work_signal.wake(task.queue)
    return record_json(task)


@router.post("/workers/{worker_id}/tasks/{task_id}/effects", summary="Record a tool-call intent")
async def begin_effect(body: EffectBody, request: Request, task_id: int = TaskId,
                       worker_id: str = WorkerId) -> dict[str, Any]:
    claim = _attempt(worker_id, task_id, body.generation)
    with span("leaseq.effect.begin", task_id=task_id, action=body.action, generation=body.generation):
        effect = await _guarded(request, "begin_effect", worker_id, lambda view: engine.effects.begin_effect(
            view.settings, worker_id, claim, body.action, body.key, resource=body.resource, effect=body.effect,
            args_digest=body.args_digest))
    return record_json(effect)


@router.post("/workers/{worker_id}/tasks/{task_id}/effects/{effect_id}/response",
             summary="Record a tool call's response")
async def finish_effect(body: EffectResponseBody, request: Request, task_id: int = TaskId,
                        effect_id: int = Path(ge=1, le=2**63 - 1), worker_id: str = WorkerId) -> dict[str, Any]:
    # Only the id and task matter: the lease guard and the ledger's own
    # condition (this generation's open intent) decide, exactly as in-process.
    claim = _attempt(worker_id, task_id, body.generation)
    with span("leaseq.effect.finish", task_id=task_id, effect_id=effect_id, generation=body.generation):
        done = await _guarded(request, "finish_effect", worker_id, lambda view: engine.effects.finish_effect_id(
            view.settings, worker_id, claim, effect_id, body.response))
    return record_json(done)


@router.post("/workers/{worker_id}/tasks/{task_id}/intents", summary="Record an intent for an executor")
async def intend(body: IntentBody, request: Request, task_id: int = TaskId,
                 worker_id: str = WorkerId) -> dict[str, Any]:
    # An intent is written for an executor pool whose queue the agent's token
    # cannot claim from; outside its own queues only approval-gated. The lease
    # of the calling task and its declared actions (intend:<kind>) decide the rest.
    checks.check_name("queue", body.queue)
    options = body.model_dump(exclude={"generation", "kind", "payload", "key"})
    claim = _attempt(worker_id, task_id, body.generation)

    def intending(view: Queue) -> Op[Task]:
        # the caller is known once the token was checked, in this transaction
        principal = request.state.principal
        access.authorize_intent(principal, body.queue, body.approval)
        return engine.intents.intend(view.settings, worker_id, claim, body.kind, body.payload, key=body.key,
                                     token_id=principal.token_id or None, **options)

    child = await _guarded(request, "intend", worker_id, intending)
    if child.status == "queued":
        request.app.state.work_signal.wake(child.queue)
    return record_json(child)


@router.post("/workers/{worker_id}/tasks/{task_id}/children",
             summary="Spawn a child task under the lease (ctx.spawn): the same child on every attempt")
async def spawn(body: SpawnBody, request: Request, task_id: int = TaskId,
                worker_id: str = WorkerId) -> dict[str, Any]:
    options = body.model_dump(exclude={"generation", "kind", "payload", "key"})
    claim = _attempt(worker_id, task_id, body.generation)

    def spawning(view: Queue) -> Op[Task]:
        # a child on another queue is an enqueue there: only on a queue the token may use
        if body.queue is not None:
            checks.check_name("queue", body.queue)
            access.authorize_spawn(request.state.principal, body.queue)
        return engine.children.spawn(view.settings, worker_id, claim, body.kind, body.payload, key=body.key,
                                     **options)

    child = await _guarded(request, "spawn", worker_id, spawning)
    if child.status == "queued":
        request.app.state.work_signal.wake(child.queue)
    return record_json(child)


@router.post("/workers/{worker_id}/tasks/{task_id}/children-wait",
             summary="Wait durably for child tasks: their outcome once all have ended, else end the attempt")
async def wait_children(body: ChildrenWaitBody, request: Request, task_id: int = TaskId,
                        worker_id: str = WorkerId) -> dict[str, Any]:
    claim = _attempt(worker_id, task_id, body.generation)
    answer = await _guarded(request, "wait", worker_id, lambda view: engine.children.wait_children(
        view.settings, worker_id, claim, body.key, body.children, timeout=body.timeout))
    return record_json(answer)


@router.post("/workers/{worker_id}/tasks/{task_id}/sleep",
             summary="Sleep durably: record the wait in the ledger and end the attempt until it is over")
async def sleep(body: SleepBody, request: Request, task_id: int = TaskId,
                worker_id: str = WorkerId) -> dict[str, Any]:
    claim = _attempt(worker_id, task_id, body.generation)
    answer = await _guarded(request, "wait", worker_id, lambda view: engine.durable.sleep(
        view.settings, worker_id, claim, body.key, seconds=body.seconds, until=body.until))
    return record_json(answer)


@router.post("/workers/{worker_id}/tasks/{task_id}/signal-wait",
             summary="Wait durably for a signal: consume a kept one, or end the attempt until one comes")
async def wait_signal(body: SignalWaitBody, request: Request, task_id: int = TaskId,
                      worker_id: str = WorkerId) -> dict[str, Any]:
    claim = _attempt(worker_id, task_id, body.generation)
    answer = await _guarded(request, "wait", worker_id, lambda view: engine.durable.wait_signal(
        view.settings, worker_id, claim, body.key, body.name, timeout=body.timeout, ask=body.ask))
    return record_json(answer)


@router.post("/workers/{worker_id}/tasks/{task_id}/stream",
             summary="Append an item to the task's stream (ctx.emit), under the lease")
async def emit(body: EmitBody, request: Request, task_id: int = TaskId,
               worker_id: str = WorkerId) -> dict[str, Any]:
    claim = _attempt(worker_id, task_id, body.generation)
    answer = await _guarded(request, "emit", worker_id, lambda view: engine.streams.emit(
        view.settings, worker_id, claim, body.item, key=body.key))
    if not answer["replayed"]:
        request.app.state.work_signal.wake_stream(task_id)  # its readers in this process look at once
    return answer


@router.post("/workers/{worker_id}/tasks/{task_id}/consume",
             summary="Charge the usage a call reported to a limit and the task's budget, recorded in the ledger")
async def consume(body: ConsumeBody, request: Request, task_id: int = TaskId,
                  worker_id: str = WorkerId) -> dict[str, Any]:
    claim = _attempt(worker_id, task_id, body.generation)
    answer = await _guarded(request, "consume", worker_id, lambda view: engine.budgets.consume(
        view.settings, worker_id, claim, body.key, body.limit_key, body.units))
    return record_json(answer)


@router.post("/workers/{worker_id}/tasks/{task_id}/loss", status_code=202,
             summary="Add the worker's own account of losing a lease to the evidence trail")
async def report_loss(body: LossBody, request: Request, task_id: int = TaskId,
                      worker_id: str = WorkerId) -> dict[str, Any]:
    claim = _attempt(worker_id, task_id, body.generation)
    await serve_operation(request, "report_loss", worker_id,
                          lambda view: engine.leases.report_loss(view.settings, worker_id, claim, body.reason))
    return {"recorded": True}
