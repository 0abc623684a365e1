"""WorkerRuntime: holds leases honestly and stops acting the moment it loses one.

One asyncio loop per worker process runs:

* the claim loop: claims in batches up to free capacity, then waits for a
  wake-up (a finished handler, a PostgreSQL notification, or the poll
  interval). A claim that fails in transit is retried with backoff; one the
  queue refuses for good (a revoked worker, a refused credential) stops
  claiming and goes through the graceful shutdown;
* the renewer (:mod:`.renewer`): every held lease in one guarded call per tick;
* handlers: async ones as tasks on the loop, sync ones in a thread pool;
* the completer (:mod:`.completer`): records each outcome, retrying through
  outages for as long as the lease lasts, never charging the handler for
  the infrastructure's trouble;
* shutdown: stop claiming, let running tasks finish within a grace period,
  then release the rest through the recovery policy.

The runtime talks to a *transport* (:mod:`.transport`) and reads what it can
do from its declared capabilities; it runs the handlers of a registry
(:mod:`.registry`). The lease rules live behind the transport, never here.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..auth import AccessDenied
from ..core.errors import InvalidInput, LeaseLost, LeaseqError, Permanent, QueuePaused, UnknownWorker
from ..core.model import Claim, Worker
from ..observability.hooks import TaskLog, WorkerObserver
from .completer import INITIAL_BACKOFF, Completer, Outcome, Verdict, next_backoff
from .context import TaskContext
from .registry import HandlerSource, Registry
from .renewer import Renewer, wait_event
from .transport import Capabilities, Transport

logger = logging.getLogger("leaseq.worker")

#: The longest pause between claims that failed in transit.
MAX_CLAIM_BACKOFF = 5.0
#: How long shutdown keeps trying to release a lease before leaving it to expire.
RELEASE_BUDGET = 5.0
#: How long the listener waits before reconnecting after its connection dropped.
LISTENER_RETRY = 0.5

__all__ = ["Transport", "WorkerRuntime", "WorkerStats"]


@dataclass
class WorkerStats:
    """Counters of one runtime, for progress lines, metrics and tests."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0
    renewals: int = 0
    #: outcomes whose write was refused after an earlier try failed in transit:
    #: that try may have been written (the task's row says which)
    unconfirmed: int = 0
    #: claims that failed in transit (and were retried), and outcomes the
    #: infrastructure kept from being recorded before their lease ended
    transient_errors: int = 0
    started_at: float = field(default_factory=time.monotonic)
    lost_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Completed tasks per second since start."""
        return self.completed / max(1e-9, time.monotonic() - self.started_at)


class WorkerRuntime:
    """Runs the handlers of an :class:`~leaseq.App` (or a :class:`Registry`) under real leases.

    ``handlers`` is the app (whose queue is the default transport) or a bare
    registry (then ``transport`` is required).
    """

    def __init__(self, handlers: HandlerSource | Registry, transport: Transport | None = None, *,
                 queues: list[str] | None = None, concurrency: int = 10, name: str = "worker",
                 poll_interval: float | None = None, grace: float = 30.0, lease_seconds: float | None = None,
                 observer: WorkerObserver | None = None):
        if concurrency < 1:
            raise InvalidInput("concurrency", f"must be at least 1 (got {concurrency})")
        if isinstance(handlers, Registry):
            if transport is None:
                raise InvalidInput("transport", "a worker built from a registry needs a transport")
            self.registry = handlers
        else:
            self.registry = handlers.registry
            transport = transport if transport is not None else handlers.queue
        #: logs, metrics and traces of each attempt (metrics only when the observer has them)
        self.observe = observer if observer is not None else WorkerObserver()
        transport = self.observe.wrap(transport)
        self.transport: Any = transport
        try:
            caps = transport.capabilities  # the one declaration every transport makes
        except AttributeError:
            caps = None
        if not isinstance(caps, Capabilities):
            raise InvalidInput("transport", f"{type(transport).__name__} declares no capabilities "
                                            "(a leaseq.worker.transport.Capabilities as .capabilities)")
        self.capabilities: Capabilities = caps
        self.queues = list(queues or self.registry.queue_names() or ["default"])
        self.concurrency = concurrency
        self.name = name
        self.grace = grace
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval if poll_interval is not None else caps.idle_poll_interval
        self.stats = WorkerStats()
        self.worker: Worker | None = None
        self.held: dict[tuple[int, int], TaskContext] = {}
        self._tasks: dict[tuple[int, int], asyncio.Task] = {}
        #: tasks whose handler is running: what concurrency limits (a finished
        #: handler's lease stays held until its outcome is recorded)
        self._handling: set[tuple[int, int]] = set()
        self._stopping = False
        #: the refusal that stopped the claim loop (re-raised once shutdown is done)
        self._fatal: LeaseqError | None = None
        self._stopped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._signals = 0
        self.renewer: Renewer | None = None
        self.completer: Completer | None = None
        # A backend that writes one transaction at a time gets one database
        # thread: more would only hand the GIL and the lock back and forth.
        self._db = ThreadPoolExecutor(max_workers=1 if caps.serial_writes else min(32, concurrency + 4),
                                      thread_name_prefix="leaseq-db")
        self._handlers = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="leaseq-task")

    # -- control -----------------------------------------------------------------

    @property
    def kinds(self) -> list[str] | None:
        """The kinds this worker has handlers for, read at each claim (handlers added
        later count). It claims no others, so workers running different handlers can
        share a queue."""
        return self.registry.kinds() or None

    def stop(self) -> None:
        """Ask the runtime to stop claiming and shut down (thread-safe)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self._stopping = True
            return
        loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        self._stopping = True
        if self._wake is not None:
            self._wake.set()

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals == 1:
            logger.info("worker %s: signal %s: finishing running tasks (grace %.0fs); again to exit at once",
                        self.worker.id if self.worker else self.name, signum, self.grace)
            self._request_stop()
        else:
            logger.warning("second signal: exiting now; held leases will expire and be recovered")
            logging.shutdown()
            os._exit(130)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until the runtime has finished (for code running it in a thread)."""
        return self._stopped.wait(timeout)

    # -- the loop --------------------------------------------------------------------

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._db, functools.partial(fn, *args, **kwargs))

    async def run(self, *, until_idle: bool = False, install_signals: bool = False,
                  progress: Callable[[WorkerStats], None] | None = None) -> WorkerStats:
        """Run until :meth:`stop` (or a signal, or, with ``until_idle``, until no
        task is due and none is running). Returns the final counters.

        Refuses to start (:class:`InvalidInput`, field ``app``) when no handler
        is declared. A refusal that ends claiming for good (the worker was
        revoked, the credential refused) is raised after the graceful shutdown.
        """
        self.registry.check_runnable()
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            self.worker = await self._call(self.transport.register_worker, self.name)
            logger.info("worker %s started: queues=%s concurrency=%d", self.worker.id, ",".join(self.queues),
                        self.concurrency)
            self.completer = Completer(self.transport, self.capabilities, self.worker, self._call, self._settled)
            self.renewer = Renewer(self.transport, self.worker, self._call, self.held, self._handling, self._lose,
                                   self._count_renewal)
            background = [asyncio.create_task(self.renewer.run(), name="leaseq-renewer")]
            listener = self._start_listener()
            if progress is not None:
                background.append(asyncio.create_task(self._progress_loop(progress), name="leaseq-progress"))
            try:
                await self._claim_loop(until_idle)
                await self._shutdown()
            finally:
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
                if listener is not None:
                    listener.set()
                if self.capabilities.native_async:
                    await self.transport.close_async()
        finally:
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)
            self._db.shutdown(wait=False)
            self._handlers.shutdown(wait=False)
            self._stopped.set()
        logger.info("worker %s stopped: %s", self.worker.id if self.worker else self.name, self.stats)
        if self._fatal is not None:
            raise self._fatal
        return self.stats

    async def _claim(self, queue: str, limit: int) -> list[Claim]:
        if self.capabilities.native_async:
            return await self.transport.aclaim(self.worker, queue=queue, limit=limit,
                                               lease_seconds=self.lease_seconds, kinds=self.kinds)
        return await self._call(self.transport.claim, self.worker, queue=queue, limit=limit,
                                lease_seconds=self.lease_seconds, kinds=self.kinds)

    async def _claim_loop(self, until_idle: bool) -> None:
        turn, backoff = 0, INITIAL_BACKOFF
        while not self._stopping:
            self._wake.clear()
            free = self.concurrency - len(self._handling)
            got, pause = 0, None
            for i in range(len(self.queues)):
                if free - got <= 0 or self._stopping:
                    break
                queue = self.queues[(turn + i) % len(self.queues)]
                sent = time.monotonic()
                try:
                    claims = await self._claim(queue, free - got)
                except (UnknownWorker, AccessDenied, InvalidInput) as exc:
                    # Refused for good: no retry will help. Stop claiming; the
                    # running tasks still get the graceful shutdown.
                    logger.error("worker %s: claim refused, stopping: %s", self.worker.id, exc)
                    self._fatal = exc
                    self._stopping = True
                    return
                except Exception as exc:  # in transit (unreachable, rate limited, unexpected): retry
                    self.stats.transient_errors += 1
                    pause, backoff = next_backoff(backoff, exc)
                    backoff = min(backoff, MAX_CLAIM_BACKOFF)
                    logger.warning("worker %s: claim failed (%r); retrying in %.2fs", self.worker.id, exc, pause)
                    break
                backoff = INITIAL_BACKOFF
                for claim in claims:
                    self._start(claim, sent)
                got += len(claims)
            turn += 1
            if pause is not None:
                if not self._stopping:
                    await wait_event(self._wake, pause)
                continue
            if until_idle and got == 0 and not self._tasks:
                return
            if got == 0 or got >= free:
                # Nothing due, or no capacity left: wait for a finished task,
                # a notification, or the poll interval.
                await wait_event(self._wake, self.poll_interval)

    def _start_listener(self) -> threading.Event | None:
        """Wake the claim loop on notifications, reconnecting after a dropped
        connection (and claiming at once then: notifications may have been missed)."""
        if not self.capabilities.listen_notify:
            return None
        done = threading.Event()
        loop, wake = self._loop, self._wake

        def listen() -> None:
            listener = None
            while not done.is_set() and not self._stopping:
                try:
                    if listener is None:
                        listener = self.transport.listener(self.queues)
                        loop.call_soon_threadsafe(wake.set)
                    if listener.wait(1.0):
                        loop.call_soon_threadsafe(wake.set)
                except Exception as exc:  # the connection went away: polling covers the gap
                    logger.info("worker %s: listener lost its connection (%s); reconnecting", self.worker.id, exc)
                    _close_quietly(listener)
                    listener = None
                    done.wait(LISTENER_RETRY)
            _close_quietly(listener)

        threading.Thread(target=listen, name="leaseq-listener", daemon=True).start()
        return done

    # -- running one task ------------------------------------------------------------

    def _start(self, claim: Claim, sent: float) -> None:
        log = TaskLog(logger, {"task_id": claim.task_id, "kind": claim.task.kind, "generation": claim.generation,
                               "attempt": claim.task.attempts, "worker_id": self.worker.id})
        ctx = TaskContext(self.transport, self.worker, claim, log)
        ctx.renewed_at = sent  # the lease started no earlier than the claim was sent
        loop = self._loop
        ctx.on_lost = lambda c, reason: loop.call_soon_threadsafe(self._after_loss, c, reason)
        for stale in [c for c in self.held.values() if c.task_id == claim.task_id and not c.lost]:
            # This worker reclaimed a task it had not yet seen lost: the older
            # attempt's lease is certainly gone.
            self._lose(stale, f"reclaimed under generation {claim.generation}")
        self.held[ctx.key] = ctx
        self._handling.add(ctx.key)
        self.stats.claimed += 1
        self.renewer.lease_started(ctx)
        self._tasks[ctx.key] = asyncio.create_task(self._run_task(ctx), name=f"leaseq-task-{claim.task_id}",
                                                   context=self.observe.started(ctx, self.worker.id, sent))

    def _msg(self, ctx: TaskContext, text: str) -> str:
        return (f"task={ctx.task_id} kind={ctx.task.kind} gen={ctx.generation} attempt={ctx.task.attempts} "
                f"worker={self.worker.id}: {text}")

    async def _run_task(self, ctx: TaskContext) -> None:
        try:
            recording = await self._run_handler(ctx)
            if recording is not None:
                await recording  # shielded inside: its accounting happens in _settled
        except asyncio.CancelledError:
            if not ctx.lost:
                raise
            # Cancelled because the lease was lost: nothing may be published.
        finally:
            self._forget(ctx)

    async def _run_handler(self, ctx: TaskContext) -> Awaitable[Outcome] | None:
        """Run the handler; return the recording of its outcome (None: nothing to record)."""
        definition = self.registry.get(ctx.task.kind)
        try:
            try:
                if definition is None:
                    raise Permanent(f"no handler for task kind {ctx.task.kind!r} in this worker")
                payload = ctx.task.payload
                args, kwargs = ((), payload) if isinstance(payload, dict) else (
                    ((payload,), {}) if payload is not None else ((), {}))
                if inspect.iscoroutinefunction(definition.fn):
                    result = await definition.fn(ctx, *args, **kwargs)
                else:
                    loop = asyncio.get_running_loop()  # the thread runs in this task's context (its span)
                    result = await loop.run_in_executor(self._handlers, contextvars.copy_context().run,
                                                        functools.partial(definition.fn, ctx, *args, **kwargs))
            finally:
                self.observe.returned(ctx, sys.exc_info()[1])
                # The slot is free once the handler returns: the next claim
                # overlaps with recording this outcome.
                self._handling.discard(ctx.key)
                self._wake.set()
        except asyncio.CancelledError:
            if not ctx.lost:
                raise
            return None
        except LeaseLost as exc:
            self._lose(ctx, exc.reason)
            return None
        except QueuePaused as exc:
            return self.completer.release(ctx, f"queue paused: {exc}")
        except Exception as exc:  # the handler failed: route it by kind of failure
            if ctx.lost:
                ctx.log.warning(self._msg(ctx, f"failure not recorded: lease lost ({ctx.lost_reason}): {exc!r}"))
                return None
            return self.completer.fail(ctx, exc)
        if ctx.lost:
            ctx.log.warning(self._msg(ctx, f"result not published: lease lost ({ctx.lost_reason})"))
            return None
        return self.completer.complete(ctx, result)

    def _forget(self, ctx: TaskContext) -> None:
        self.observe.finished(ctx)
        self._handling.discard(ctx.key)
        self.held.pop(ctx.key, None)
        self._tasks.pop(ctx.key, None)
        self._wake.set()

    def _settled(self, ctx: TaskContext, outcome: Outcome) -> None:
        """Account for one recorded outcome (called once per recording, from the loop)."""
        self.observe.settled(ctx, outcome)
        verdict, op = outcome.verdict, outcome.op
        if verdict is Verdict.RECORDED:
            if op == "complete":
                self.stats.completed += 1
                if ctx.log.isEnabledFor(logging.INFO):
                    ctx.log.info(self._msg(ctx, "completed"))
            elif op == "fail":
                self.stats.failed += 1
                ctx.log.warning(self._msg(ctx, f"failed -> {getattr(outcome.value, 'status', '?')}: {outcome.detail}"))
            else:
                self.stats.released += 1
                ctx.log.info(self._msg(ctx, "released"))
        elif verdict is Verdict.LOST:
            self._lose(ctx, outcome.detail)
        elif verdict is Verdict.UNCONFIRMED:
            self.stats.unconfirmed += 1
            ctx.log.warning(self._msg(ctx, f"{op} unconfirmed: an earlier try failed in transit and the retry was "
                                           f"refused ({outcome.detail}); the first try may have been written"))
        elif op == "release":
            self.stats.transient_errors += 1
            ctx.log.warning(self._msg(ctx, f"release not recorded ({outcome.detail}); the lease will expire instead"))
        else:
            # Never a handler failure: the lease ends and the recovery policy routes the task.
            if verdict is Verdict.UNRECORDABLE:
                self.stats.transient_errors += 1
            what = "succeeded" if op == "complete" else "failed"
            self._lose(ctx, f"the handler {what} but its {op} could not be recorded before the lease ended: "
                            f"{outcome.detail}")

    def _lose(self, ctx: TaskContext, reason: str) -> None:
        """The lease is gone: stop the handler and record how we found out."""
        if ctx.mark_lost(reason):
            self._after_loss(ctx, reason)

    def _after_loss(self, ctx: TaskContext, reason: str) -> None:
        self.observe.lost(ctx, reason)
        self.stats.lost += 1
        self.stats.lost_reasons[reason] = self.stats.lost_reasons.get(reason, 0) + 1
        ctx.log.warning(self._msg(ctx, f"lease lost: {reason}"))
        task = self._tasks.get(ctx.key)
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # async handlers stop at their next await; sync ones see ctx.lost
        self.completer.report_loss(ctx, reason)

    def _count_renewal(self) -> None:
        self.stats.renewals += 1

    async def renew_now(self) -> None:
        """Renew every held lease now, in one call."""
        await self.renewer.renew_now()

    # -- shutdown ------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        pending = list(self._tasks.values())
        if pending:
            logger.info("worker %s: waiting up to %.1fs for %d running task(s)", self.worker.id, self.grace,
                        len(pending))
            await asyncio.wait(pending, timeout=self.grace)
        # Handlers still running are stopped and their leases released; outcomes
        # being recorded are left to finish (within their leases): a success is
        # worth more than a faster exit.
        leftovers = [ctx for key, ctx in list(self.held.items()) if key in self._handling and not ctx.lost]
        until = time.monotonic() + RELEASE_BUDGET
        releases = []
        for ctx in leftovers:
            ctx.mark_lost("worker shutting down")
            task = self._tasks.get(ctx.key)
            if task is not None:
                task.cancel()
            releases.append(self.completer.release(ctx, "worker shut down before the task finished", until=until))
        if releases:
            await asyncio.gather(*releases, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=None if not leftovers else 1.0)
        await self.completer.drain(timeout=1.0)

    async def _progress_loop(self, progress: Callable[[WorkerStats], None]) -> None:
        while True:
            await asyncio.sleep(1.0)
            progress(self.stats)


def _close_quietly(listener: Any) -> None:
    if listener is None:
        return
    try:
        listener.close()
    except Exception:  # pragma: no cover - already closed under our feet
        pass
