"""The queue's foundation: its settings, its backend and how an operation runs on it.

Every operation module of this package (:mod:`.leases`, :mod:`.effects`,
:mod:`.children`, :mod:`.enqueue`, :mod:`.operator`, :mod:`.reads`, :mod:`.schema`,
each generated from its awaited source by :mod:`.generate`; :mod:`.fences`, written by
hand) adds its methods to :class:`QueueBase`; :class:`leaseq.Queue` is all of them together.
:class:`.base_async.AsyncQueueBase` is this class for the awaited methods.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Self, TypeVar

from .. import engine
from ..core import checks
from ..core.errors import BackendUnavailable, InvalidInput
from ..core.retry import DEFAULT_MAX_SNOOZES
from ..engine.common import EVIDENCE_LEVELS, Settings
from ..engine.steps import Op, T
from ..store import Store, Tx
from ..store.base import TaskListener, WorkListener
from ..core.capabilities import Capabilities
from ..db.errors import rolled_back

#: How many times an operation the database rolled back to break a lock cycle is run
#: (see :meth:`QueueBase._run_again`).
ROLLED_BACK_ATTEMPTS = 5

V = TypeVar("V")

if TYPE_CHECKING:  # pragma: no cover
    from asyncio import AbstractEventLoop

    from ..engine.shared import SharedCommits
    from ..fencing.tokens import ActionSigner


def replayable(value: V) -> V:
    """``value``, or the list of its items where it is an iterator (a generator, say), which
    could be read only once: the argument of an operation that may be made twice."""
    if isinstance(value, Iterator):
        return list(value)  # type: ignore[return-value]
    return value


class QueueBase:
    """What every operation of a :class:`leaseq.Queue` relies on: the backend
    (``store``), the settings each operation reads, and the drivers that run
    an operation of :mod:`leaseq.engine` on the backend."""

    # -- set-up ----------------------------------------------------------------

    def __init__(self, store: Store, *, max_same_error: int = checks.DEFAULT_MAX_SAME_ERROR,
                 signer: ActionSigner | None = None, action_token_ttl: float = 300.0, evidence: str = "full",
                 max_snoozes: int = DEFAULT_MAX_SNOOZES):
        self.store = store
        if evidence not in EVIDENCE_LEVELS:
            raise InvalidInput("evidence", f"must be one of {', '.join(EVIDENCE_LEVELS)} (got {evidence!r})")
        #: what every operation reads: the evidence level ("full": every event
        #: carries its detail; "compact": the routine claimed/completed events
        #: keep only task, type, generation, worker and time), the same-error
        #: limit, the limit of retries on request (max_snoozes), the action-token signer and the backend's
        #: capabilities
        self.settings = Settings(
            backend=store.capabilities, evidence=evidence,
            max_same_error=checks.check_int("max_same_error", max_same_error, minimum=1),
            max_snoozes=checks.check_int("max_snoozes", max_snoozes, minimum=0, maximum=1_000_000),
            signer=signer,
            action_token_ttl=checks.check_seconds("action_token_ttl", action_token_ttl, allow_zero=False))
        backend = store.capabilities
        #: what the worker runtime may rely on (see :class:`leaseq.worker.Capabilities`)
        self.capabilities = Capabilities(
            batched_completion=True, listen_notify=backend.listen_notify,
            loss_reports=True, serial_writes=backend.serial_writes)
        #: per event loop, the asyncio enqueues waiting to share a transaction
        #: (:mod:`leaseq.engine.shared`): one set per queue, so every AsyncQueue over it (the
        #: service makes one per request) shares
        self.shared_commits: weakref.WeakKeyDictionary[AbstractEventLoop, SharedCommits] = (
            weakref.WeakKeyDictionary())

    def _run(self, op: Op[T]) -> T:
        return engine.drive(self.store, op)

    def _shared(self, make: Callable[[], Op[T]]) -> T:
        """``self._run(make())``: the blocking twin of :meth:`.base_async.AsyncQueueBase._ashared`
        (a blocking call waits for its own commit; threads do not share one)."""
        return self._run(make())

    def _run_again(self, make: Callable[[], Op[T]]) -> T:
        """``self._run(make())``, run again from its start when PostgreSQL rolled it back to
        break a lock cycle (:func:`leaseq.db.errors.rolled_back`: nothing was written). For
        the operator's calls that lock a tree of tasks from the top (a cancel, and its
        children level by level), while a child's end locks the child and then wakes its
        parent: the two orders cannot agree, and the database ends one of them. The
        worker's side is retried as any call in transit is; this is the operator's side.
        Inside a :meth:`joined` block the caller's transaction is the one rolled back, and
        the error is the caller's."""
        attempt = 1
        while True:
            try:
                return self._run(make())
            except BackendUnavailable as exc:
                if not self._run_again_after(exc, attempt):
                    raise
                attempt += 1

    def _run_again_after(self, exc: BaseException, attempt: int) -> bool:
        """Whether :meth:`_run_again` (and its awaited twin) runs the operation once more after
        ``exc`` ended its ``attempt``-th run."""
        return attempt < ROLLED_BACK_ATTEMPTS and rolled_back(exc) and not self._in_joined

    def _task_listener(self, task_id: int, *, streams: bool = False) -> TaskListener:
        """A waiter woken when task ``task_id`` may have ended (``streams``: or its handler emitted);
        the blocking twin of :meth:`.base_async.AsyncQueueBase._atask_listener`."""
        return self.store.task_listener(task_id, streams=streams)

    @property
    def _in_joined(self) -> bool:
        """Whether this is the view of a :meth:`joined` block (its calls share the block's transaction)."""
        from ..store.joined import JoinedStore

        return isinstance(self.store, JoinedStore)

    def _run_in(self, connection: Any, op: Op[T]) -> T:
        """Run ``op`` in the application's own open transaction on ``connection``; never commits."""
        from ..store.joined import CallerStore

        try:
            tx = self.store.caller_tx(connection)
        except BaseException:
            op.close()
            raise
        return engine.drive(CallerStore(self.store, tx=tx), op)

    @property
    def dialect(self) -> str:
        """``"postgres"`` or ``"sqlite"``."""
        return self.store.dialect

    @property
    def evidence(self) -> str:
        """The evidence level: ``"full"`` or ``"compact"``."""
        return self.settings.evidence

    @property
    def max_same_error(self) -> int:
        """Failures in a row with the same error that send a task to ``dead``."""
        return self.settings.max_same_error

    @property
    def max_snoozes(self) -> int:
        """Retries on request (:class:`leaseq.Retry`) a task may make before the next counts as a failure."""
        return self.settings.max_snoozes

    @property
    def signer(self) -> ActionSigner | None:
        """Signs an action token for every effect (None: effects carry no token)."""
        return self.settings.signer

    @property
    def action_token_ttl(self) -> float:
        """Longest life of an action token, in seconds (the lease deadline may end it sooner)."""
        return self.settings.action_token_ttl

    @property
    def native_async(self) -> bool:
        """Whether async operations run on the event loop itself (PostgreSQL)
        rather than in a thread (SQLite)."""
        return self.store.capabilities.native_async

    async def close_async(self) -> None:
        """Close the connections the async operations opened for the running event loop."""
        await self.store.close_async()

    def close(self) -> None:
        """Close every connection. Safe while other threads still run operations on the
        queue: one in progress finishes (its transaction commits or rolls back) and its
        connection closes after it. Every call after ``close()`` raises
        :class:`leaseq.BackendUnavailable`, on both backends."""
        self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def listener(self, queues: list[str]) -> WorkListener:
        """A blocking waiter woken when work is enqueued on ``queues``
        (PostgreSQL LISTEN/NOTIFY, through the process's one notifier connection, however many
        listen; on SQLite it only sleeps, so workers poll)."""
        for name in queues:
            checks.check_name("queue", name)
        return self.store.listener(set(queues))

    # -- several operations as one transaction ---------------------------------

    @contextlib.contextmanager
    def joined(self) -> Iterator[tuple[Self, Tx]]:
        """One transaction, and a view of this queue whose operations all run in it.

        ``with q.joined() as (view, tx):`` whatever runs on ``tx`` and every
        call on ``view`` (the usual operations, guards and queries) commit
        together when the block ends, or roll back together if it raises. The
        service checks a worker's token and serves its request this way: one
        transaction per request. A call refused by a guard (:class:`LeaseLost`)
        wrote nothing, so the block may catch it and go on.
        """
        from ..store.joined import JoinedStore

        with self.store.transaction() as tx:
            view = copy.copy(self)
            view.store = JoinedStore(self.store, tx)  # type: ignore[assignment]
            view.shared_commits = weakref.WeakKeyDictionary()  # its calls are in tx, never in the queue's
            yield view, tx

    @contextlib.asynccontextmanager
    async def ajoined(self) -> AsyncIterator[tuple[Self, Any]]:
        """:meth:`joined` for asyncio code, on the event loop: one asyncio transaction,
        and a view whose awaited operations (driven with :func:`leaseq.engine.adrive`) all run in
        it. Only where the backend has an asyncio driver (``native_async``: PostgreSQL).
        """
        from ..store.joined import CallerStore

        if not self.native_async:
            raise TypeError(f"ajoined() needs a backend with an asyncio driver; {self.dialect} has none: "
                            "use joined() in a thread")
        async with self.store.atransaction() as atx:
            view = copy.copy(self)
            view.store = CallerStore(self.store, atx=atx)
            view.shared_commits = weakref.WeakKeyDictionary()  # its calls are in atx, never in the queue's
            yield view, atx
