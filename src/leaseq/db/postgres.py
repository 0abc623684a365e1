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

An asyncio pool's connections are handed out in turn among the parties
waiting for one (:class:`Turns`), not first come first served: a party is
what :data:`pool_party` names while the transaction is asked for (the
service names the token a request presents). A burst of one party's
transactions (a hundred waits that end at once and are asked again) then
queues behind itself, and another party's next transaction gets the next
connection that frees, instead of the burst's last.
"""

from __future__ import annotations

import asyncio
import select
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

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


#: Whom the asyncio transactions asked for in this context are for (None: nobody in particular):
#: :class:`Turns` hands an asyncio pool's connections out in turn among them.
pool_party: ContextVar[str | None] = ContextVar("leaseq_pool_party", default=None)


class Turns:
    """At most ``size`` holders at once (an asyncio pool's connections), handed out in turn
    among the parties waiting, each party's own waiters first come first served.

    Whoever asks while a place is free and nobody waits gets it at once. When a place frees
    and some wait, it goes to the first waiter of the party after the one served last (round
    robin), so a party with many waiting takes one place in turn with each other party that
    waits, never all of them. For the event loop it was made on only.
    """

    def __init__(self, size: int):
        self.size = size
        self._free = size
        #: each waiting party's waiters, the party served next first
        self._waiting: OrderedDict[str | None, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        """How many wait for a place now."""
        return sum(len(q) for q in self._waiting.values())

    async def take(self, party: str | None, timeout: float) -> None:
        """One place, given back with :meth:`give_back`; PoolTimeout when none came in
        ``timeout`` seconds."""
        if self._free and not self._waiting:
            self._free -= 1
        else:
            await self._wait(party, timeout)

    def give_back(self) -> None:
        """The place :meth:`take` gave: to the next party's first waiter, or free."""
        self._release()

    async def _wait(self, party: str | None, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiting.setdefault(party, deque()).append(waiter)
        timer = loop.call_later(timeout, self._time_out, waiter, timeout)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release()  # given a place just as it was cancelled: hand it on
            else:
                self._forget(party, waiter)
            raise
        finally:
            timer.cancel()

    def _time_out(self, waiter: asyncio.Future[None], timeout: float) -> None:
        if not waiter.done():
            waiter.set_exception(PoolTimeout(f"no connection came in {timeout:g} s ({self.waiting} waiting)"))

    def _forget(self, party: str | None, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(party)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._waiting[party]

    def _release(self) -> None:
        while self._waiting:
            party, queue = next(iter(self._waiting.items()))
            waiter = queue.popleft()
            if queue:
                self._waiting.move_to_end(party)  # its next waiter after every other party's
            else:
                del self._waiting[party]
            if not waiter.done():
                waiter.set_result(None)  # the place passes to it
                return
        self._free += 1


class AsyncPools:
    """One asyncio pool per event loop, opened on first use (asyncio pools are bound to a loop),
    its connections handed out in turn among parties (:class:`Turns`, :data:`pool_party`).
    ``size`` is the pools' ``max_size``, ``timeout`` the longest a connection is waited for."""

    def __init__(self, open_pool: Callable[[], Any], *, size: int, timeout: float):
        self._open = open_pool
        self._size = size
        self._timeout = timeout
        self._pools: dict[asyncio.AbstractEventLoop, asyncio.Task[AsyncConnectionPool]] = {}
        self._turns: dict[asyncio.AbstractEventLoop, Turns] = {}

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """A checked connection of the running loop's pool (:func:`achecked_connection`), once it
        is the current party's turn; driver errors meaning "unavailable" as BackendUnavailable."""
        with map_driver_errors():
            pool = await self.get()
            loop = asyncio.get_running_loop()
            turns = self._turns.get(loop)
            if turns is None:
                turns = self._turns[loop] = Turns(self._size)
            await turns.take(pool_party.get(), self._timeout)
        try:
            async with achecked_connection(pool) as conn:  # which maps the block's driver errors
                yield conn
        finally:
            turns.give_back()

    async def get(self) -> AsyncConnectionPool:
        """The running loop's pool."""
        loop = asyncio.get_running_loop()
        opening = self._pools.get(loop)
        if opening is None:
            for old in [lp for lp in self._pools if lp.is_closed()]:
                del self._pools[old]  # a finished loop's pool went with it
                self._turns.pop(old, None)
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
        self._turns.pop(asyncio.get_running_loop(), None)
        if opening is not None:
            try:
                pool = await opening
            except Exception:
                return
            await pool.close()
