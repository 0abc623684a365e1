"""WorkerRuntime: holds leases honestly and stops acting the moment it loses one.

One asyncio loop per worker process runs four things:

* the claim loop: claims in batches up to free capacity, then waits for a
  wake-up (a finished task, a PostgreSQL notification, or the poll interval);
* the renewer: renews every lease this worker holds in ONE guarded statement
  per tick, so heartbeat traffic grows with workers, not with tasks; a lease
  missing from the answer is lost, and so is one whose renewal has not
  succeeded within its own length (measured on the monotonic clock from the
  moment the last successful renewal was sent: no wall clock is trusted);
* handlers: async ones as tasks on the loop, sync ones in a thread pool;
* shutdown: stop claiming, let running tasks finish within a grace period,
  then release the rest through the recovery policy.

The runtime talks to a *transport*: a :class:`leaseq.Queue` (direct database
access) or an HTTP client with the same methods. The lease rules live behind
it, never here.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..core.errors import (BackendUnavailable, CredentialMissing, InvalidInput, LeaseLost, LeaseqError,
                           Permanent, QueuePaused)
from ..core.model import Claim, Worker
from .context import TaskContext

if TYPE_CHECKING:  # pragma: no cover
    from ..app import App

logger = logging.getLogger("leaseq.worker")

#: Renew when a third of the shortest held lease has passed.
RENEW_FRACTION = 1 / 3
MIN_RENEW_INTERVAL = 0.05
MAX_ERROR_TEXT = 4000


class Transport(Protocol):
    """What the runtime needs from a queue: :class:`leaseq.Queue` or the HTTP client."""

    def register_worker(self, name: str) -> Worker: ...
    def claim(self, worker: Worker, *, queue: str, limit: int, lease_seconds: float | None = None,
              kinds: list[str] | None = None) -> list[Claim]: ...
    def renew_leases(self, worker: Worker, claims: list[Claim]) -> dict: ...
    def complete(self, worker: Worker, claim: Claim, result: Any = None) -> None: ...
    def fail(self, worker: Worker, claim: Claim, error: str, *, retry: bool = True, block: bool = False,
             delay: float | None = None) -> Any: ...
    def release(self, worker: Worker, claim: Claim, reason: str = "released") -> Any: ...
    def begin_effect(self, worker: Worker, claim: Claim, action: str, key: str | None = None) -> Any: ...
    def finish_effect(self, worker: Worker, claim: Claim, effect: Any, response: Any = None) -> Any: ...


@dataclass
class WorkerStats:
    """Counters of one runtime, for progress lines, metrics and tests."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0
    renewals: int = 0
    started_at: float = field(default_factory=time.monotonic)
    lost_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Completed tasks per second since start."""
        return self.completed / max(1e-9, time.monotonic() - self.started_at)


async def _wait(event: asyncio.Event, timeout: float) -> None:
    """Wait until ``event`` is set or ``timeout`` seconds pass (a timer, not
    wait_for's extra task: the claim loop waits like this once per batch)."""
    timer = asyncio.get_running_loop().call_later(timeout, event.set)
    try:
        await event.wait()
    finally:
        timer.cancel()


def _error_text(exc: BaseException) -> str:
    head = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    tail = "".join(traceback.format_tb(exc.__traceback__, limit=-3))
    return (head + ("\n" + tail if tail else ""))[:MAX_ERROR_TEXT]


class WorkerRuntime:
    """Runs an :class:`~leaseq.App`'s handlers under real leases."""

    def __init__(self, app: App, transport: Transport | None = None, *, queues: list[str] | None = None,
                 concurrency: int = 10, name: str = "worker", poll_interval: float | None = None,
                 grace: float = 30.0, lease_seconds: float | None = None):
        if concurrency < 1:
            raise InvalidInput("concurrency", f"must be at least 1 (got {concurrency})")
        self.app = app
        self.transport = transport if transport is not None else app.queue
        self.queues = list(queues or app.queue_names() or ["default"])
        self.concurrency = concurrency
        self.name = name
        self.grace = grace
        self.lease_seconds = lease_seconds
        dialect = getattr(self.transport, "dialect", None)
        self.poll_interval = poll_interval if poll_interval is not None else (2.0 if dialect == "postgres" else 0.2)
        self.stats = WorkerStats()
        self.worker: Worker | None = None
        self.held: dict[tuple[int, int], TaskContext] = {}
        self._tasks: dict[tuple[int, int], asyncio.Task] = {}
        #: tasks whose handler is running: what concurrency limits (a finished
        #: handler's lease stays held until its completion is written)
        self._handling: set[tuple[int, int]] = set()
        #: finished handlers waiting for the next batched completion
        self._done: list[tuple[TaskContext, Any, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None
        self._stopping = False
        self._stopped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._signals = 0
        # SQLite runs one write transaction at a time anyway: one database
        # thread then avoids handing the GIL and the file lock back and forth.
        self._db = ThreadPoolExecutor(max_workers=1 if dialect == "sqlite" else min(32, concurrency + 4),
                                      thread_name_prefix="leaseq-db")
        self._handlers = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="leaseq-task")
        #: claims and completions awaited on the loop itself (PostgreSQL), no thread hop
        self._native = bool(getattr(self.transport, "native_async", False))

    # -- control -----------------------------------------------------------------

    @property
    def kinds(self) -> list[str] | None:
        """The kinds this worker has handlers for (None: the app defines none).
        It claims no others, so workers running different handlers can share a queue."""
        return sorted(self.app.definitions) or None

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
        task is due and none is running). Returns the final counters."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._renew_wake = asyncio.Event()
        #: monotonic time the renewer sleeps until (None: awake, or idle with nothing held)
        self._renew_at: float | None = None
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            self.worker = await self._call(self.transport.register_worker, self.name)
            self.log = logging.LoggerAdapter(logger, {"worker_id": self.worker.id})
            logger.info("worker %s started: queues=%s concurrency=%d", self.worker.id, ",".join(self.queues),
                        self.concurrency)
            background = [asyncio.create_task(self._renew_loop(), name="leaseq-renewer")]
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
                    listener.close()
                if self._native:
                    await self.transport.close_async()
        finally:
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)
            self._db.shutdown(wait=False)
            self._handlers.shutdown(wait=False)
            self._stopped.set()
        logger.info("worker %s stopped: %s", self.worker.id if self.worker else self.name, self.stats)
        return self.stats

    async def _claim_loop(self, until_idle: bool) -> None:
        turn = 0
        while not self._stopping:
            self._wake.clear()
            free = self.concurrency - len(self._handling)
            got = 0
            for i in range(len(self.queues)):
                if free - got <= 0 or self._stopping:
                    break
                queue = self.queues[(turn + i) % len(self.queues)]
                sent = time.monotonic()
                try:
                    if self._native:
                        claims = await self.transport.aclaim(self.worker, queue=queue, limit=free - got,
                                                             lease_seconds=self.lease_seconds, kinds=self.kinds)
                    else:
                        claims = await self._call(self.transport.claim, self.worker, queue=queue,
                                                  limit=free - got, lease_seconds=self.lease_seconds,
                                                  kinds=self.kinds)
                except BackendUnavailable as exc:
                    logger.warning("worker %s: claim failed: %s", self.worker.id, exc)
                    claims = []
                for claim in claims:
                    self._start(claim, sent)
                got += len(claims)
            turn += 1
            if until_idle and got == 0 and not self._tasks:
                return
            if got == 0 or got >= free:
                # Nothing due, or no capacity left: wait for a finished task,
                # a notification, or the poll interval.
                await _wait(self._wake, self.poll_interval)

    def _start_listener(self) -> Any:
        make = getattr(self.transport, "listener", None)
        if make is None or getattr(self.transport, "dialect", None) != "postgres":
            return None
        listener = make(self.queues)
        loop = self._loop

        def listen() -> None:
            while not self._stopped.is_set() and not self._stopping:
                try:
                    if listener.wait(1.0):
                        loop.call_soon_threadsafe(self._wake.set)
                except LeaseqError:
                    return  # the connection went away: polling continues
                except Exception:  # pragma: no cover - closed under our feet
                    return

        threading.Thread(target=listen, name="leaseq-listener", daemon=True).start()
        return listener

    # -- running one task ------------------------------------------------------------

    def _start(self, claim: Claim, sent: float) -> None:
        log = logging.LoggerAdapter(logger, {"task_id": claim.task_id, "generation": claim.generation,
                                             "worker_id": self.worker.id})
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
        due = sent + max(MIN_RENEW_INTERVAL, claim.lease_seconds * RENEW_FRACTION)
        if self._renew_at is None or due < self._renew_at:
            self._renew_wake.set()  # this lease is due before the renewer means to wake
        self._tasks[ctx.key] = asyncio.create_task(self._run_task(ctx), name=f"leaseq-task-{claim.task_id}")

    def _msg(self, ctx: TaskContext, text: str) -> str:
        return f"task={ctx.task_id} gen={ctx.generation} worker={self.worker.id}: {text}"

    async def _run_task(self, ctx: TaskContext) -> None:
        definition = self.app.definition(ctx.task.kind)
        try:
            if definition is None:
                raise Permanent(f"no handler for task kind {ctx.task.kind!r} in this worker")
            payload = ctx.task.payload
            args, kwargs = ((), payload) if isinstance(payload, dict) else (((payload,), {}) if payload is not None else ((), {}))
            try:
                if inspect.iscoroutinefunction(definition.fn):
                    result = await definition.fn(ctx, *args, **kwargs)
                else:
                    loop = asyncio.get_running_loop()
                    result = await loop.run_in_executor(self._handlers,
                                                        functools.partial(definition.fn, ctx, *args, **kwargs))
            finally:
                # The slot is free once the handler returns: the next claim
                # overlaps with writing this completion.
                self._handling.discard(ctx.key)
                self._wake.set()
            await self._finish(ctx, result)
        except asyncio.CancelledError:
            if not ctx.lost:
                raise
            # Cancelled because the lease was lost: nothing may be published.
        except LeaseLost as exc:
            self._lose(ctx, exc.reason)
        except QueuePaused as exc:
            await self._release(ctx, f"queue paused: {exc}")
        except Exception as exc:  # the handler failed: route it by kind of failure
            await self._fail(ctx, exc)
        finally:
            self._handling.discard(ctx.key)
            self.held.pop(ctx.key, None)
            self._tasks.pop(ctx.key, None)
            self._wake.set()

    async def _finish(self, ctx: TaskContext, result: Any) -> None:
        if ctx.lost:
            ctx.log.warning(self._msg(ctx, f"result not published: lease lost ({ctx.lost_reason})"))
            return
        try:
            if getattr(self.transport, "complete_many", None) is None:
                await self._call(self.transport.complete, self.worker, ctx.claim, result)
            else:
                held = self._loop.create_future()
                self._done.append((ctx, result, held))
                if self._flusher is None or self._flusher.done():
                    self._flusher = asyncio.create_task(self._flush_completions(), name="leaseq-completions")
                if not await held:
                    raise LeaseLost(ctx.task_id, ctx.generation, "complete refused: lease no longer held")
        except LeaseLost as exc:
            self._lose(ctx, exc.reason)
            return
        except InvalidInput as exc:
            await self._fail(ctx, Permanent(f"handler returned an unusable result: {exc}"))
            return
        self.stats.completed += 1
        if ctx.log.isEnabledFor(logging.INFO):
            ctx.log.info(self._msg(ctx, "completed"))

    async def _flush_completions(self) -> None:
        """Write finished tasks in batches: one guarded statement per batch.

        Completions that arrive while a batch is being written form the next
        one, so a busy worker commits once per batch and an idle one at once.
        """
        await asyncio.sleep(0)  # let handlers finishing in this same turn join the batch
        while self._done:
            batch, self._done = self._done, []
            pairs = [(ctx.claim, result) for ctx, result, _ in batch]
            try:
                held = await (self.transport.acomplete_many(self.worker, pairs) if self._native
                              else self._call(self.transport.complete_many, self.worker, pairs))
            except InvalidInput:
                # One unusable result refuses the whole batch before any write:
                # complete one by one, so only that task fails.
                for ctx, result, done in batch:
                    try:
                        await self._call(self.transport.complete, self.worker, ctx.claim, result)
                        done.set_result(True)
                    except LeaseLost:
                        done.set_result(False)
                    except Exception as exc:
                        done.set_exception(exc)
                continue
            except Exception as exc:
                for _, _, done in batch:
                    done.set_exception(exc)
                continue
            for ctx, _, done in batch:
                done.set_result(ctx.task_id in held)

    async def _fail(self, ctx: TaskContext, exc: BaseException) -> None:
        if ctx.lost:
            ctx.log.warning(self._msg(ctx, f"failure not recorded: lease lost ({ctx.lost_reason}): {exc!r}"))
            return
        retry = not isinstance(exc, Permanent)
        block = isinstance(exc, CredentialMissing)
        try:
            task = await self._call(self.transport.fail, self.worker, ctx.claim, _error_text(exc),
                                    retry=retry, block=block)
        except LeaseLost as lost:
            self._lose(ctx, lost.reason)
            return
        self.stats.failed += 1
        ctx.log.warning(self._msg(ctx, f"failed -> {getattr(task, 'status', '?')}: {exc!r}"))

    async def _release(self, ctx: TaskContext, reason: str) -> None:
        try:
            await self._call(self.transport.release, self.worker, ctx.claim, reason)
            self.stats.released += 1
            ctx.log.info(self._msg(ctx, f"released: {reason}"))
        except LeaseLost as lost:
            self._lose(ctx, lost.reason)
        except BackendUnavailable as exc:
            ctx.log.warning(self._msg(ctx, f"release failed ({exc}); the lease will expire instead"))

    def _lose(self, ctx: TaskContext, reason: str) -> None:
        """The lease is gone: stop the handler and record how we found out."""
        if ctx.mark_lost(reason):
            self._after_loss(ctx, reason)

    def _after_loss(self, ctx: TaskContext, reason: str) -> None:
        self.stats.lost += 1
        self.stats.lost_reasons[reason] = self.stats.lost_reasons.get(reason, 0) + 1
        ctx.log.warning(self._msg(ctx, f"lease lost: {reason}"))
        task = self._tasks.get(ctx.key)
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # async handlers stop at their next await; sync ones see ctx.lost
        report = getattr(self.transport, "report_loss", None)
        if report is not None:
            asyncio.ensure_future(self._report_loss(report, ctx, reason))

    async def _report_loss(self, report: Callable[..., Any], ctx: TaskContext, reason: str) -> None:
        try:
            await self._call(report, self.worker, ctx.claim, f"worker saw: {reason}")
        except (LeaseqError, Exception) as exc:  # evidence is best effort; the guards already held
            ctx.log.debug(self._msg(ctx, f"could not record the loss: {exc}"))

    # -- renewing ----------------------------------------------------------------------

    def _next_renewal(self) -> float | None:
        """Monotonic time at which the most urgent held lease is due for renewal."""
        due = [ctx.renewed_at + max(MIN_RENEW_INTERVAL, ctx.claim.lease_seconds * RENEW_FRACTION)
               for ctx in self.held.values() if not ctx.lost]
        return min(due, default=None)

    async def _renew_loop(self) -> None:
        while True:
            due = self._next_renewal()
            wait = 1.0 if due is None else due - time.monotonic()
            if wait > 0:
                self._renew_wake.clear()
                self._renew_at = due
                await _wait(self._renew_wake, wait)
                self._renew_at = None
                continue
            await self.renew_now()

    async def renew_now(self) -> None:
        """Renew every held lease in one call; mark the ones that are gone as lost."""
        live = [ctx for ctx in self.held.values() if not ctx.lost]
        if not live:
            return
        sent = time.monotonic()
        # A renewal stuck on a dead connection must not keep leases alive
        # locally: wait no longer than the most urgent lease has left.
        budget = max(MIN_RENEW_INTERVAL, min(c.renewed_at + c.claim.lease_seconds for c in live) - sent)
        try:
            renewed = await asyncio.wait_for(
                self._call(self.transport.renew_leases, self.worker, [ctx.claim for ctx in live]), budget)
        except asyncio.TimeoutError:
            logger.warning("worker %s: renewal did not answer within %.2fs", self.worker.id, budget)
            renewed = None
        except (BackendUnavailable, LeaseqError) as exc:
            logger.warning("worker %s: renewal failed: %s", self.worker.id, exc)
            renewed = None
        self.stats.renewals += 1
        for ctx in live:
            if renewed is not None and ctx.task_id in renewed:
                ctx.renewed_at = sent
            elif renewed is not None and ctx.key not in self._handling:
                pass  # the handler returned and its completion is in flight: that guarded write decides
            elif renewed is not None:
                self._lose(ctx, "heartbeat refused: the lease was expired, cancelled, revoked or reclaimed")
            elif time.monotonic() - ctx.renewed_at >= ctx.claim.lease_seconds:
                self._lose(ctx, "no successful renewal within the lease length")

    # -- shutdown ------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        pending = list(self._tasks.values())
        if pending:
            logger.info("worker %s: waiting up to %.1fs for %d running task(s)", self.worker.id, self.grace,
                        len(pending))
            await asyncio.wait(pending, timeout=self.grace)
        leftovers = [ctx for ctx in list(self.held.values()) if not ctx.lost]
        for ctx in leftovers:
            ctx.mark_lost("worker shutting down")
            task = self._tasks.get(ctx.key)
            if task is not None:
                task.cancel()
            await self._release(ctx, "worker shut down before the task finished")
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=1.0)

    async def _progress_loop(self, progress: Callable[[WorkerStats], None]) -> None:
        while True:
            await asyncio.sleep(1.0)
            progress(self.stats)
