"""The JSON API for everyone but the worker loop: enqueue and read, operator actions, admin.

Each route names its action in :data:`leaseq.access.ACTIONS` and
:func:`leaseq.access.authorize` decides. The operator action routes are built
from that table (:func:`_operator_route`), as are the dashboard's forms and
the CLI's commands; each goes through :func:`leaseq.access.perform`, whose
Queue method records the caller's identity in the task's evidence trail and
writes the audit entry in the action's own transaction.
"""

from __future__ import annotations

import asyncio
import inspect
from datetime import datetime, timedelta
from typing import Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import create_model

from .. import access
from ..core import checks
from ..signature import check_enqueue
from ..core.errors import InvalidInput, LeaseqError, NotFound, RateLimited
from ..engine.dependencies import check_after
from ..engine.enqueue import LONGEST
from ..core.model import StreamItem, Task
from ..engine.streams import Cursor, check_cursor
from ..aio import AsyncQueue
from ..queue import Queue
from .access import WORKER_ID_PATTERN, api_principal, need, room_to_wait
from .asks import present_ask, readable_asks
from .redrive import Where, act_where
from .views import (present_approval, present_effect, present_event, present_task, readable_approvals,
                    readable_overview, readable_tasks, task_timeline)
from .wakeups import WorkSignal, drawn_limit, follow_stream, wait_for_task
from .wire import REDACTED, record_json, sse_event, to_json
from .worker_api import Body, TaskId

router = APIRouter(prefix="/v1")
QueueName = Path(pattern=r"^[A-Za-z0-9_.:\-]{1,100}$", description="Queue name")
LimitKey = Path(description="Limit key")  # checked by the Queue method: a clear InvalidInput


class TaskOptions(Body):
    """The options POST /v1/tasks and POST /v1/tasks/batch share: each task's."""

    #: None: the effect the kind's worker declared (read_only when none did)
    effect: str | None = None
    queue: str = "default"
    #: true: skip the check against the kind's declaration (a kind served by workers elsewhere)
    no_check: bool = False
    priority: int = 0
    delay: float = 0
    max_attempts: int = 5
    lease_seconds: float = checks.DEFAULT_LEASE_SECONDS
    actions: list[str] | None = None
    #: the resource keys the task's effects may name (None: none)
    resources: list[str] | None = None
    timeout: float | None = None
    #: an ISO 8601 time with its offset: the latest time the task may start
    deadline: str | None = None
    #: the latest time the task may start as seconds after the enqueue, by the database's clock
    #: (not with ``deadline``)
    deadline_in: float | None = None
    after: list[int] | None = None
    on_dependency_failure: str = "cancel"
    limits: list[str] | None = None
    units: int = 1
    #: what the task may consume, by key, over all its attempts ({"tokens": 200000})
    budget: dict[str, int] | None = None
    fairness_key: str | None = None
    fairness_weight: float = 1.0


class EnqueueBody(TaskOptions):
    """POST /v1/tasks: one task."""

    kind: str
    payload: Any = None
    idempotency_key: str | None = None
    approval: Literal["required"] | None = None
    approval_deadline: float | None = None
    singleton_key: str | None = None
    on_conflict: str = "skip"
    debounce: float | None = None
    key: str | None = None
    debounce_mode: str = "trailing"
    max_delay: float | None = None


#: The most tasks one POST /v1/tasks/batch adds (a larger batch: 422, nothing written).
MAX_BATCH = 1000


class EnqueueManyBody(TaskOptions):
    """POST /v1/tasks/batch: :meth:`leaseq.Queue.enqueue_many` over HTTP. Tasks of one kind
    on one queue, one per payload, the other options shared by every task."""

    kind: str
    payloads: list[Any]
    #: one per payload (None: a fresh key), deduped as by a single enqueue
    idempotency_keys: list[str | None] | None = None


class LimitBody(Body):
    max_running: int | None = None
    per_second: float | None = None
    burst: float | None = None
    counts: str = "tasks"
    #: totals over fixed windows of the database's clock
    per_minute: int | None = None
    per_hour: int | None = None
    per_day: int | None = None


class TokenBody(Body):
    name: str
    role: Literal["worker", "viewer", "operator", "admin"]
    queues: list[str] | None = None
    #: a worker token without queues: the explicit opt-in to every queue
    all_queues: bool = False
    read_payloads: bool | None = None
    #: a worker token may record ungated intents on queues it claims from itself
    own_intents: bool = False
    expires_in: float | None = None


class PruneBody(Body):
    older_than_seconds: float
    payloads_older_than_seconds: float | None = None
    evidence_older_than_seconds: float | None = None
    streams_older_than_seconds: float | None = None


def _queue(request: Request) -> Queue:
    queue: Queue = request.app.state.queue
    return queue


def _deadline(text: str | None, seconds: float | None = None) -> datetime | timedelta | None:
    """An enqueue's ``deadline``: an ISO 8601 time (with its offset; the engine refuses one without),
    or ``deadline_in`` seconds after the enqueue (by the database's clock), as a timedelta."""
    if seconds is not None:
        if text is not None:
            raise InvalidInput("deadline_in", "give deadline or deadline_in, not both")
        return timedelta(seconds=checks.check_seconds("deadline_in", seconds, allow_zero=True, maximum=LONGEST))
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidInput("deadline", f"must be an ISO 8601 time such as 2030-01-31T09:00:00+00:00 "
                                       f"(got {text[:40]!r})") from None


# -- enqueue and read -----------------------------------------------------------------

@router.post("/tasks", status_code=201, tags=["tasks"], summary="Enqueue a task")
async def enqueue(body: EnqueueBody, request: Request,
                  principal: access.Principal = Depends(api_principal)) -> dict[str, Any]:
    # Awaited on the event loop on PostgreSQL (a thread on SQLite): the producers' hot call
    checks.check_name("queue", body.queue)
    access.authorize(principal, "enqueue", queue=body.queue)
    queue = AsyncQueue(_queue(request))
    if body.after and principal.queues is not None:  # a queue-limited token names tasks on its queues only
        upstreams = check_after(body.after, body.on_dependency_failure)
        access.authorize_upstreams(principal, upstreams, await _queues_of(queue, upstreams))
    effect = body.effect or "read_only"
    if not body.no_check:  # a payload that does not fit its kind's declared signature: 422, nothing written
        effect = check_enqueue(await queue.kind_declaration(body.kind), body.payload, body.effect)
    task = await queue.enqueue(body.kind, body.payload, effect=effect, queue=body.queue,
                                   idempotency_key=body.idempotency_key, priority=body.priority, delay=body.delay,
                                   max_attempts=body.max_attempts, lease_seconds=body.lease_seconds,
                                   actions=body.actions, timeout=body.timeout,
                                   deadline=_deadline(body.deadline, body.deadline_in),
                                   approval=body.approval, approval_deadline=body.approval_deadline,
                                   by=principal.actor, token_id=principal.token_id or None,
                                   # the caller's trace, which the task's spans join (an invalid header is
                                   # ignored, as W3C Trace Context says a receiver must)
                                   trace_context=checks.parse_traceparent(request.headers.get("traceparent")),
                                   after=body.after, on_dependency_failure=body.on_dependency_failure,
                                   limits=body.limits, units=body.units, resources=body.resources,
                                   singleton_key=body.singleton_key, on_conflict=body.on_conflict,
                                   debounce=body.debounce, key=body.key, debounce_mode=body.debounce_mode,
                                   max_delay=body.max_delay, budget=body.budget, fairness_key=body.fairness_key,
                                   fairness_weight=body.fairness_weight)
    if task.status == "queued":
        request.app.state.work_signal.wake(task.queue)  # claims waiting in this process look at once
    return present_task(task, principal)


@router.post("/tasks/batch", status_code=201, tags=["tasks"], summary="Enqueue many tasks of one kind at once")
async def enqueue_many(body: EnqueueManyBody, request: Request,
                       principal: access.Principal = Depends(api_principal)) -> dict[str, Any]:
    """Every task or none, in one transaction: :meth:`leaseq.Queue.enqueue_many` (the same
    operation). Answers ``{"task_ids": [...]}``, in the order of ``payloads``. A bad item is
    refused (422) naming its index (``payloads[3]``, ``idempotency_keys[1]``), nothing written."""
    checks.check_name("queue", body.queue)
    access.authorize(principal, "enqueue", queue=body.queue)  # the one queue every task of the batch is on
    if not body.payloads:
        raise InvalidInput("payloads", "is empty: give at least one payload")
    if len(body.payloads) > MAX_BATCH:
        raise InvalidInput("payloads", f"holds {len(body.payloads)} tasks; at most {MAX_BATCH} per batch")
    gate = request.app.state.access
    # a task's worth of the token's request rate for each task, the request itself paid for one:
    # a batch is no way around the rate a token may add tasks at one by one (a batch larger than
    # the bucket's burst costs the whole burst, so that it passes once the bucket is full)
    extra = min(len(body.payloads), gate.buckets.burst or len(body.payloads)) - 1
    if principal.token_id and extra > 0:
        gate.charge(principal, extra)
    queue = AsyncQueue(_queue(request))
    if body.after and principal.queues is not None:  # a queue-limited token names tasks on its queues only
        upstreams = check_after(body.after, body.on_dependency_failure)
        access.authorize_upstreams(principal, upstreams, await _queues_of(queue, upstreams))
    effect = body.effect or "read_only"
    if not body.no_check:  # each payload against its kind's declared signature: 422 naming it, nothing written
        declaration = await queue.kind_declaration(body.kind)
        for i, payload in enumerate(body.payloads):
            try:
                effect = check_enqueue(declaration, payload, body.effect)
            except InvalidInput as exc:
                raise InvalidInput(f"payloads[{i}].{exc.field}", exc.problem) from None
    ids = await queue.enqueue_many(body.kind, body.payloads, effect=effect, queue=body.queue,
                                   idempotency_keys=body.idempotency_keys, priority=body.priority,
                                   delay=body.delay, max_attempts=body.max_attempts,
                                   lease_seconds=body.lease_seconds, actions=body.actions, timeout=body.timeout,
                                   deadline=_deadline(body.deadline, body.deadline_in), after=body.after,
                                   on_dependency_failure=body.on_dependency_failure, limits=body.limits,
                                   units=body.units, resources=body.resources, fairness_key=body.fairness_key,
                                   fairness_weight=body.fairness_weight, budget=body.budget,
                                   # the caller's trace, as the single enqueue takes it
                                   trace_context=checks.parse_traceparent(request.headers.get("traceparent")))
    request.app.state.work_signal.wake(body.queue)  # claims waiting in this process look at once
    return {"task_ids": ids}


@router.get("/tasks/{task_id}/dependency-results", tags=["tasks"],
            summary="The results of the tasks a task waits (or waited) for")
def dependency_results(request: Request, task_id: int = TaskId,
                       principal: access.Principal = Depends(api_principal)) -> dict[str, Any]:
    # a worker token: for the tasks its own workers hold or have held (ctx.results() of a remote worker)
    access.authorize(principal, "read_task", task=task_id, facts=request.app.state.access)
    q = _queue(request)
    found = q.dependency_results(task_id)
    if principal.queues is not None:  # a queue-limited token: only the upstreams on its queues
        readable = access.readable_upstreams(principal, {upstream: q.get(upstream).queue for upstream in found})
        found = {upstream: result for upstream, result in found.items() if upstream in readable}
    return {"results": [{"task_id": upstream, "result": to_json(result) if principal.read_payloads or result is None
                         else REDACTED} for upstream, result in found.items()]}


async def _queues_of(queue: AsyncQueue, task_ids: list[int]) -> dict[int, str]:
    """The queue of each task of ``task_ids`` that exists."""
    found = {}
    for task_id in task_ids:
        try:
            found[task_id] = (await queue.get(task_id)).queue
        except NotFound:
            continue
    return found


@router.get("/tasks/{task_id}/wait", tags=["tasks"],
            summary="Wait (a long poll) until a task has ended or is parked for a person")
async def wait_task(request: Request, task_id: int = TaskId,
                    timeout: float = Query(25.0, ge=0, description="Seconds to wait at most (cut to the "
                                                                  "service's wait_limit)"),
                    _room: None = Depends(room_to_wait),
                    principal: access.Principal = Depends(api_principal)) -> dict[str, Any]:
    """``settled``: true when the task reached completed, dead, cancelled,
    needs_reconciliation, blocked, denied or expired; false when the time ran
    out first (the client asks again)."""
    await asyncio.to_thread(access.authorize, principal, "read_task", task=task_id, facts=request.app.state.access)
    # No connection of its own: the process's one listener wakes it (leaseq.service.wakeups),
    # and it counts against what the token may hold waiting (429 past it).
    signal: WorkSignal = request.app.state.work_signal
    with signal.slot(principal.token_id):
        task, settled = await wait_for_task(signal, task_id, min(timeout, drawn_limit(request.app.state.settings.wait_limit)),
                                            principal.token_id)
    return {"settled": settled, "task": present_task(task, principal)}


def _cursor_param(text: str | None, field: str) -> int | None:
    """A stream cursor given as text (a query parameter, a header): InvalidInput naming ``field``."""
    if text is None:
        return None
    value = text.strip()
    if not value.isdigit() or len(value) > 19:
        raise InvalidInput(field, f"must be a stream cursor, an integer 0 or more (got {text[:40]!r})")
    return check_cursor(int(value), field)


def _present_entry(item: StreamItem, principal: access.Principal) -> dict[str, Any]:
    data: dict[str, Any] = to_json(item)
    if item.type == "item" and not principal.read_payloads and item.item is not None:
        data["item"] = REDACTED
    return data


@router.get("/tasks/{task_id}/stream", tags=["tasks"],
            summary="A task's stream (ctx.emit) as server-sent events, resumable with Last-Event-ID")
async def task_stream(request: Request, task_id: int = TaskId,
                      after: str | None = Query(None, description="The cursor (an event's id) to begin after; "
                                                                  "Last-Event-ID wins when both are given"),
                      follow: bool = Query(True, description="Wait for new entries until the task has ended or "
                                                             "is parked for a person; false: what is there now"),
                      timeout: float | None = Query(None, ge=0, description="Seconds to follow at most (cut to "
                                                                            "the service's stream_seconds)"),
                      last_event_id: str | None = Header(None, alias="Last-Event-ID"),
                      _room: None = Depends(room_to_wait),
                      principal: access.Principal = Depends(api_principal)) -> StreamingResponse:
    """``text/event-stream``. Each entry is an event named ``item`` or ``reset`` whose ``id:``
    is its cursor (its ``seq``) and whose data is the entry as JSON (``task_id``, ``seq``,
    ``generation``, ``type``, ``item``, ``durable``, ``at``; ``item`` redacted for a token
    that may not read payloads). The response ends with ``event: end`` (data: the task's
    ``status``, ``settled``, and ``after``, the last cursor): the task has ended or is
    parked for a person and everything was sent, or, with ``follow=false``, everything
    there was; or with ``event: reconnect`` once it has followed for the service's
    ``stream_seconds`` or sent ``stream_items`` entries: ask again after the last id
    (an ``EventSource`` does so by itself, sending ``Last-Event-ID``)."""
    await asyncio.to_thread(access.authorize, principal, "read_task", task=task_id, facts=request.app.state.access)
    begin = _cursor_param(last_event_id, "Last-Event-ID")
    if begin is None:
        begin = _cursor_param(after, "after") or 0
    settings = request.app.state.settings
    longest = drawn_limit(settings.stream_seconds)
    cursor = Cursor(task_id, after=begin, follow=follow, timeout=longest if timeout is None else min(timeout, longest),
                    limit=settings.stream_items)
    queue = AsyncQueue(_queue(request))
    await queue.get(task_id)  # no such task: a 404, before the stream starts
    signal: WorkSignal = request.app.state.work_signal
    token_id = principal.token_id
    signal.check_room(token_id)  # one of the token's waiting requests: 429 past its cap, before it starts

    async def events() -> Any:
        last = begin
        request.app.state.task_streams += 1
        try:
            with signal.slot(token_id):
                yield "retry: 2000\n\n"
                entries = follow_stream(signal, cursor, token_id)
                try:
                    async for item in entries:
                        if item is None:
                            yield ": still here\n\n"
                            continue
                        last = item.seq
                        yield sse_event(item.type, _present_entry(item, principal), event_id=item.seq)
                finally:
                    await entries.aclose()
        except RateLimited as exc:  # another request took the token's last slot meanwhile
            yield f"retry: {int(exc.retry_after * 1000)}\n\n" + sse_event("reconnect", {"after": last})
            return
        except LeaseqError as exc:  # the task went (pruned) or the database is away: say so, and end
            yield sse_event("error", {"code": exc.code, "message": str(exc), "after": last})
            return
        finally:  # counted down once no statement of this stream is in flight
            request.app.state.task_streams -= 1
        if cursor.done:
            yield sse_event("end", {"task_id": task_id, "status": cursor.status, "settled": cursor.settled,
                                    "after": last})
        else:
            yield sse_event("reconnect", {"after": last})

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


class SignalBody(Body):
    payload: Any = None


@router.post("/tasks/{task_id}/signals/{signal}", tags=["tasks"],
             summary="Send a signal to a task (ctx.wait_for_signal returns its payload)")
def send_signal(request: Request, body: SignalBody | None = None, task_id: int = TaskId,
                signal: str = Path(description="Signal name"),
                principal: access.Principal = Depends(need("signal"))) -> dict[str, Any]:
    # the sender recorded is the token's principal; audited by Queue.signal
    sent = _queue(request).signal(task_id, signal, None if body is None else body.payload, by=principal.actor,
                                  via="api")
    if sent["woke"]:
        request.app.state.work_signal.wake(_queue(request).get(task_id).queue)
    answer: dict[str, Any] = to_json(sent)
    return answer


class AnswerBody(Body):
    answer: Any


@router.post("/tasks/{task_id}/answer", tags=["asks"],
             summary="Answer a task's question (ctx.ask returns the answer)")
def answer_question(body: AnswerBody, request: Request, task_id: int = TaskId,
                    principal: access.Principal = Depends(need("answer"))) -> dict[str, Any]:
    """The answer is checked against the question's schema first: one that does not fit is
    refused (422, naming the field) and changes nothing; a task that waits for no answer
    refuses it (409). The answerer recorded is the token's principal."""
    answered = _queue(request).answer(task_id, body.answer, by=principal.actor, via="api")
    if answered["woke"]:
        request.app.state.work_signal.wake(_queue(request).get(task_id).queue)
    result: dict[str, Any] = to_json(answered)
    return result


@router.get("/asks", tags=["asks"], summary="Questions put to a person that wait for an answer, oldest first")
def list_asks(request: Request, queue: str | None = Query(None), limit: int = Query(100, ge=1, le=1000),
              principal: access.Principal = Depends(api_principal)) -> dict[str, Any]:
    found = readable_asks(_queue(request), principal, queue=queue, limit=limit)  # its queues only
    return {"asks": [present_ask(a, principal) for a in found]}


@router.get("/tasks/{task_id}/signals", tags=["tasks"], summary="A task's signals, consumed or not")
def list_signals(request: Request, task_id: int = TaskId,
                 principal: access.Principal = Depends(need("read_signals"))) -> dict[str, Any]:
    signals: list[dict[str, Any]] = to_json(_queue(request).signals(task_id))
    if not principal.read_payloads:  # a signal's payload is user data (an answer to a question, too)
        for entry in signals:
            if entry.get("payload") is not None:
                entry["payload"] = REDACTED
    return {"signals": signals}


@router.get("/tasks/{task_id}", tags=["tasks"], summary="One task")
def get_task(request: Request, task_id: int = TaskId,
             principal: access.Principal = Depends(api_principal)) -> dict[str, Any]:
    # a worker token: only tasks its own workers hold or have held (403 for any other, existing or not)
    access.authorize(principal, "read_task", task=task_id, facts=request.app.state.access)
    return present_task(_queue(request).get(task_id), principal)


@router.get("/tasks", tags=["tasks"], summary="Tasks, newest first")
def list_tasks(request: Request, status: str | None = Query(None), queue: str | None = Query(None),
               limit: int = Query(100, ge=1, le=1000),
               principal: access.Principal = Depends(api_principal)) -> dict[str, Any]:
    # a queue-limited token: the tasks of its queues only (another queue named: 403)
    tasks = readable_tasks(_queue(request), principal, status=status, queue=queue, limit=limit)
    return {"tasks": [present_task(t, principal) for t in tasks]}


@router.get("/tasks/{task_id}/events", tags=["tasks"], summary="A task's evidence trail")
def task_events(request: Request, task_id: int = TaskId,
                principal: access.Principal = Depends(need("read_trail"))) -> dict[str, Any]:
    return {"events": [present_event(e, principal) for e in _queue(request).events(task_id)]}


@router.get("/tasks/{task_id}/effects", tags=["tasks"], summary="A task's action ledger")
def task_effects(request: Request, task_id: int = TaskId,
                 principal: access.Principal = Depends(need("read_trail"))) -> dict[str, Any]:
    return {"effects": [present_effect(fx, principal) for fx in _queue(request).effects(task_id)]}


@router.get("/tasks/{task_id}/timeline", tags=["tasks"], summary="The evidence trail by claim generation")
def timeline(request: Request, task_id: int = TaskId,
             principal: access.Principal = Depends(need("read_trail"))) -> dict[str, Any]:
    q = _queue(request)
    task = q.get(task_id)
    return task_timeline(task, q.events(task_id), q.effects(task_id), principal, q.stream_stats(task_id))


@router.get("/approvals", tags=["approvals"], summary="Tasks awaiting approval, oldest first, with their digests")
def approvals(request: Request, queue: str | None = Query(None), limit: int = Query(100, ge=1, le=1000),
              principal: access.Principal = Depends(api_principal)) -> dict[str, Any]:
    found = readable_approvals(_queue(request), principal, queue=queue, limit=limit)  # its queues only
    return {"approvals": [present_approval(a, principal) for a in found]}


@router.get("/tasks/{task_id}/approval", tags=["approvals"], summary="A task's approval request and decision")
def task_approval(request: Request, task_id: int = TaskId,
                  principal: access.Principal = Depends(need("read_trail"))) -> dict[str, Any]:
    return present_approval(_queue(request).approval(task_id), principal)


@router.get("/queues", tags=["queues"], summary="Counts by status, oldest queued age, paused state")
def queues(request: Request, principal: access.Principal = Depends(need("read_queues"))) -> dict[str, Any]:
    return {"queues": readable_overview(_queue(request), principal)}  # a queue-limited token: its queues only


@router.get("/workers", tags=["workers"], summary="Registered workers and the leases they hold")
def workers(request: Request, principal: access.Principal = Depends(need("read"))) -> dict[str, Any]:
    return {"workers": to_json(_queue(request).workers())}


@router.get("/limits", tags=["limits"], summary="Every limit with its usage")
def limits(request: Request, principal: access.Principal = Depends(need("read"))) -> dict[str, Any]:
    return {"limits": to_json(_queue(request).limits())}


@router.get("/limits/spend", tags=["limits"],
            summary="Usage settled after the call (ctx.consume), per key and UTC day, newest first")
def limit_spend(request: Request, key: str | None = Query(None), days: int = Query(7, ge=1, le=3660),
                principal: access.Principal = Depends(need("read"))) -> dict[str, Any]:
    return {"spend": to_json(_queue(request).limit_spend(key, days=days))}


def _where(request: Request, principal: access.Principal, action: str, body: Where) -> dict[str, Any]:
    return act_where(_queue(request), principal, action, body, dry_run=body.dry_run, via="api")


@router.post("/tasks/redrive", tags=["tasks"], summary="Requeue dead (or blocked) tasks matching a filter")
def redrive(body: Where, request: Request,
            principal: access.Principal = Depends(api_principal)) -> dict[str, Any]:
    # audited by Queue.redrive: each task, and the whole, in its one transaction
    return _where(request, principal, "redrive", body)


@router.post("/tasks/cancel-where", tags=["tasks"], summary="Cancel the tasks matching a filter")
def cancel_where(body: Where, request: Request,
                 principal: access.Principal = Depends(api_principal)) -> dict[str, Any]:
    return _where(request, principal, "cancel_where", body)


@router.put("/limits/{key}", tags=["limits"], summary="Create or change a limit shared by every worker")
def set_limit(body: LimitBody, request: Request, key: str = LimitKey,
              principal: access.Principal = Depends(need("set_limit"))) -> dict[str, Any]:
    # audited by Queue.set_limit, in its own transaction
    return record_json(_queue(request).set_limit(key, max_running=body.max_running, per_second=body.per_second,
                                                 burst=body.burst, counts=body.counts, per_minute=body.per_minute,
                                                 per_hour=body.per_hour, per_day=body.per_day, by=principal.actor,
                                                 via="api"))


@router.delete("/limits/{key}", tags=["limits"], summary="Remove a limit")
def delete_limit(request: Request, key: str = LimitKey,
                 principal: access.Principal = Depends(need("delete_limit"))) -> dict[str, Any]:
    _queue(request).delete_limit(key, by=principal.actor, via="api")
    return {"key": key, "deleted": True}


@router.get("/whoami", tags=["access"], summary="The calling token's identity and rights")
def whoami(principal: access.Principal = Depends(need("whoami"))) -> dict[str, Any]:
    return {"token_id": principal.token_id, "name": principal.name, "role": principal.role,
            "queues": sorted(principal.queues) if principal.queues is not None else None,
            "read_payloads": principal.read_payloads, "rights": sorted(access.RIGHTS[principal.role]),
            "actions": sorted(name for name in access.ACTIONS if principal.can(name)),
            "expires_at": to_json(principal.expires_at)}


# -- operator actions: one route per entry of the action table -------------------------

_TARGETS: dict[str, tuple[str, Any, Any]] = {
    "task": ("task_id", int, TaskId),
    "queue": ("name", str, QueueName),
    "worker": ("worker_id", str, Path(pattern=WORKER_ID_PATTERN, description="Worker id")),
}


def _body_model(spec: access.Action) -> Any:
    """The request body of an operator action, from its fields (None if it has none)."""
    if not spec.fields:
        return None
    fields: dict[str, Any] = {}
    for f in spec.fields:
        if f.flag:  # a JSON boolean; left out: the default
            fields[f.name] = (bool, f.default)
            continue
        kind: Any = Any if f.json else Literal[tuple(v for v, _ in f.choices)] if f.choices else str
        fields[f.name] = (kind, ...) if f.required else (kind | None if not f.json else kind, f.default)
    return create_model(f"{spec.name.title().replace('_', '')}Body", __base__=Body, **fields)


def _operator_route(spec: access.Action) -> None:
    """Add the POST route of one operator action: authorize, perform (audited), present."""
    model = _body_model(spec)
    target, annotation, default = _TARGETS[spec.target or ""]
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("request", kw, annotation=Request),
              inspect.Parameter(target, kw, annotation=annotation, default=default),
              inspect.Parameter("principal", kw, annotation=access.Principal, default=Depends(need(spec.name)))]
    if model is not None:
        optional = not any(f.required for f in spec.fields)  # then the body itself may be left out
        params.append(inspect.Parameter("body", kw, annotation=model | None if optional else model,
                                        default=None if optional else inspect.Parameter.empty))

    def endpoint(request: Request, principal: access.Principal, body: Any = None, **path: Any) -> Any:
        given = body.model_dump(exclude_unset=True) if body is not None else {}
        result = access.perform(_queue(request), principal, spec.name, path[target], via="api", **given)
        return present_task(result, principal) if isinstance(result, Task) else to_json(result)

    endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    endpoint.__name__ = spec.name
    router.add_api_route(spec.route, endpoint, methods=["POST"], tags=["operator"], summary=spec.title,
                         description=spec.help or None)


for _spec in access.operator_actions():
    _operator_route(_spec)


# -- admin -----------------------------------------------------------------------------

@router.get("/tokens", tags=["admin"], summary="Every token (never a secret)")
def list_tokens(request: Request, principal: access.Principal = Depends(need("list_tokens"))) -> dict[str, Any]:
    return {"tokens": to_json(access.list_tokens(_queue(request)))}


@router.post("/tokens", status_code=201, tags=["admin"], summary="Create a token; it is shown once")
def create_token(body: TokenBody, request: Request,
                 principal: access.Principal = Depends(need("create_token"))) -> dict[str, Any]:
    token, record = access.create_token(_queue(request), name=body.name, role=body.role, queues=body.queues,
                                      all_queues=body.all_queues, read_payloads=body.read_payloads,
                                      own_intents=body.own_intents, expires_in=body.expires_in,
                                      created_by=principal.actor)
    return {"token": token, **to_json(record)}


@router.delete("/tokens/{token_id}", tags=["admin"], summary="Revoke a token and its workers")
def revoke_token(request: Request, token_id: str = Path(pattern=r"^[0-9a-f]{12}$"),
                 principal: access.Principal = Depends(need("revoke_token"))) -> dict[str, Any]:
    workers_ = access.revoke_token(_queue(request), token_id, by=principal.actor)
    return {"token_id": token_id, "revoked": True, "revoked_workers": workers_}


@router.post("/prune", tags=["admin"], summary="Apply retention now")
def prune(body: PruneBody, request: Request, principal: access.Principal = Depends(need("prune"))) -> dict[str, Any]:
    # audited by Queue.prune, each batch in its own transaction
    return _queue(request).prune(body.older_than_seconds, payloads_older_than_seconds=body.payloads_older_than_seconds,
                                 evidence_older_than_seconds=body.evidence_older_than_seconds,
                                 streams_older_than_seconds=body.streams_older_than_seconds,
                                 by=principal.actor, via="api")


@router.get("/audit", tags=["admin"], summary="The newest audit entries")
def audit(request: Request, limit: int = Query(100, ge=1, le=10_000),
          principal: access.Principal = Depends(need("read_audit"))) -> dict[str, Any]:
    return {"entries": to_json(access.audit_log(_queue(request), limit))}

