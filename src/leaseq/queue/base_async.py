"""The foundation of the awaited operations: the settings, and running an operation on the event loop.

Every ``*_async`` operation module of this package (:mod:`.leases_async`, :mod:`.reads_async`...)
adds its methods to :class:`AsyncQueueBase`; :class:`leaseq.AsyncQueue` is all of them together.
Their blocking twins (:mod:`.leases`, :mod:`.reads`...) are generated from them by
:mod:`.generate`, which renames what this class offers to what :class:`.base.QueueBase` offers
(``_arun`` to ``_run``...).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .. import engine
from ..core.errors import BackendUnavailable
from ..engine.shared import SharedCommits
from ..engine.steps import Op, T
from .base import QueueBase
from .base import replayable as replayable  # the generated modules import it from either


class AsyncQueueBase:
    """What every awaited operation relies on: the blocking queue underneath (its backend and
    settings) and the drivers that run an operation of :mod:`leaseq.engine` on the event loop:
    on PostgreSQL on the loop itself (psycopg's asyncio connections), on SQLite in a thread,
    as sqlite3 has no asyncio form."""

    def __init__(self, queue: QueueBase):
        #: the blocking queue whose backend, settings and connections the awaited calls use
        self.sync = queue
        self.settings = queue.settings

    @property
    def dialect(self) -> str:
        """``"postgres"`` or ``"sqlite"``."""
        return self.sync.dialect

    async def _arun(self, op: Op[T]) -> T:
        return await engine.adrive(self.sync.store, op)

    async def _ashared(self, make: Callable[[], Op[T]]) -> T:
        """Run ``make()``'s operation in a transaction shared with the calls of this event loop
        made while others are being written (:mod:`leaseq.engine.shared`), where the backend has
        an asyncio driver; else as :meth:`_arun`."""
        if not self.sync.store.capabilities.native_async:
            return await self._arun(make())
        loop = asyncio.get_running_loop()
        shared = self.sync.shared_commits.get(loop)
        if shared is None:
            shared = self.sync.shared_commits[loop] = SharedCommits(self.sync.store)
        return await shared.run(make)

    async def _arun_again(self, make: Callable[[], Op[T]]) -> T:
        """:meth:`.base.QueueBase._run_again`, awaited: the operation run again from its start when
        PostgreSQL rolled it back to break a lock cycle."""
        attempt = 1
        while True:
            try:
                return await self._arun(make())
            except BackendUnavailable as exc:
                if not self.sync._run_again_after(exc, attempt):
                    raise
                attempt += 1

    async def _arun_in(self, connection: Any, op: Op[T]) -> T:
        """Run ``op`` in the application's own open transaction on ``connection``; never commits.

        Awaited on the event loop where the backend has an asyncio driver;
        else (a sqlite3 connection, bound to its thread) run right here: the
        statements are local and short."""
        from ..store.joined import CallerStore

        store = self.sync.store
        try:
            joined = (CallerStore(store, atx=store.acaller_tx(connection)) if store.capabilities.native_async
                      else CallerStore(store, tx=store.caller_tx(connection)))
        except BaseException:
            op.close()
            raise
        if joined.capabilities.native_async:
            return await engine.adrive(joined, op)
        return engine.drive(joined, op)

    async def _atask_listener(self, task_id: int, *, streams: bool = False) -> Any:
        """A waiter woken when task ``task_id`` may have ended (``streams``: or its handler emitted),
        whose ``wait`` and ``close`` are awaited."""
        return await self.sync.store.atask_listener(task_id, streams=streams)
