"""AsyncQueue: the same operations for asyncio applications.

Each coroutine runs the synchronous operation of :class:`leaseq.queue.Queue`
in a worker thread, so the lease logic exists once. Database calls are short
and bounded; the pool (PostgreSQL) or per-thread connections (SQLite) let
many of them run at once without blocking the event loop.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from .queue import Queue, connect

#: The Queue methods offered as coroutines.
OPERATIONS = (
    "migrate", "schema_version", "register_worker", "revoke_worker", "workers", "enqueue", "claim",
    "heartbeat", "renew_leases", "complete", "fail", "release", "sweep", "begin_effect", "finish_effect",
    "effects", "cancel", "reconcile", "unblock", "requeue", "pause", "resume", "queues", "get", "list",
    "events", "stats", "now", "close", "enqueue_many", "complete_many", "report_loss", "prune",
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
