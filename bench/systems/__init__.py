"""The queues under test, each behind the same small interface.

Orchestrator side (synchronous, in the ``python -m bench`` process):
``install``, ``enqueue_one``, ``enqueue_batch``, ``finished`` and
``running``. Worker side (inside a :mod:`bench.worker` process):
``open_worker`` returns a :class:`Runner` whose ``run()`` works until the
mode says stop. Handlers are no-ops unless the mode says otherwise.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

#: Tasks per call in the batched enqueue workload, for every system.
ENQUEUE_BATCH = 1000


@dataclass
class WorkerOptions:
    """What a worker process is asked to do.

    ``mode``: ``drain`` (until the queue is empty), ``count`` (until ``target``
    tasks are done), ``latency`` (until stopped, recording when each handler
    starts), ``hold`` (handlers wait until stopped, so leases stay held) or
    ``io`` (as ``drain``, each handler awaiting ``io_seconds`` of I/O: a model call).
    ``tool_calls``: each handler (leaseq's) records that many tool calls in the
    action ledger (``ctx.tool`` around a no-op read): what an agent's turn costs
    the queue.
    """

    mode: str = "drain"
    concurrency: int = 10
    target: int = 0
    io_seconds: float = 0.0
    #: the lease length the worker claims with (None: each task's own)
    lease_seconds: float | None = None
    #: tasks leased ahead of the handler slots (leaseq's ``prefetch``; 0: none)
    prefetch: int = 0
    #: tool calls each handler makes through ``ctx.tool`` (leaseq only; 0: none)
    tool_calls: int = 0


@dataclass
class Control:
    """Shared between the worker process's control thread and the running queue."""

    options: WorkerOptions
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    done: int = 0
    starts: dict[int, float] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None
    on_stop: list[Any] = field(default_factory=list)
    #: figures the runner adds to the worker's result (e.g. renewal statements sent)
    counters: dict[str, float] = field(default_factory=dict)
    #: how long each recorded tool call took, as the handler saw it (seconds)
    tool_seconds: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def handler_started(self, index: int) -> None:
        """Record, in wall-clock seconds, when the handler for task ``index`` began."""
        if self.options.mode == "latency":
            self.starts[index] = time.time()

    def handler_done(self) -> None:
        """Count a finished handler; in ``count`` mode, stop at the target."""
        self.done += 1
        if self.options.mode == "count" and self.done >= self.options.target:
            self.request_stop()

    def request_stop(self) -> None:
        """Ask the runner to stop (callable from any thread)."""
        def stop() -> None:
            if not self.stop.is_set():
                self.stop.set()
                for callback in self.on_stop:
                    callback()
        if self.loop is not None:
            self.loop.call_soon_threadsafe(stop)


class Runner(Protocol):
    """A worker, connected and ready; ``run`` is timed from the moment it is awaited."""

    async def run(self) -> None: ...

    async def close(self) -> None: ...


#: connections an asyncio caller's pool holds in the async enqueue workload, the same for every system
ASYNC_POOL = 10


async def timed_callers(n: int, callers: int, enqueue) -> float:  # type: ignore[no-untyped-def]
    """Seconds ``callers`` coroutines take to await ``enqueue(i)`` for ``i`` in ``range(n)``
    between them, each one call at a time (a web server's request handlers, say). The clock
    starts after a warm-up (as many calls at once as there are callers, up to the pool's size,
    then a pause for a pool that grows in the background), so opening connections is not counted."""
    import asyncio
    import time

    await asyncio.gather(*(enqueue(-1 - w) for w in range(min(callers, ASYNC_POOL))))
    await asyncio.sleep(0.3)
    shares = [range(c, n, callers) for c in range(callers)]

    async def caller(share: range) -> None:
        for i in share:
            await enqueue(i)

    started = time.perf_counter()
    await asyncio.gather(*(caller(share) for share in shares))
    return time.perf_counter() - started


class System(Protocol):
    """One queue implementation."""

    name: str
    label: str
    dialect: str

    def version(self) -> str: ...
    def install(self, dsn: str) -> None: ...
    def enqueue_one(self, dsn: str, n: int) -> None: ...
    def enqueue_batch(self, dsn: str, n: int) -> None: ...
    def enqueue_timed(self, dsn: str, index: int) -> None: ...
    async def enqueue_async(self, dsn: str, n: int, callers: int) -> float: ...
    def finished(self, dsn: str) -> tuple[int, float | None, float | None]: ...
    def running(self, dsn: str) -> int: ...
    async def open_worker(self, dsn: str, control: Control) -> Runner: ...


def get(name: str) -> System:
    """The system registered under ``name``."""
    if name in ("leaseq", "leaseq-compact", "leaseq-roles", "leaseq-sqlite"):
        from .leaseq_system import LeaseqSystem

        return LeaseqSystem(name)
    if name == "leaseq-remote" or (name.startswith("leaseq-remote-") and name.endswith("p")):
        from .remote_system import RemoteSystem

        # leaseq-remote-2p: the service runs as `leaseq serve --processes 2`
        return RemoteSystem(int(name[len("leaseq-remote-"):-1]) if name != "leaseq-remote" else 1)
    if name == "raw":
        from .raw_system import RawSystem

        return RawSystem()
    if name in ("pgqueuer", "pgqueuer-psycopg"):
        from .pgqueuer_system import PgqueuerSystem

        return PgqueuerSystem(name)
    if name == "procrastinate":
        from .procrastinate_system import ProcrastinateSystem

        return ProcrastinateSystem()
    raise KeyError(name)


NAMES = ("leaseq", "pgqueuer", "procrastinate", "raw", "leaseq-sqlite", "leaseq-compact", "leaseq-roles",
         "pgqueuer-psycopg")
