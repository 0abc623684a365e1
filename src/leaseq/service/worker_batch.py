"""The worker API's hot path: batched calls and long-poll claims, one transaction per request.

Each request here is served by one database transaction that also checks
the caller's token (:func:`in_one_transaction`): the token, the worker's
link to it and the operation commit together, in one round trip from the
worker. The operations are :class:`leaseq.Queue`'s own, run on a joined
view (:meth:`leaseq.Queue.joined`), so every lease guard applies per task
exactly as on the direct path; nothing here decides a lease question. On
PostgreSQL, claims, renewals and completions run on the event loop with the asyncio
driver (:func:`ain_one_transaction`, :meth:`leaseq.Queue.ajoined`: the same
checks and the same operations, awaited); elsewhere, in a thread.

* ``claim`` leases up to ``limit`` tasks and may wait (``wait`` seconds,
  capped by the service) for work to arrive: woken by LISTEN/NOTIFY on
  PostgreSQL, by enqueues through this process, or a short re-check
  (:mod:`.wakeups`). Each attempt is one transaction, or, on PostgreSQL,
  three when expired leases must be routed first: the claim's one
  statement finds them, a transaction of its own routes a batch (giving
  limit slots back), and the claim runs again. Routing and claiming in one
  transaction would take limit rows out of key order.
* ``complete`` may also ask for more work (``claim``): after the
  completions, in the same transaction (the claim authorized for its
  queue), up to ``claim.limit`` tasks are leased and returned with the
  answer: one round trip and one commit per batch instead of two. Where
  the claim would have to wait for a lock out of the order other
  transactions take them in (the completions gave limit slots back, or
  expired leases wait to be routed), it follows in a transaction of its
  own once the completions committed
  (:func:`leaseq.engine.leases.complete_and_claim`). The claim never waits
  for work, and its refusal or failure (a refused queue, an outage) never
  undoes the completions: it is reported in ``claim_error`` and the worker
  claims on its own.
* ``end`` ends many attempts, each its own way (``outcome``: complete, fail,
  retry or release, with that outcome's fields): the engine's one
  :func:`leaseq.engine.endings.end_attempts`, the completions in one statement.
* ``renew``, ``complete``, ``fail`` and ``end`` take many leases at once. A lease the
  guard refuses is reported in ``refused`` (``lease_lost``) and the others
  go through: a partly refused batch is not an error. Bad input (an
  oversized batch, a task named twice, an unusable value) refuses the whole
  request with 422 naming the field, and changes nothing.

Each leased, finished or refused task is logged on ``leaseq.service.worker``
with its task id, kind (where known), generation, worker and the request's
duration as record fields (``leaseq serve --log-format json`` prints them):
claims and completions at DEBUG, failed attempts and refused leases at INFO.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from ..core import checks
from ..core.errors import InvalidInput, LeaseLost, LeaseqError
from ..core.model import AttemptRef, Claim, Claims, Ended, Ending
from .. import engine
from ..engine.leases import MAX_CLAIM, check_kinds
from ..engine.steps import Op, T
from ..queue import Queue
from .access import authorize_also, in_one_transaction, room_to_wait, serve_operation
from .metrics import ServiceMetrics, span
from .wakeups import WorkSignal, drawn_limit
from .wire import to_json
from .worker_api import Body, Item, WorkerId, _log, logger

router = APIRouter(prefix="/v1", tags=["worker"])

#: Most leases one complete or fail request may name.
MAX_BATCH = 1000
#: Most leases one renew request may name.
MAX_RENEW = 10_000


def _json(content: dict[str, Any]) -> JSONResponse:
    # The content is plain JSON data already (wire.to_json): answering with a
    # response skips FastAPI's recursive re-encoding of every claim's task.
    return JSONResponse(content)


def _metrics(request: Request) -> ServiceMetrics:
    metrics: ServiceMetrics = request.app.state.metrics
    return metrics


def _signal(request: Request) -> WorkSignal:
    signal: WorkSignal = request.app.state.work_signal
    return signal


#: Batches of expired leases a claim routes, each in a transaction of its own, before it
#: answers with nothing (engine.expiry.ROUTE_BATCH a batch; the worker claims again).
ROUTING_PASSES = 5


async def _claim_tasks(request: Request, worker_id: str, queue: str, limit: int, lease_seconds: float | None,
                       kinds: list[str] | None, *, charge: bool = True) -> Claims:
    """The claim, in the request's transaction with its token check.

    Where it must first route expired leases, the routing runs in a transaction of
    its own, then the claim again (:func:`leaseq.engine.leases.try_claim`): routing
    gives limit slots back, locking their rows, and a transaction holding those
    while its claim locks others would take limit rows out of the key order every
    claim takes them in, a deadlock against one taking them in order. (SQLite, which
    waits for no row lock, claims whole at the first pass.)
    """

    def claiming(view: Queue) -> Op[Claims | None]:
        return engine.leases.try_claim(view.settings, worker_id, queue=queue, limit=limit,
                                       lease_seconds=lease_seconds, kinds=kinds)

    for _ in range(ROUTING_PASSES):
        claims = await serve_operation(request, "claim", worker_id, claiming, queue=queue, charge=charge)
        if claims is not None:
            return claims
        charge = False  # the request is one
        await serve_operation(request, "claim", worker_id,
                              lambda view: engine.leases.route_for_claim(view.settings, worker_id, queue), queue=queue,
                              charge=False)
    return Claims()


def _completing(worker_id: str, done: list[tuple[AttemptRef, Any]]) -> Callable[[Queue], Op[set[int]]]:
    """The completions operation, for :func:`.access.serve_operation`."""
    return lambda view: engine.leases.complete_many(view.settings, worker_id, done, results_checked=True)


def _refusal(task_id: int, generation: int, reason: str) -> dict[str, Any]:
    return {"task_id": task_id, "generation": generation, "code": LeaseLost.code, "reason": reason}


def _no_repeats(field: str, task_ids: list[int]) -> None:
    seen: set[int] = set()
    for i, task_id in enumerate(task_ids):
        if task_id in seen:
            raise InvalidInput(f"{field}.{i}.task_id", f"names task {task_id} twice in one request")
        seen.add(task_id)


# -- claim, with a long poll -------------------------------------------------------------

class ClaimBody(Body):
    queue: str = "default"
    limit: int = 1
    lease_seconds: float | None = None
    #: only tasks of these kinds (the kinds the worker has handlers for); absent: any kind
    kinds: list[str] | None = None
    #: seconds to wait for work when none is due (capped by the service's ``claim_wait_limit``)
    wait: float = Field(0.0, ge=0, allow_inf_nan=False)


@router.post("/workers/{worker_id}/claim", summary="Lease up to `limit` due tasks, waiting up to `wait` s for some")
async def claim(body: ClaimBody, request: Request, worker_id: str = WorkerId) -> JSONResponse:
    checks.check_name("queue", body.queue)
    metrics, signal = _metrics(request), _signal(request)
    wait = min(body.wait, drawn_limit(request.app.state.settings.claim_wait_limit))
    if wait > 0:
        await room_to_wait(request)  # a token at its cap of waits: refused before any claim runs
    deadline = time.monotonic() + wait

    with signal.waiter(body.queue, worker_id) as waiter, ExitStack() as holding:
        attempts = 0
        while True:
            started = time.perf_counter()
            # Every attempt checks the token again (it may have been revoked meanwhile). The
            # first is charged to the token's rate bucket as the request; each later look
            # is charged by signal.paced, which waits while the bucket is empty.
            with span("leaseq.claim", queue=body.queue, worker_id=worker_id, limit=body.limit):
                claims = await _claim_tasks(request, worker_id, body.queue, body.limit, body.lease_seconds,
                                            body.kinds, charge=attempts == 0)
            attempts += 1
            metrics.claim_latency.observe(time.perf_counter() - started)
            left = deadline - time.monotonic()
            if claims or left <= 0 or waiter.interrupted:
                break
            token_id = request.state.principal.token_id
            if attempts == 1:  # it waits: one of the token's waiting requests (429 past the cap; nothing leased)
                holding.enter_context(signal.slot(token_id))
            # an empty rate bucket refills by the clock, with no notification: look again when it has a token
            hint = claims.limit_wait if isinstance(claims, Claims) else None
            await waiter.wait(min(left, signal.recheck) if hint is None else min(left, signal.recheck, max(0.02, hint)))
            if waiter.interrupted or await request.is_disconnected():
                break  # nobody to hand a lease to: claim nothing more
            if not await signal.paced(token_id, deadline):
                break  # the token's bucket stayed empty until the wait's end
    return _json(_claimed(metrics, worker_id, body.queue, claims, started))


def _claimed(metrics: ServiceMetrics, worker_id: str, queue: str, claims: list[Claim],
             started: float) -> dict[str, Any]:
    """The answer's part for a claim: the leases (counted and logged), and how long
    an empty rate bucket needs when the claim came back short."""
    if claims:
        metrics.claims.labels(queue=queue).inc(len(claims))
        for c in claims:
            _log(logging.DEBUG, "claimed", worker_id, started, c.task_id, c.generation, c.task.kind)
    answer: dict[str, Any] = {"claims": to_json(claims)}
    if isinstance(claims, Claims) and claims.limit_wait is not None:
        answer["limit_wait"] = claims.limit_wait
    return answer


@router.post("/workers/{worker_id}/claim/interrupt", summary="End this worker's waiting claims, empty-handed")
async def interrupt_claims(request: Request, worker_id: str = WorkerId) -> JSONResponse:
    # The worker is shutting down: its long polls return at once and lease nothing more,
    # here and (where the database notifies) in every other process serving it.
    def broadcast(view: Queue) -> None:
        with view.store.transaction() as tx:
            tx.rows("notify_interrupt", worker_id=worker_id)

    await run_in_threadpool(in_one_transaction, request, "renew", worker_id, broadcast)
    return _json({"interrupted": _signal(request).interrupt(worker_id)})


# -- renew ------------------------------------------------------------------------------

class Lease(Item):
    task_id: int = Field(ge=1, le=2**63 - 1)
    generation: int = Field(ge=0, le=2**63 - 1)


class RenewBody(Body):
    leases: list[Lease] = Field(max_length=MAX_RENEW)


@router.post("/workers/{worker_id}/renew", summary="Renew many leases in one guarded statement")
async def renew(body: RenewBody, request: Request, worker_id: str = WorkerId) -> JSONResponse:
    started = time.perf_counter()
    claims = [AttemptRef(ref.task_id, ref.generation, worker_id) for ref in body.leases]
    _no_repeats("leases", [c.task_id for c in claims])
    renewed = await serve_operation(request, "renew", worker_id,
                                    lambda view: engine.leases.renew_leases(view.settings, worker_id, claims))
    metrics = _metrics(request)
    metrics.heartbeat_latency.observe(time.perf_counter() - started)
    metrics.lost("heartbeat", len(claims) - len(renewed))
    for c in claims:
        if c.task_id not in renewed:
            _log(logging.INFO, "renewal refused: lease no longer held", worker_id, started, c.task_id, c.generation)
    return _json({"renewed": [{"task_id": tid, "expires_at": at.isoformat()} for tid, at in renewed.items()]})


# -- complete and fail many ---------------------------------------------------------------

class Completion(Item):
    task_id: int = Field(ge=1, le=2**63 - 1)
    generation: int = Field(ge=0, le=2**63 - 1)
    result: Any = None


class ClaimMore(Item):
    """More work asked for with a batch of completions (never waits)."""

    queue: str = "default"
    limit: int = Field(ge=1, le=MAX_CLAIM)
    lease_seconds: float | None = None
    kinds: list[str] | None = None


class CompleteManyBody(Body):
    tasks: list[Completion] = Field(max_length=MAX_BATCH)
    #: lease up to this many more tasks once the completions are written
    claim: ClaimMore | None = None


@router.post("/workers/{worker_id}/complete", summary="Finish many tasks under their leases, in one statement "
                                                      "(and, with `claim`, lease more)")
async def complete_many(body: CompleteManyBody, request: Request, worker_id: str = WorkerId) -> JSONResponse:
    started = time.perf_counter()
    _no_repeats("tasks", [t.task_id for t in body.tasks])
    for i, t in enumerate(body.tasks):
        checks.check_json(f"tasks.{i}.result", t.result)
    more = body.claim
    if more is not None:  # the whole request is checked before anything is written
        try:
            checks.check_name("queue", more.queue)
            if more.lease_seconds is not None:
                checks.check_seconds("lease_seconds", more.lease_seconds, allow_zero=False)
            check_kinds(more.kinds)
        except InvalidInput as exc:
            raise InvalidInput(f"claim.{exc.field}", exc.problem) from None
    done = [(AttemptRef(t.task_id, t.generation, worker_id), t.result) for t in body.tasks]
    claimed: dict[str, Any] = {}
    if more is None:
        completed = await serve_operation(request, "complete", worker_id, _completing(worker_id, done))
    else:
        completed, claimed = await _complete_and_claim(request, worker_id, done, more)
    refused = [_refusal(t.task_id, t.generation, "complete refused: lease no longer held")
               for t in body.tasks if t.task_id not in completed]
    _metrics(request).lost("complete", len(refused))
    for t in body.tasks:
        if t.task_id in completed:
            _log(logging.DEBUG, "completed", worker_id, started, t.task_id, t.generation)
        else:
            _log(logging.INFO, "complete refused: lease no longer held", worker_id, started, t.task_id, t.generation)
    return _json({"completed": sorted(completed), "refused": refused, **claimed})


async def _complete_and_claim(request: Request, worker_id: str, done: list[tuple[AttemptRef, Any]],
                              more: ClaimMore) -> tuple[set[int], dict[str, Any]]:
    """The completions and the claim asked for with them: in one transaction, one commit,
    where the claim can wait for no lock out of order (:func:`leaseq.engine.leases.complete_and_claim`
    says where); else the claim follows in a transaction of its own. Its refusal or
    failure never undoes the completions: it is reported in the answer's ``claim_error``."""
    started = time.perf_counter()
    refusal: LeaseqError | None = None

    def operation(view: Queue) -> Op[tuple[set[int], Claims | None]]:
        nonlocal refusal
        ask: dict[str, Any] | None = dict(queue=more.queue, limit=more.limit, lease_seconds=more.lease_seconds,
                                          kinds=more.kinds)
        try:
            authorize_also(request, "claim", worker_id, more.queue)
        except LeaseqError as exc:  # nothing is written yet: the completions still commit
            refusal, ask = exc, None
        return engine.leases.complete_and_claim(view.settings, worker_id, done, ask, results_checked=True)

    try:
        with span("leaseq.claim", queue=more.queue, worker_id=worker_id, limit=more.limit):
            completed, claims = await serve_operation(request, "complete", worker_id, operation)
    except engine.leases.ClaimFailed as failed:  # rolled back with the completions: those again, alone
        completed = await serve_operation(request, "complete", worker_id, _completing(worker_id, done),
                                          charge=False)
        return completed, _claim_error(worker_id, failed.cause)
    if refusal is not None:
        return completed, _claim_error(worker_id, refusal)
    if claims is None:  # left to a transaction of its own, now that the completions committed
        return completed, await _claim_more(request, worker_id, more)
    metrics = _metrics(request)
    metrics.claim_latency.observe(time.perf_counter() - started)
    return completed, _claimed(metrics, worker_id, more.queue, claims, started)


async def _claim_more(request: Request, worker_id: str, more: ClaimMore) -> dict[str, Any]:
    """The claim asked for with completions, in a transaction of its own: the answer's
    part for it. Its refusal or failure is reported there, never raised."""
    started = time.perf_counter()
    try:
        claims = await _claim_tasks(request, worker_id, more.queue, more.limit, more.lease_seconds, more.kinds,
                                    charge=False)
    except Exception as exc:  # the worker's own claim meets it again, and decides
        return _claim_error(worker_id, exc)
    metrics = _metrics(request)
    metrics.claim_latency.observe(time.perf_counter() - started)
    return _claimed(metrics, worker_id, more.queue, claims, started)


def _claim_error(worker_id: str, exc: Exception) -> dict[str, Any]:
    """The answer's part for a claim with completions that was refused or failed."""
    if isinstance(exc, LeaseqError):  # the queue's answer (or trouble reaching it): the worker decides
        code = exc.code
        logger.info("worker %s: claim with completions failed: %r", worker_id, exc)
    else:  # no error raised on purpose: a bug, logged as the service logs any other
        code = "internal_error"
        logger.error("worker %s: claim with completions raised %r", worker_id, exc, exc_info=exc)
    return {"claims": [], "claim_error": {"code": code, "message": str(exc)}}


class Failure(Item):
    task_id: int = Field(ge=1, le=2**63 - 1)
    generation: int = Field(ge=0, le=2**63 - 1)
    error: str
    retry: bool = True
    block: bool = False
    delay: float | None = None


class FailManyBody(Body):
    tasks: list[Failure] = Field(max_length=MAX_BATCH)


def _failing_many(worker_id: str, tasks: list[Failure]) -> Callable[[Queue], Op[tuple[list[Ended], list[AttemptRef]]]]:
    """The failures, one guarded statement each, in one transaction
    (:func:`leaseq.engine.endings.end_attempts`): a refused one is left out (the guard
    wrote nothing) and the others go through. No task is read first: the default
    backoff is the guarded statement's own."""
    endings = [Ending(AttemptRef(t.task_id, t.generation, worker_id), "fail", error=t.error, retry=t.retry,
                      block=t.block, delay=t.delay) for t in tasks]
    return lambda view: engine.endings.end_attempts(view.settings, worker_id, endings, field="tasks")


@router.post("/workers/{worker_id}/fail", summary="End many attempts with their errors, in one transaction")
async def fail_many(body: FailManyBody, request: Request, worker_id: str = WorkerId) -> JSONResponse:
    started = time.perf_counter()
    _no_repeats("tasks", [t.task_id for t in body.tasks])  # each failure is checked by end_attempts

    ended, lost = await serve_operation(request, "fail", worker_id, _failing_many(worker_id, body.tasks))
    failed = [e.task for e in ended if e.task is not None]
    refused = [_refusal(r.task_id, r.generation, "fail refused: lease no longer held") for r in lost]
    _metrics(request).lost("fail", len(refused))
    for task in failed:
        _log(logging.INFO, f"failed -> {task.status}", worker_id, started, task.id, task.claim_generation, task.kind)
    for r in refused:
        _log(logging.INFO, "fail refused: lease no longer held", worker_id, started, r["task_id"], r["generation"])
    return _json({"failed": to_json(failed), "refused": refused})



# -- end many attempts, each its own way --------------------------------------------------------

#: The action each outcome is authorized as (a retry on request is a failure's).
_ACTION_OF = {"complete": "complete", "fail": "fail", "retry": "fail", "release": "release"}
#: Each outcome's fields' values when the request leaves them out (Queue's own defaults).
_REASON = {"retry": "retry requested", "release": "released"}


class AttemptEnd(Item):
    """One attempt and how it ends: ``outcome`` and that outcome's fields (see
    :class:`leaseq.engine.endings.Ending`); a field of another outcome is refused."""

    task_id: int = Field(ge=1, le=2**63 - 1)
    generation: int = Field(ge=0, le=2**63 - 1)
    outcome: Literal["complete", "fail", "retry", "release"]
    #: complete: the task's result
    result: Any = None
    #: fail: the error (required)
    error: str | None = None
    retry: bool = True
    block: bool = False
    #: fail: seconds before the next attempt (absent: the queue's backoff)
    delay: float | None = None
    #: retry: seconds before the task runs again
    after: float = 0.0
    #: retry, release: why (defaults "retry requested", "released")
    reason: str | None = None
    #: release: false when the handler never began (the attempt is given back)
    started: bool = True


class EndBody(Body):
    attempts: list[AttemptEnd] = Field(max_length=MAX_BATCH)


@router.post("/workers/{worker_id}/end", summary="End many attempts, each as completed, failed, retried or "
                                                 "released, in one transaction")
async def end_attempts(body: EndBody, request: Request, worker_id: str = WorkerId) -> JSONResponse:
    started = time.perf_counter()
    _no_repeats("attempts", [a.task_id for a in body.attempts])
    endings = [Ending(AttemptRef(a.task_id, a.generation, worker_id), a.outcome, result=a.result, error=a.error,
                      retry=a.retry, block=a.block, delay=a.delay, after=a.after,
                      reason=_REASON.get(a.outcome) if a.reason is None else a.reason, started=a.started)
               for a in body.attempts]
    actions = sorted({_ACTION_OF[a.outcome] for a in body.attempts}) or ["complete"]

    def operation(view: Queue) -> Op[tuple[list[Ended], list[AttemptRef]]]:
        for action in actions[1:]:  # the first is the request's own, authorized with its token
            authorize_also(request, action, worker_id, None)
        return engine.endings.end_attempts(view.settings, worker_id, endings, field="attempts")

    ended, lost = await serve_operation(request, actions[0], worker_id, operation)
    outcome_of = {a.task_id: a.outcome for a in body.attempts}
    refused = [_refusal(r.task_id, r.generation, f"{outcome_of[r.task_id]} refused: lease no longer held")
               for r in lost]
    metrics = _metrics(request)
    for r in lost:
        metrics.lost(_ACTION_OF[outcome_of[r.task_id]])
        _log(logging.INFO, f"{outcome_of[r.task_id]} refused: lease no longer held", worker_id, started, r.task_id,
             r.generation)
    answer = []
    for e in ended:
        if e.task is None:
            _log(logging.DEBUG, "completed", worker_id, started, e.task_id, e.generation)
        else:
            _log(logging.INFO if e.outcome == "fail" else logging.DEBUG, f"{e.outcome} -> {e.task.status}",
                 worker_id, started, e.task_id, e.generation, e.task.kind)
            if e.task.status == "queued":
                _signal(request).wake(e.task.queue)
        answer.append({"task_id": e.task_id, "generation": e.generation, "outcome": e.outcome,
                       "task": None if e.task is None else to_json(e.task)})
    return _json({"ended": answer, "refused": refused})
