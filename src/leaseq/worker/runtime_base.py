"""The state the worker runtime's parts share, declared once, and the helpers they all use.

:class:`~leaseq.worker.WorkerRuntime` assigns every attribute declared here
in its ``__init__``; the parts (:mod:`.losses`, :mod:`.handling`,
:mod:`.claim_loop`, :mod:`.shutdown`) read and update them.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.model import Worker
from ..observability.hooks import WorkerObserver
from .context import AttemptKey, TaskContext
from .registry import Registry
from .stats import WorkerStats
from .transport import Capabilities

if TYPE_CHECKING:  # pragma: no cover
    from .completer import Completer
    from .renewer import Renewer

T = TypeVar("T")


def _set_up(value: T | None, name: str) -> T:
    if value is None:  # a part ran outside run(), or before run() set it up
        raise RuntimeError(f"the worker runtime's {name} is not set up yet")
    return value


class RuntimeBase:
    """What every part of the worker runtime shares: its settings, the leases it holds and its wake-ups."""

    # -- settings ---------------------------------------------------------------------------
    registry: Registry
    #: logs, metrics and traces of each attempt (metrics only when the observer has them)
    observe: WorkerObserver
    concurrency: int
    #: leases held beyond ``concurrency``, claimed ahead and started as handlers return (0: none)
    prefetch: int
    queues: list[str]
    name: str
    grace: float
    lease_seconds: float | None
    #: the idle poll interval (the transport's default once it is open, unless given)
    poll_interval: float | None
    #: the port every call is awaited on (:class:`~leaseq.worker.transport.Transport`)
    transport: Any
    capabilities: Capabilities | None
    #: the threads sync handlers run in
    _handlers: ThreadPoolExecutor

    # -- the worker and its leases ------------------------------------------------------------
    worker: Worker | None
    stats: WorkerStats
    held: dict[AttemptKey, TaskContext]
    #: the attempts of each task held here (almost always one): finds an older
    #: attempt of a reclaimed task without walking every held lease at each claim
    _generations: dict[int, set[AttemptKey]]
    _tasks: dict[AttemptKey, asyncio.Task[None]]
    #: tasks ended so far (an idle exit needs a claim sent after the last of them)
    _ended: int
    #: tasks whose handler is running: what concurrency limits (a finished
    #: handler's lease stays held until its outcome is recorded)
    _handling: set[AttemptKey]
    #: with prefetch, the handler slots (``concurrency`` of them) that leased tasks wait for,
    #: in the order they were claimed (a task in ``_handling`` without ``ctx.slot_held`` waits)
    _slots: asyncio.Semaphore | None
    #: tasks whose handler runs in a thread (cancelling its asyncio task would only drop its result)
    _threaded: set[AttemptKey]
    #: presumed-lost attempts whose success was sent and is not settled yet
    _presumed_sent: set[AttemptKey]
    #: the timers of attempts with a timeout, and the recordings of those that ran past it
    _timers: dict[AttemptKey, asyncio.TimerHandle]
    _timeouts: set[asyncio.Future[Any]]
    renewer: Renewer | None
    completer: Completer | None

    # -- claiming and stopping ----------------------------------------------------------------
    _stopping: bool
    #: the refusal (or the bug) that stopped the claim loop (re-raised once shutdown is done)
    _fatal: Exception | None
    _stopped: threading.Event
    _loop: asyncio.AbstractEventLoop | None
    _wake: asyncio.Event
    #: set when a handler's slot frees: wakes the claim beside the loop's
    _freed: asyncio.Event
    #: claims on their way, and the slots they asked for (not free to claim again)
    _claims_in_flight: int
    _reserved: int
    #: the claim loop has ended: nothing more is claimed beside it
    _claims_closed: bool
    _signals: int
    #: why the worker stops (a signal, a stop request), recorded with its clean exit
    _stop_reason: str | None

    # -- what run() sets up before any part runs ----------------------------------------------
    # worker, capabilities, completer, renewer and poll_interval may be None until
    # then (stop() and callers may look earlier); the parts, which run only inside
    # run(), read them through these.

    @property
    def _registered(self) -> Worker:
        return _set_up(self.worker, "worker")

    @property
    def _caps(self) -> Capabilities:
        return _set_up(self.capabilities, "capabilities")

    @property
    def _completer(self) -> Completer:
        return _set_up(self.completer, "completer")

    @property
    def _renewer(self) -> Renewer:
        return _set_up(self.renewer, "renewer")

    @property
    def _poll_every(self) -> float:
        return _set_up(self.poll_interval, "poll_interval")

    @property
    def kinds(self) -> list[str] | None:
        """The kinds this worker has handlers for, read at each claim (handlers added
        later count). It claims no others, so workers running different handlers can
        share a queue."""
        return self.registry.kinds() or None

    @property
    def _free(self) -> int:
        """Leases to claim now: the handler slots and the tasks claimed ahead of them
        (``prefetch``), less the tasks held with a handler to run and the claims on their way."""
        return self.concurrency + self.prefetch - len(self._handling) - self._reserved

    def _msg(self, ctx: TaskContext, text: str) -> str:
        return (f"task={ctx.task_id} kind={ctx.task.kind} gen={ctx.generation} attempt={ctx.task.attempts} "
                f"worker={self._registered.id}: {text}")
