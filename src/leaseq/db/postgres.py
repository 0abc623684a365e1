"""psycopg pools whose connections are checked at checkout, sync and asyncio.

A pooled connection the server has dropped (a restart, a failover, a pooler
restart, ``pg_terminate_backend``) looks healthy to the client until it is
used. Checking each connection with a round trip at checkout would add one
round trip to every claim and completion, so the check is a zero-timeout
``poll()`` of the connection's socket instead: an idle pooled connection has
nothing to read unless the server has spoken on its own, which for a pool
connection (it never LISTENs) means the server sent its FATAL message and
closed the socket. Only such a suspect connection gets a round trip
(``SELECT`` of nothing); a dead one is closed and the next one is taken at
once, so after a restart the stale connections are all replaced within one
checkout rather than failing one call each. (psycopg_pool's own ``check=``
hook would do the round trip every time, and backs off a second, two,
four... between consecutive failed checks.)

A connection dropped *silently* (a host that vanished, no FIN) cannot be
seen without a round trip that would hang until TCP gives up; the call that
meets it fails with :class:`leaseq.BackendUnavailable` and the broken
connection is discarded when it goes back to the pool.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from .errors import map_driver_errors


def _suspect(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """Whether an idle pooled connection may be dead, judged without a round trip."""
    pgconn = conn.pgconn
    if conn.closed or pgconn.status != pq.ConnStatus.OK:
        return True
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN)
    return bool(poller.poll(0))


def _healthy(conn: psycopg.Connection) -> bool:
    if not _suspect(conn):
        return True
    if conn.closed:
        return False
    try:
        conn.execute("")
    except psycopg.Error:
        conn.close()
        return False
    return True


async def _ahealthy(conn: psycopg.AsyncConnection) -> bool:
    if not _suspect(conn):
        return True
    if conn.closed:
        return False
    try:
        await conn.execute("")
    except psycopg.Error:
        await conn.close()
        return False
    return True


def open_pool(dsn: str, *, min_size: int, max_size: int, timeout: float,
              configure: Callable[[psycopg.Connection], None] | None = None,
              **kwargs: Any) -> ConnectionPool:
    """An open pool of autocommit connections; ``kwargs`` go to ``psycopg.connect``."""
    pool = ConnectionPool(dsn, min_size=min_size, max_size=max_size, open=False, timeout=timeout,
                          kwargs={"autocommit": True, **kwargs}, configure=configure)
    with map_driver_errors():
        pool.open(wait=True, timeout=timeout)
    return pool


async def open_async_pool(dsn: str, *, min_size: int, max_size: int, timeout: float,
                          configure: Callable[[psycopg.AsyncConnection], Any] | None = None,
                          **kwargs: Any) -> AsyncConnectionPool:
    """The asyncio twin of :func:`open_pool`."""
    pool = AsyncConnectionPool(dsn, min_size=min_size, max_size=max_size, open=False, timeout=timeout,
                               kwargs={"autocommit": True, **kwargs}, configure=configure)
    with map_driver_errors():
        await pool.open(wait=True, timeout=timeout)
    return pool


@contextmanager
def checked_connection(pool: ConnectionPool) -> Iterator[psycopg.Connection]:
    """A pooled connection that is not known to be dead, returned to the pool afterwards.

    Driver errors meaning "unavailable" (including those raised by the
    caller's statements) come out as :class:`leaseq.BackendUnavailable`.
    """
    with map_driver_errors():
        held = pool.getconn()
        conn: psycopg.Connection | None = held  # what the finally returns to the pool
        try:
            # Every connection of the pool may be stale (a restart): try each once,
            # then one more, which the pool has had to open afresh.
            for _ in range(pool.max_size):
                if _healthy(held):
                    break
                conn = None
                pool.putconn(held)  # closed: the pool discards it and opens a replacement
                held = conn = pool.getconn()
            yield held
        finally:
            if conn is not None:
                pool.putconn(conn)  # a connection left broken or mid-transaction is discarded or reset


@asynccontextmanager
async def achecked_connection(pool: AsyncConnectionPool) -> AsyncIterator[psycopg.AsyncConnection]:
    """The asyncio twin of :func:`checked_connection`."""
    with map_driver_errors():
        held = await pool.getconn()
        conn: psycopg.AsyncConnection | None = held
        try:
            for _ in range(pool.max_size):
                if await _ahealthy(held):
                    break
                conn = None
                await pool.putconn(held)
                held = conn = await pool.getconn()
            yield held
        finally:
            if conn is not None:
                await pool.putconn(conn)


class AsyncPools:
    """One asyncio pool per event loop, opened on first use (asyncio pools are bound to a loop)."""

    def __init__(self, open_pool: Callable[[], Any]):
        self._open = open_pool
        self._pools: dict[asyncio.AbstractEventLoop, asyncio.Task[AsyncConnectionPool]] = {}

    async def get(self) -> AsyncConnectionPool:
        """The running loop's pool."""
        loop = asyncio.get_running_loop()
        opening = self._pools.get(loop)
        if opening is None:
            for old in [lp for lp in self._pools if lp.is_closed()]:
                del self._pools[old]  # a finished loop's pool went with it
            # A task, so callers racing to open the loop's pool all await the same one.
            opening = self._pools[loop] = loop.create_task(self._open())
        try:
            return await asyncio.shield(opening)
        except Exception:
            if self._pools.get(loop) is opening:
                del self._pools[loop]  # the next call tries again
            raise

    async def close_running(self) -> None:
        """Close the running loop's pool, if it opened one."""
        opening = self._pools.pop(asyncio.get_running_loop(), None)
        if opening is not None:
            try:
                pool = await opening
            except Exception:
                return
            await pool.close()
