"""WorkerRuntime: holds leases honestly and stops acting the moment it loses one.

One asyncio loop per worker process runs:

* the start (:mod:`.startup`): opening the transport and registering,
  retried with backoff while the queue is out of reach;

* the claim loop: claims in batches up to free capacity, then waits for a
  wake-up (a finished handler, a PostgreSQL notification from the
  listener (:mod:`.listener`), or the poll interval). A claim that fails in transit is retried with backoff; one the
  queue refuses for good (a revoked worker, a refused credential) stops
  claiming and goes through the graceful shutdown. Beside it, a second claim
  (:meth:`WorkerRuntime._claim_alongside`) takes the slots that free up while
  the loop's own claim is on its way, so handlers that end together (I/O-bound
  agent handlers do, in waves) are replaced by two claims in flight, not one
  after another;
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
from typing import Any

from ..auth import AccessDenied
from ..core.errors import InvalidInput, LeaseLost, LeaseqError, Permanent, QueuePaused, UnknownWorker
from ..core.model import Claim, Claims, Worker
from ..observability.hooks import TaskLog, WorkerObserver
from ..schedules import Scheduler
from ..core.retry import Retry
from .completer import INITIAL_BACKOFF, Completer, Outcome, Verdict, next_backoff
from . import tools
from .context import TaskContext
from .registry import HandlerSource, Registry
from .renewer import Renewer, wait_event
from .listener import start_listener
from .startup import until_done
from .stats import WorkerStats
from .transport import Capabilities, Transport

logger = logging.getLogger("leaseq.worker")

#: The longest pause between claims that failed in transit.
MAX_CLAIM_BACKOFF = 5.0
#: How long shutdown keeps trying to release a lease before leaving it to expire.
RELEASE_BUDGET = 5.0
#: The shortest pause after a claim a rate limit came back short: a limit
#: never makes a worker spin.
MIN_LIMIT_WAIT = 0.02
#: How long an idle worker's claim waits on the queue's side for work, where the
#: transport can (``capabilities.long_poll``): no polling while idle.
CLAIM_WAIT = 5.0
#: Claims one worker has in flight at most: the claim loop's own and one beside it
#: (none beside it where the backend runs one write at a time: it would only wait).
CLAIMS_IN_FLIGHT = 2

__all__ = ["Transport", "WorkerRuntime", "WorkerStats"]


class WorkerRuntime:
    """Runs the handlers of an :class:`~leaseq.App` (or a :class:`Registry`) under real leases.

    ``handlers`` is the app (whose queue is the default transport) or a bare
    registry (then ``transport`` or ``connect`` is required). ``connect``, a
    function returning the transport, defers opening it to :meth:`run`, where
    it is retried through infrastructure errors as registration is; an app
    without ``transport`` connects to its queue that way.
    """

    def __init__(self, handlers: HandlerSource | Registry, transport: Transport | None = None, *,
                 queues: list[str] | None = None, concurrency: int = 10, name: str = "worker",
                 poll_interval: float | None = None, grace: float = 30.0, lease_seconds: float | None = None,
                 connect: Callable[[], Transport] | None = None, observer: WorkerObserver | None = None):
        if concurrency < 1:
            raise InvalidInput("concurrency", f"must be at least 1 (got {concurrency})")
        if transport is not None and connect is not None:
            raise InvalidInput("connect", "give a transport or a function that opens one, not both")
        if isinstance(handlers, Registry):
            if transport is None and connect is None:
                raise InvalidInput("transport", "a worker built from a registry needs a transport")
            self.registry = handlers
        else:
            self.registry = handlers.registry
            if transport is None and connect is None:
                app = handlers
                connect = lambda: app.queue  # noqa: E731 - connected (and migrated) in run(), retried
        #: logs, metrics and traces of each attempt (metrics only when the observer has them)
        self.observe = observer if observer is not None else WorkerObserver()
        self.concurrency = concurrency
        self._connect = connect
        self._poll_option = poll_interval
        #: the idle poll interval (the transport's default once it is open, unless given)
        self.poll_interval = poll_interval
        self.transport: Any = None
        self.capabilities: Capabilities | None = None
        #: the database threads (sized by the transport's capabilities once it is open)
        self._db: ThreadPoolExecutor | None = None
        if transport is not None:
            self._bind(transport)
        self.queues = list(queues or self.registry.queue_names() or ["default"])
        self.name = name
        self.grace = grace
        self.lease_seconds = lease_seconds
        self.stats = WorkerStats()
        self.worker: Worker | None = None
        self.held: dict[tuple[int, int], TaskContext] = {}
        #: the generations of each task held here (almost always one): finds an older
        #: attempt of a reclaimed task without walking every held lease at each claim
        self._generations: dict[int, set[int]] = {}
        self._tasks: dict[tuple[int, int], asyncio.Task] = {}
        #: tasks ended so far (an idle exit needs a claim sent after the last of them)
        self._ended = 0
        #: tasks whose handler is running: what concurrency limits (a finished
        #: handler's lease stays held until its outcome is recorded)
        self._handling: set[tuple[int, int]] = set()
        #: tasks whose handler runs in a thread (cancelling its asyncio task would only drop its result)
        self._threaded: set[tuple[int, int]] = set()
        #: presumed-lost attempts whose success was sent and is not settled yet
        self._presumed_sent: set[tuple[int, int]] = set()
        #: the timers of attempts with a timeout, and the recordings of those that ran past it
        self._timers: dict[tuple[int, int], asyncio.TimerHandle] = {}
        self._timeouts: set[asyncio.Future[Any]] = set()
        self._stopping = False
        #: the refusal that stopped the claim loop (re-raised once shutdown is done)
        self._fatal: LeaseqError | None = None
        self._stopped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        #: set when a handler's slot frees: wakes the claim beside the loop's
        self._freed: asyncio.Event | None = None
        #: claims on their way, and the slots they asked for (not free to claim again)
        self._claims_in_flight = 0
        self._reserved = 0
        #: the claim loop has ended: nothing more is claimed beside it
        self._claims_closed = False
        self._signals = 0
        self.renewer: Renewer | None = None
        self.completer: Completer | None = None
        self._handlers = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="leaseq-task")

    def _bind(self, transport: Any) -> None:
        """Use ``transport``: read its declared capabilities and size the database threads."""
        transport = self.observe.wrap(transport)
        try:
            caps = transport.capabilities  # the one declaration every transport makes
        except AttributeError:
            caps = None
        if not isinstance(caps, Capabilities):
            raise InvalidInput("transport", f"{type(transport).__name__} declares no capabilities "
                                            "(a leaseq.worker.transport.Capabilities as .capabilities)")
        self.transport, self.capabilities = transport, caps
        self.poll_interval = self._poll_option if self._poll_option is not None else caps.idle_poll_interval
        # A backend that writes one transaction at a time gets one database
        # thread: more would only hand the GIL and the lock back and forth.
        self._db = ThreadPoolExecutor(max_workers=1 if caps.serial_writes else min(32, self.concurrency + 4),
                                      thread_name_prefix="leaseq-db")

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
        if self.capabilities.long_poll and self.worker is not None and self._loop is not None:
            # A claim waiting on the queue's side would hold the shutdown up: end it now.
            try:
                self._loop.run_in_executor(self._db, self.transport.interrupt_claims,
                                           self.worker).add_done_callback(_ignore_failure)
            except RuntimeError:  # the runtime already finished: nothing waits
                pass

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
        self._freed = asyncio.Event()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            if not await self._start_up():
                logger.info("worker %s: stopped before it could register", self.name)
                return self.stats
            logger.info("worker %s started: queues=%s concurrency=%d", self.worker.id, ",".join(self.queues),
                        self.concurrency)
            self.completer = Completer(self.transport, self.capabilities, self.worker, self._call, self._settled)
            self.renewer = Renewer(self.transport, self.worker, self._call, self.held, self._handling, self._lose,
                                   self._count_renewal)
            background = [asyncio.create_task(self.renewer.run(), name="leaseq-renewer")]
            listener = self._start_listener()
            if self.registry.schedules:  # one task per slot, deduplicated by its key across workers
                scheduler = Scheduler(self.registry.schedules.values(), self.transport, self._call)
                await scheduler.tick()  # due slots exist before the first claim (--until-idle runs them)
                background.append(asyncio.create_task(scheduler.run(), name="leaseq-schedules"))
            if progress is not None:
                background.append(asyncio.create_task(self._progress_loop(progress), name="leaseq-progress"))
            alongside = None
            if CLAIMS_IN_FLIGHT > 1 and len(self.queues) == 1 and not self.capabilities.serial_writes:
                alongside = asyncio.create_task(self._claim_alongside(), name="leaseq-claim-alongside")
            try:
                await self._claim_loop(until_idle)
                if alongside is not None:
                    # its claim, if one is on its way, is started (or released) like the loop's own
                    self._claims_closed = True
                    self._freed.set()
                    await alongside
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
            if self._db is not None:
                self._db.shutdown(wait=False)
            self._handlers.shutdown(wait=False)
            self._stopped.set()
        logger.info("worker %s stopped: %s", self.worker.id if self.worker else self.name, self.stats)
        if self._fatal is not None:
            raise self._fatal
        return self.stats

    async def _start_up(self) -> bool:
        """Open the transport (if deferred) and register, retrying through infrastructure
        errors; False if asked to stop first. A refusal is raised."""
        def count() -> None:
            self.stats.transient_errors += 1

        def stopping() -> bool:
            return self._stopping

        if self.transport is None:
            assert self._connect is not None
            ok, transport = await until_done("connecting to the queue", lambda: asyncio.to_thread(self._connect),
                                             name=self.name, wake=self._wake, stopping=stopping, on_retry=count)
            if not ok:
                return False
            self._bind(transport)
        ok, worker = await until_done("registering", lambda: self._call(self.transport.register_worker, self.name),
                                      name=self.name, wake=self._wake, stopping=stopping, on_retry=count)
        self.worker = worker
        return ok

    async def _claim(self, queue: str, limit: int, wait: float = 0.0) -> list[Claim]:
        if self.capabilities.native_async:
            return await self.transport.aclaim(self.worker, queue=queue, limit=limit,
                                               lease_seconds=self.lease_seconds, kinds=self.kinds)
        waiting = {"wait": wait} if wait else {}  # only long-poll transports take it
        return await self._call(self.transport.claim, self.worker, queue=queue, limit=limit,
                                lease_seconds=self.lease_seconds, kinds=self.kinds, **waiting)

    async def _claim_reserving(self, queue: str, limit: int, wait: float) -> list[Claim]:
        """Claim up to ``limit`` tasks and start them; while the claim is on its way its
        slots are reserved, so a claim beside it does not ask for them too."""
        self._claims_in_flight += 1
        self._reserved += limit
        sent = time.monotonic()
        try:
            claims = await self._claim(queue, limit, wait)
        finally:
            self._claims_in_flight -= 1
            self._reserved -= limit
        for claim in claims:  # no await since the reservation ended: the slots pass to the tasks at once
            self._start(claim, sent)
        if claims:
            # The handlers just started run first, before the caller prepares its next claim
            # (a task's pickup latency ends when its handler begins, not after that claim is sent).
            await asyncio.sleep(0)
        return claims

    async def _claim_alongside(self) -> None:
        """The second claim in flight: while the claim loop waits for its own claim, the
        slots freed meanwhile are claimed here instead of after it. It never waits on the
        queue's side and never polls: it claims only beside a claim of the loop's. Errors
        are left to the loop, whose next claim meets them and backs off or stops."""
        queue = self.queues[0]
        while not self._stopping and not self._claims_closed:
            await wait_event(self._freed, self.poll_interval)
            self._freed.clear()
            free = self.concurrency - len(self._handling) - self._reserved
            if self._stopping or self._claims_closed or not self._claims_in_flight or free <= 0:
                continue
            try:
                await self._claim_reserving(queue, free, 0.0)
            except Exception as exc:  # the loop's own claim will meet it too
                logger.debug("worker %s: claim beside the loop's failed: %r", self.worker.id, exc)
                self._wake.set()

    async def _claim_loop(self, until_idle: bool) -> None:
        turn, backoff = 0, INITIAL_BACKOFF
        # One queue and no idle exit: an empty claim may wait on the queue's side instead of polling.
        wait = CLAIM_WAIT if self.capabilities.long_poll and len(self.queues) == 1 and not until_idle else 0.0
        while not self._stopping:
            self._wake.clear()
            free = self.concurrency - len(self._handling) - self._reserved
            got, pause, waited, limited = 0, None, False, None
            ended = self._ended  # a task that ends after this claims again: its limit slot came back
            for i in range(len(self.queues)):
                if free - got <= 0 or self._stopping:
                    break
                queue = self.queues[(turn + i) % len(self.queues)]
                sent = time.monotonic()
                try:
                    claims = await self._claim_reserving(queue, free - got, wait)
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
                waited = bool(wait) and not claims and time.monotonic() - sent >= self.poll_interval
                if isinstance(claims, Claims) and claims.limit_wait is not None:  # a rate bucket is empty
                    limited = claims.limit_wait if limited is None else min(limited, claims.limit_wait)
                got += len(claims)
            turn += 1
            if pause is not None:
                if not self._stopping:
                    await wait_event(self._wake, pause)
                continue
            if until_idle and got == 0 and not self._tasks and not self._claims_in_flight and self._ended == ended:
                return
            if got == 0 and waited:
                continue  # the claim itself waited for work: ask again at once
            if got == 0 or got >= free:
                # Nothing due, or no capacity left: wait for a finished task,
                # a notification (a freed limit slot sends one too), or the
                # poll interval; no longer than an empty rate bucket needs.
                idle = self.poll_interval
                if limited is not None and got < free:
                    idle = min(idle, max(MIN_LIMIT_WAIT, limited))
                await wait_event(self._wake, idle)

    def _start_listener(self) -> threading.Event | None:
        """Wake the claim loop on notifications (see :mod:`.listener`)."""
        if not self.capabilities.listen_notify:
            return None
        return start_listener(self.transport, self.queues, self._loop, self._wake,
                              stopping=lambda: self._stopping, name=self.worker.id)

    # -- running one task ------------------------------------------------------------

    def _start(self, claim: Claim, sent: float) -> None:
        log = TaskLog(logger, {"task_id": claim.task_id, "kind": claim.task.kind, "generation": claim.generation,
                               "attempt": claim.task.attempts, "worker_id": self.worker.id})
        ctx = TaskContext(self.transport, self.worker, claim, log)
        ctx.renewed_at = sent  # the lease started no earlier than the claim was sent
        loop = self._loop
        ctx.on_lost = lambda c, reason: loop.call_soon_threadsafe(self._after_loss, c, reason)
        older = self._generations.setdefault(claim.task_id, set())
        for stale in [self.held[(claim.task_id, g)] for g in older if not self.held[(claim.task_id, g)].loss_told]:
            # This worker reclaimed a task it had not yet seen lost: the older
            # attempt's lease is certainly gone.
            self._lose(stale, f"reclaimed under generation {claim.generation}")
        older.add(claim.generation)
        self.held[ctx.key] = ctx
        self._handling.add(ctx.key)
        self.stats.claimed += 1
        self.renewer.lease_started(ctx)
        self._tasks[ctx.key] = asyncio.create_task(self._run_task(ctx), name=f"leaseq-task-{claim.task_id}",
                                                   context=self.observe.started(ctx, self.worker.id, sent))
        timeout = self._timeout_of(claim)
        if timeout is not None:
            self._timers[ctx.key] = loop.call_later(timeout, self._time_out, ctx, timeout)

    def _timeout_of(self, claim: Claim) -> float | None:
        """How long the attempt may run: the task's own timeout, else its kind's declared one."""
        if claim.task.timeout_seconds is not None:
            return float(claim.task.timeout_seconds)
        definition = self.registry.get(claim.task.kind)
        return getattr(definition, "timeout", None)  # a bare registry's handlers may declare none

    def _time_out(self, ctx: TaskContext, seconds: float) -> None:
        """The attempt ran past its timeout: stop the handler (cancelled if async; a sync one
        sees ``ctx.lost`` and ``ctx.check()`` raise) and give its lease up with reason
        ``timeout``, for the recovery policy to route the task."""
        self._timers.pop(ctx.key, None)
        if ctx.key not in self._handling or ctx.lost:
            return  # the handler returned (its outcome is being recorded), or the lease is gone already
        if not ctx.mark_lost(f"timeout: the attempt ran past {seconds:g}s"):
            return
        self.stats.timed_out += 1
        ctx.log.warning(self._msg(ctx, f"timed out after {seconds:g}s: stopping the handler and giving the "
                                       "lease up"))
        task = self._tasks.get(ctx.key)
        if task is not None:
            task.cancel()  # an async handler stops at its next await; a thread's result is dropped
        recording = asyncio.ensure_future(self.completer.time_out(ctx))
        self._timeouts.add(recording)
        recording.add_done_callback(self._timeouts.discard)

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
                # @leaseq.tool functions find the running handler's context here
                current = tools.current_context.set(ctx)
                try:
                    if inspect.iscoroutinefunction(definition.fn):
                        result = await definition.fn(ctx, *args, **kwargs)
                    else:
                        loop = asyncio.get_running_loop()  # the thread runs in this task's context (its span)
                        self._threaded.add(ctx.key)
                        result = await loop.run_in_executor(self._handlers, contextvars.copy_context().run,
                                                            functools.partial(definition.fn, ctx, *args, **kwargs))
                finally:
                    tools.current_context.reset(current)
            finally:
                self.observe.returned(ctx, sys.exc_info()[1])
                # The slot is free once the handler returns: the next claim
                # overlaps with recording this outcome.
                self._handling.discard(ctx.key)
                self._threaded.discard(ctx.key)
                self._wake.set()
                self._freed.set()
        except asyncio.CancelledError:
            if not ctx.lost:
                raise
            return None
        except LeaseLost as exc:
            self._lose(ctx, exc.reason)
            return None
        except QueuePaused as exc:
            return self.completer.release(ctx, f"queue paused: {exc}")
        except Retry as exc:  # asked to run later: not a failure
            if ctx.lost:
                ctx.log.warning(self._msg(ctx, f"retry not recorded: lease lost ({ctx.lost_reason}): {exc}"))
                return None
            return self.completer.retry(ctx, exc)
        except Exception as exc:  # the handler failed: route it by kind of failure
            if ctx.lost:
                ctx.log.warning(self._msg(ctx, f"failure not recorded: lease lost ({ctx.lost_reason}): {exc!r}"))
                return None
            return self.completer.fail(ctx, exc, getattr(definition, "retry", None))
        if ctx.loss_told:
            ctx.log.warning(self._msg(ctx, f"result not published: lease lost ({ctx.lost_reason})"))
            return None
        if ctx.lost:
            # Presumed lost on this worker's clock only: the database may still hold
            # the lease (a renewal can commit unanswered). Send the success; the guard
            # accepts it or refuses it with zero rows.
            ctx.log.info(self._msg(ctx, f"handler returned after its lease was presumed lost ({ctx.lost_reason}): "
                                        "sending its success for the queue to judge"))
            self._presumed_sent.add(ctx.key)
        return self.completer.complete(ctx, result)

    def _forget(self, ctx: TaskContext) -> None:
        if ctx.loss_inferred and not ctx.outcome_recorded and ctx.key not in self._presumed_sent:
            # The attempt ended with nothing sent: the presumed loss stands.
            self._lose(ctx, ctx.lost_reason or "lease presumed lost")
        self.observe.finished(ctx)
        timer = self._timers.pop(ctx.key, None)
        if timer is not None:
            timer.cancel()
        self._handling.discard(ctx.key)
        if self.held.pop(ctx.key, None) is not None:
            generations = self._generations.get(ctx.task_id)
            if generations is not None:
                generations.discard(ctx.generation)
                if not generations:
                    del self._generations[ctx.task_id]
        self._tasks.pop(ctx.key, None)
        self._ended += 1
        self._wake.set()
        self._freed.set()

    def _settled(self, ctx: TaskContext, outcome: Outcome) -> None:
        """Account for one recorded outcome (called once per recording, from the loop)."""
        self.observe.settled(ctx, outcome)
        verdict, op = outcome.verdict, outcome.op
        if ctx.key in self._presumed_sent:  # a success sent after the lease was presumed lost
            self._presumed_sent.discard(ctx.key)
            if verdict is not Verdict.RECORDED:
                if verdict is Verdict.UNCONFIRMED:
                    self.stats.unconfirmed += 1
                ctx.log.warning(self._msg(ctx, f"result not published: sent after the lease was presumed lost, "
                                               f"{op} not recorded ({outcome.detail})"))
                self._lose(ctx, outcome.detail if verdict is Verdict.LOST else
                           f"{op} after a presumed loss not recorded: {outcome.detail}")
                return
            if op == "complete":
                self.stats.recovered += 1
        if verdict is Verdict.RECORDED:
            ctx.outcome_recorded = True
            if op == "complete":
                self.stats.completed += 1
                if ctx.log.isEnabledFor(logging.INFO):
                    ctx.log.info(self._msg(ctx, "completed"))
            elif op == "fail":
                self.stats.failed += 1
                ctx.log.warning(self._msg(ctx, f"failed -> {getattr(outcome.value, 'status', '?')}: {outcome.detail}"))
            elif op == "retry":
                self.stats.snoozed += 1
                ctx.log.info(self._msg(ctx, f"retry requested -> {getattr(outcome.value, 'status', '?')}"))
            else:
                self.stats.released += 1
                ctx.log.info(self._msg(ctx, "released"))
        elif verdict is Verdict.LOST:
            self._lose(ctx, outcome.detail)
        elif verdict is Verdict.UNCONFIRMED:
            self.stats.unconfirmed += 1
            ctx.log.warning(self._msg(ctx, f"{op} unconfirmed: an earlier try failed in transit and the retry was "
                                           f"refused ({outcome.detail}); the first try may have been written"))
        elif op in ("release", "timeout"):
            self.stats.transient_errors += 1
            ctx.log.warning(self._msg(ctx, f"release not recorded ({outcome.detail}); the lease will expire instead"))
        else:
            # Never a handler failure: the lease ends and the recovery policy routes the task.
            if verdict is Verdict.UNRECORDABLE:
                self.stats.transient_errors += 1
            what = {"complete": "succeeded", "retry": "asked to retry"}.get(op, "failed")
            self._lose(ctx, f"the handler {what} but its {op} could not be recorded before the lease ended: "
                            f"{outcome.detail}")

    def _lose(self, ctx: TaskContext, reason: str, *, inferred: bool = False) -> None:
        """The lease is gone (``inferred``: presumed gone, on this worker's clock only):
        stop the handler and record how we found out."""
        if ctx.mark_lost(reason, inferred=inferred):
            self._after_loss(ctx, reason)

    def _after_loss(self, ctx: TaskContext, reason: str) -> None:
        task = self._tasks.get(ctx.key)
        if ctx.loss_inferred:
            # Stop the handler as for any loss, but keep a sync handler's result:
            # a success it still returns is sent, and the guard decides. The loss
            # is counted and reported once the attempt ends without a recorded outcome.
            self.stats.presumed_lost += 1
            ctx.log.warning(self._msg(ctx, f"lease presumed lost: {reason}"))
            if task is not None and task is not asyncio.current_task() and ctx.key not in self._threaded:
                task.cancel()
            return
        self.observe.lost(ctx, reason)
        self.stats.lost += 1
        self.stats.lost_reasons[reason] = self.stats.lost_reasons.get(reason, 0) + 1
        ctx.log.warning(self._msg(ctx, f"lease lost: {reason}"))
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
        for ctx in [c for key, c in list(self.held.items()) if key in self._handling and c.loss_inferred]:
            self._lose(ctx, "worker shut down before the handler returned")  # a presumed loss stands
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


def _ignore_failure(done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and done.exception() is not None:  # best effort: the wait ends by itself
        logger.debug("could not interrupt a waiting claim: %r", done.exception())
