"""AsyncQueue: the queue's operations for asyncio applications.

Each operation is written once, awaited, in the ``*_async`` modules of :mod:`leaseq.queue`
(:class:`leaseq.Queue`'s methods are generated from them: see :mod:`leaseq.queue.generate`),
and drives the same operation of :mod:`leaseq.engine` with the same signature: on PostgreSQL
on the event loop itself (psycopg's asyncio connections), on SQLite in a thread, as sqlite3
has no asyncio form. This module adds what is written by hand on each side
(:data:`leaseq.queue.generate.HAND_WRITTEN`): closing, ``listener``, ``joined``, ``run_in``
and ``hold_attempt``. tests/conformance/test_async.py checks that every method's signature
matches.

It is also the worker runtime's port onto a database
(:class:`leaseq.worker.transport.Transport`): the runtime awaits every call
of a direct worker here, on its own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import engine
from .core import checks
from .core.capabilities import Capabilities
from .core.errors import LeaseLost
from .engine.steps import Op, T
from .queue import Queue, connect
from .queue.base_async import AsyncQueueBase
from .queue.children_async import AsyncChildOps
from .queue.effects_async import AsyncEffectOps
from .queue.enqueue_async import AsyncEnqueueOps
from .queue.leases_async import AsyncLeaseOps
from .queue.operator_async import AsyncOperatorOps
from .queue.reads_async import AsyncReadOps
from .queue.schema_async import AsyncSchemaOps


class AsyncQueue(AsyncReadOps, AsyncOperatorOps, AsyncChildOps, AsyncEffectOps, AsyncLeaseOps, AsyncEnqueueOps,
                 AsyncSchemaOps, AsyncQueueBase):
    """Asyncio facade over a :class:`Queue`. Create it with :func:`leaseq.connect_async`.

    Every method of :class:`Queue` is here as a coroutine with the same arguments and the
    same exceptions (``stream``: an ``async for``; ``joined`` and ``hold_attempt``:
    ``async with``)."""

    sync: Queue

    def __init__(self, queue: Queue):
        super().__init__(queue)

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection, the event loop's own included."""
        await self.sync.close_async()
        await asyncio.to_thread(self.sync.close)

    @property
    def capabilities(self) -> Capabilities:
        """What the worker runtime may rely on (those of the :class:`Queue` underneath)."""
        return self.sync.capabilities

    async def close_async(self) -> None:
        """Close the connections opened for the running event loop only (the queue stays open)."""
        await self.sync.close_async()

    async def listener(self, queues: list[str]) -> Any:
        """:meth:`Queue.listener` for asyncio code: a waiter woken when work is enqueued on
        ``queues``, whose ``wait(timeout)`` and ``close()`` are awaited (PostgreSQL LISTEN/NOTIFY,
        woken on the event loop through the process's one notifier connection; on SQLite it
        only sleeps, so workers poll)."""
        for name in queues:
            checks.check_name("queue", name)
        return await self.sync.store.alistener(set(queues))

    @contextlib.asynccontextmanager
    async def joined(self) -> AsyncIterator[tuple[AsyncQueue, Any]]:
        """:meth:`Queue.joined`, awaited: one transaction, and a view of this queue whose
        awaited operations all run in it, committed together when the block ends (rolled
        back together if it raises).

        On PostgreSQL the transaction is an asyncio one on the event loop, and ``tx`` is
        its asyncio transaction (``await tx.rows(query, **params)``). On SQLite, whose
        connections belong to the thread that opened them, it is held by a thread of its
        own, where every operation of the view runs; ``tx`` is that thread's transaction,
        for :meth:`run_in` (``await view.run_in(lambda tx: tx.rows(...))``).
        """
        if self.sync.native_async:
            async with self.sync.ajoined() as (view, atx):
                yield AsyncQueue(view), atx
            return
        async with _held_in_own_thread(self.sync.joined()) as ((view, tx), own):
            yield _ThreadJoined(view, own, tx), tx

    async def run_in(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(tx)`` in the transaction of a :meth:`joined` view on SQLite (on its
        thread); outside one, TypeError."""
        raise TypeError("run_in() is for the view a joined() block yields on SQLite")

    @contextlib.asynccontextmanager
    async def hold_attempt(self, task_id: int, generation: int, *, epoch: int = 0) -> AsyncIterator[None]:
        """:meth:`Queue.hold_attempt`, awaited: :class:`LeaseLost` unless attempt
        ``generation`` of ``task_id`` (lease epoch ``epoch``) holds a live lease; else the task stays
        held (no claim, cancel or expiry routing can take it) while the block runs. Keep the block short."""
        task_id = checks.check_task_id(task_id)
        generation = checks.check_int("generation", generation, minimum=0)
        epoch = checks.check_int("epoch", epoch, minimum=0)
        if not self.sync.native_async:
            async with _held_in_own_thread(self.sync.hold_attempt(task_id, generation, epoch=epoch)):
                yield
            return
        async with self.sync.store.atransaction() as atx:
            if not await atx.rows("attempt_holds_lease", task_id=task_id, generation=generation, epoch=epoch):
                raise LeaseLost(task_id, generation, "the attempt no longer holds its lease")
            yield


async def connect_async(dsn: str | None = None, **options: Any) -> AsyncQueue:
    """Open a queue for asyncio code; see :func:`leaseq.connect` for ``dsn``."""
    return AsyncQueue(await asyncio.to_thread(connect, dsn, **options))


class _OwnThread:
    """One thread of its own: a sqlite3 connection belongs to the thread that opened it, so
    a transaction held across awaits is entered, used and left on one thread."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leaseq-held")

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


@contextlib.asynccontextmanager
async def _held_in_own_thread(cm: contextlib.AbstractContextManager[T]) -> AsyncIterator[tuple[T, _OwnThread]]:
    """Enter the blocking context manager ``cm`` on a thread of its own, and leave it there."""
    own = _OwnThread()
    try:
        value = await own.call(cm.__enter__)
        try:
            yield value, own
        except BaseException as exc:
            if not await own.call(cm.__exit__, type(exc), exc, exc.__traceback__):
                raise
        else:
            await own.call(cm.__exit__, None, None, None)
    finally:
        own.close()


class _ThreadJoined(AsyncQueue):
    """The view a :meth:`AsyncQueue.joined` block yields on SQLite: every operation runs on
    the thread that holds the block's transaction."""

    def __init__(self, view: Queue, own: _OwnThread, tx: Any):
        super().__init__(view)
        self._own = own
        self._tx = tx

    async def _arun(self, op: Op[T]) -> T:
        return await self._own.call(engine.drive, self.sync.store, op)

    async def run_in(self, fn: Callable[[Any], T]) -> T:
        return await self._own.call(fn, self._tx)
