"""WorkerRuntime: holds leases honestly and stops acting the moment it loses one.

One asyncio loop per worker process runs:

* the start (:mod:`.startup`): opening the transport and registering,
  retried with backoff while the queue is out of reach;
* the claim loop (:mod:`.claim_loop`): claims in batches up to free
  capacity, then waits for a wake-up (a finished handler, a PostgreSQL
  notification from the listener (:mod:`.listener`), or the poll interval).
  A claim that fails in transit is retried with backoff; one the queue
  refuses for good (a revoked worker, a refused credential) stops claiming
  and goes through the graceful shutdown. Beside it, a second claim takes
  the slots that free up while the loop's own claim is on its way, so
  handlers that end together (I/O-bound agent handlers do, in waves) are
  replaced by two claims in flight, not one after another;
* the renewer (:mod:`.renewer`): every held lease in one guarded call per tick;
* handlers (:mod:`.handling`): async ones as tasks on the loop, sync ones in
  a thread pool, each with its timeout; their outcomes settled;
* the completer (:mod:`.completer`): records each outcome, retrying through
  outages for as long as the lease lasts, never charging the handler for
  the infrastructure's trouble;
* lease losses (:mod:`.losses`): the handler stopped, the loss reported;
* shutdown (:mod:`.shutdown`): stop claiming, let running tasks finish
  within a grace period, then release the rest through the recovery policy.

:class:`WorkerRuntime` is assembled from these parts, which share the
state declared in :mod:`.runtime_base` (each part builds on the one it
calls: losses, then handling, then the claim loop; shutdown on losses). It
talks to a *transport* (:mod:`.transport`) and reads what it can do from
its declared capabilities; it runs the handlers of a registry
(:mod:`.registry`). Every call to the queue is awaited on the port
(:func:`.transport.worker_port`) on the runtime's loop; no call is run in a
thread on its behalf. The lease rules live behind the port, never here.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..core.errors import InvalidInput
from ..core.timers import cancel_all
from ..engine.leases import MAX_CLAIM
from ..observability.hooks import WorkerObserver
from ..schedules import Scheduler
from .claim_loop import CLAIMS_IN_FLIGHT, ClaimLoop
from .completer import Completer
from .listener import listen
from .liveness import heartbeat, liveness, record_stop
from .registry import HandlerSource, Registry
from .renewer import Renewer
from .shutdown import Shutdown
from .startup import until_done
from .stats import WorkerStats
from .transport import Capabilities, Transport, worker_port

logger = logging.getLogger("leaseq.worker")

#: The most tasks a worker may claim ahead of its handler slots.
MAX_PREFETCH = 1_000

__all__ = ["Transport", "WorkerRuntime", "WorkerStats"]


class WorkerRuntime(ClaimLoop, Shutdown):
    """Runs the handlers of an :class:`~leaseq.App` (or a :class:`Registry`) under real leases.

    ``handlers`` is the app (whose queue is the default transport) or a bare
    registry (then ``transport`` or ``connect`` is required). ``connect``, a
    function returning the transport, defers opening it to :meth:`run`, where
    it is retried through infrastructure errors as registration is; an app
    without ``transport`` connects to its queue that way. The transport is a
    :class:`leaseq.Queue`, a :class:`leaseq.client.RemoteQueue` or a port
    (:class:`~leaseq.worker.transport.Transport`); the runtime awaits its port.
    """

    # -- set-up ----------------------------------------------------------------------------

    def __init__(self, handlers: HandlerSource | Registry, transport: Transport | None = None, *,
                 queues: list[str] | None = None, concurrency: int = 10, name: str = "worker",
                 poll_interval: float | None = None, grace: float = 30.0, lease_seconds: float | None = None,
                 connect: Callable[[], Transport] | None = None, observer: WorkerObserver | None = None,
                 prefetch: int = 0):
        # Every attribute set here is declared, with its meaning, in RuntimeBase.
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidInput("concurrency", f"must be a whole number of at least 1 (got {concurrency!r})")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 0 <= prefetch <= MAX_PREFETCH:
            raise InvalidInput("prefetch", f"must be a whole number from 0 to {MAX_PREFETCH} (got {prefetch!r})")
        if concurrency + prefetch > MAX_CLAIM:  # a claim asks for every free slot at once
            raise InvalidInput("concurrency", f"concurrency + prefetch must be at most {MAX_CLAIM}, what one claim "
                                              f"may lease (got {concurrency} + {prefetch})")
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
        self.observe = observer if observer is not None else WorkerObserver()
        self.concurrency = concurrency
        self.prefetch = prefetch
        self._slots = None
        self._connect = connect
        self._poll_option = poll_interval
        self.poll_interval = poll_interval
        self.transport = None
        self.capabilities = None
        if transport is not None:
            self._bind(transport)
        self.queues = list(queues or self.registry.queue_names() or ["default"])
        self.name = name
        self.grace = grace
        self.lease_seconds = lease_seconds
        self.stats = WorkerStats()
        self.worker = None
        self.held = {}
        self._generations = {}
        self._tasks = {}
        self._ended = 0
        self._handling = set()
        self._threaded = set()
        self._presumed_sent = set()
        self._timers = {}
        self._timeouts = set()
        self._stopping = False
        self._fatal = None
        self._stopped = threading.Event()
        self._loop = None
        # (made again by run(), on its loop; these let stop() set one before it)
        self._wake = asyncio.Event()
        self._freed = asyncio.Event()
        self._claims_in_flight = 0
        self._reserved = 0
        self._claims_closed = False
        self._signals = 0
        self._stop_reason = None
        self.renewer = None
        self.completer = None
        self._handlers = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="leaseq-task")

    def _bind(self, transport: Any) -> None:
        """Use ``transport``'s port and read its declared capabilities."""
        transport = self.observe.wrap(worker_port(transport))
        try:
            caps = transport.capabilities  # the one declaration every transport makes
        except AttributeError:
            caps = None
        if not isinstance(caps, Capabilities):
            raise InvalidInput("transport", f"{type(transport).__name__} declares no capabilities "
                                            "(a leaseq.worker.transport.Capabilities as .capabilities)")
        self.transport, self.capabilities = transport, caps
        self.poll_interval = self._poll_option if self._poll_option is not None else caps.idle_poll_interval

    # -- the loop --------------------------------------------------------------------------

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
        # FIFO: the tasks claimed ahead start in the order they were leased
        self._slots = asyncio.Semaphore(self.concurrency) if self.prefetch else None
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            if not await self._start_up():
                logger.info("worker %s: stopped before it could register", self.name)
                return self.stats
            logger.info("worker %s started: queues=%s concurrency=%d prefetch=%d%s", self._registered.id,
                        ",".join(self.queues), self.concurrency, self.prefetch,
                        "" if self.registry.version is None else
                        f" version={self.registry.version} serves={','.join(self.registry.compatible_versions or [])}")
            await self._warn_if_unbound()
            self.completer = Completer(self.transport, self._caps, self._registered, self._settled, self._refill(),
                                       bug=self._bug)
            self.renewer = Renewer(self.transport, self._registered, self.held, self._handling, self._lose,
                                   self._count_renewal, stop=self._stop_for)
            background = [asyncio.create_task(self.renewer.run(), name="leaseq-renewer"),
                          asyncio.create_task(heartbeat(self.transport, self._registered,
                                                        liveness(self.lease_seconds)[0]), name="leaseq-heartbeat")]
            if self._caps.listen_notify:  # woken by the queue's notifications (see .listener)
                background.append(asyncio.create_task(
                    listen(self.transport, self.queues, self._wake, stopping=lambda: self._stopping,
                           name=self._registered.id), name="leaseq-listener"))
            if self.registry.schedules:  # one task per slot, deduplicated by its key across workers
                scheduler = Scheduler(self.registry.schedules.values(), self.transport)
                await scheduler.tick()  # due slots exist before the first claim (--until-idle runs them)
                background.append(asyncio.create_task(scheduler.run(), name="leaseq-schedules"))
            if progress is not None:
                background.append(asyncio.create_task(self._progress_loop(progress), name="leaseq-progress"))
            alongside = None
            if CLAIMS_IN_FLIGHT > 1 and len(self.queues) == 1 and not self._caps.serial_writes:
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
                # the claim beside the loop's waits for a freed slot: one that the loop's end
                # did not let go (the loop raised, or the run was cancelled) is cancelled here
                await cancel_all(background + ([alongside] if alongside is not None else []))
                await record_stop(self.transport, self._registered, self._why_stopped(until_idle))
        finally:
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)
            if self.transport is not None:
                try:  # the connections this loop opened: they cannot outlive it
                    await self.transport.close_async()
                except Exception as exc:  # noqa: BLE001 - at exit, best effort
                    logger.debug("worker %s: closing its connections failed: %r", self.name, exc)
            self._handlers.shutdown(wait=False)
            self._stopped.set()
        logger.info("worker %s stopped: %s", self.worker.id if self.worker else self.name, self.stats)
        if self._fatal is not None:
            raise self._fatal
        return self.stats

    def _why_stopped(self, until_idle: bool) -> str:
        """The reason recorded with the clean exit."""
        if self._fatal is not None:
            return f"refused: {self._fatal}"
        if self._stop_reason is not None:
            return self._stop_reason
        if until_idle and not self._stopping:
            return "idle: no task due and none running (until_idle)"
        exc = sys.exc_info()[1]
        return f"error: {exc!r}"[:500] if exc is not None else "stopped"

    async def _warn_if_unbound(self) -> None:
        """A direct PostgreSQL worker logged in as the schema's owner (or a superuser) is held
        to its leases by nothing but this library: say so, loudly, once."""
        from ..aio import AsyncQueue

        port = self.transport
        if not isinstance(port, AsyncQueue) or port.dialect != "postgres":
            return
        if await port.database_authority() == "admin":
            logger.warning("UNSAFE FOR PRODUCTION: worker %s connects to PostgreSQL as a role that owns leaseq's "
                           "schema (or a superuser): the database does not hold it to its leases. Give each "
                           "worker host a role of its own: leaseq roles create worker NAME (docs/how-to/postgresql.md)",
                           self._registered.id)

    async def _start_up(self) -> bool:
        """Open the transport (if deferred) and register, retrying through infrastructure
        errors; False if asked to stop first. A refusal is raised."""
        def count() -> None:
            self.stats.transient_errors += 1

        def stopping() -> bool:
            return self._stopping

        connect = self._connect
        if self.transport is None and connect is not None:
            ok, transport = await until_done("connecting to the queue", lambda: asyncio.to_thread(connect),
                                             name=self.name, wake=self._wake, stopping=stopping, on_retry=count)
            if not ok:
                return False
            self._bind(transport)
        heartbeat_seconds, lease_seconds = liveness(self.lease_seconds)
        # Each kind is recorded on a queue this worker claims it from: the declared one, or the
        # first of the queues it was started on (`leaseq worker --queue`) when those replace it.
        declarations = [d if d["queue"] in self.queues else {**d, "queue": self.queues[0]}
                        for d in self.registry.declarations()]

        def register() -> Any:
            versions: dict[str, Any] = {}
            if self.registry.version is not None:  # App(version=...): an older transport need not know it
                versions = dict(version=self.registry.version,
                                compatible_versions=self.registry.compatible_versions)
            return self.transport.register_worker(self.name, kinds=declarations, heartbeat_seconds=heartbeat_seconds,
                                                  lease_seconds=lease_seconds, **versions)

        ok, worker = await until_done("registering", register,
                                      name=self.name, wake=self._wake, stopping=stopping, on_retry=count)
        self.worker = worker
        return ok

    async def renew_now(self) -> None:
        """Renew every held lease now, in one call."""
        await self._renewer.renew_now()

    def _bug(self, op: str, exc: BaseException) -> None:
        """A write raised what no port raises on purpose (outside the error registry): a bug.
        Logged with its traceback; the worker stops, and run() raises it once shut down."""
        logger.error("worker %s: %s raised %r, a bug, not the queue's answer: stopping", self._registered.id, op,
                     exc, exc_info=exc)
        self._stop_for(exc)

    def _stop_for(self, exc: BaseException) -> None:
        """Stop claiming for good because of ``exc`` (raised from run() after the graceful shutdown)."""
        if self._fatal is None and isinstance(exc, Exception):
            self._fatal = exc
        self._stopping = True
        self._wake.set()
        self._freed.set()

    def _count_renewal(self) -> None:
        self.stats.renewals += 1

    async def _progress_loop(self, progress: Callable[[WorkerStats], None]) -> None:
        while True:
            await asyncio.sleep(1.0)
            progress(self.stats)
