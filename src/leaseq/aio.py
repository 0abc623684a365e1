"""AsyncQueue: the same operations for asyncio applications.

Each coroutine runs the synchronous operation of :class:`leaseq.queue.Queue`
in a worker thread, so the lease logic exists once. Database calls are short
and bounded; the pool (PostgreSQL) or per-thread connections (SQLite) let
many of them run at once without blocking the event loop. The two calls a
busy worker makes most, ``claim`` and ``complete_many``, are the Queue's own
coroutines (:meth:`Queue.aclaim`, :meth:`Queue.acomplete_many`): on
PostgreSQL they await the same statements on the event loop itself.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from .queue import Queue, connect

#: The Queue methods offered as coroutines.
OPERATIONS = (
    "migrate", "schema_version", "register_worker", "revoke_worker", "workers", "enqueue",
    "heartbeat", "renew_leases", "complete", "fail", "release", "sweep", "begin_effect", "finish_effect",
    "effects", "cancel", "reconcile", "unblock", "requeue", "pause", "resume", "queues", "get", "list",
    "events", "stats", "now", "enqueue_many", "report_loss", "prune",
)


class AsyncQueue:
    """Asyncio facade over a :class:`Queue`. Create it with :func:`leaseq.connect_async`."""

    def __init__(self, queue: Queue):
        self.sync = queue

    @property
    def dialect(self) -> str:
        """``"postgres"`` or ``"sqlite"``."""
        return self.sync.dialect

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def claim(self, worker: Any, *, queue: str = "default", limit: int = 1,
                    lease_seconds: float | None = None, kinds: Any = None) -> list[Any]:
        """:meth:`Queue.claim`, awaited on the loop where the backend can."""
        return await self.sync.aclaim(worker, queue=queue, limit=limit, lease_seconds=lease_seconds, kinds=kinds)

    async def complete_many(self, worker: Any, done: Any) -> set[int]:
        """:meth:`Queue.complete_many`, awaited on the loop where the backend can."""
        return await self.sync.acomplete_many(worker, done)

    async def close(self) -> None:
        """Close every connection, the event loop's own included."""
        await self.sync.close_async()
        await asyncio.to_thread(self.sync.close)


def _coroutine(name: str) -> Any:
    method = getattr(Queue, name)

    @functools.wraps(method)
    async def call(self: AsyncQueue, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self.sync, name), *args, **kwargs)

    return call


for _name in OPERATIONS:
    setattr(AsyncQueue, _name, _coroutine(_name))


async def connect_async(dsn: str | None = None, **options: Any) -> AsyncQueue:
    """Open a queue for asyncio code; see :func:`leaseq.connect` for ``dsn``."""
    return AsyncQueue(await asyncio.to_thread(connect, dsn, **options))
