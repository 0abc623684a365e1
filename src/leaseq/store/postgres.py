"""PostgreSQL backend: psycopg 3 with a psycopg_pool connection pool.

What leaseq may leave on a connection depends on what stands between it and
the server, declared once by the DSN (:class:`~leaseq.db.dsn.PostgresMode`):
directly connected, its hot statements are prepared and every pooled
connection plans generically (``SET plan_cache_mode``); behind a
transaction-mode pooler (``?pooler=transaction``) or in the portable mode
(``?portable=true``) nothing outlives a transaction: no statement is prepared
on the server, no session is configured (the definer functions carry their
own ``plan_cache_mode``), and waits LISTEN on a direct connection
(``listen_dsn``) or poll every :data:`POLL_SECONDS`.
"""

from __future__ import annotations

import asyncio
import os
import select
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from ..db.dsn import PostgresMode, check_postgres_dsn, postgres_mode
from ..core.errors import AccessDenied, BackendUnavailable, InvalidInput
from ..db.errors import map_driver_errors
from ..db.postgres import AsyncPools, checked_connection, open_async_pool, open_pool
from .base import JSON_PARAMS, BackendCapabilities, JsonText, KeyConflict, load_named_queries
from .functions import wire_queries
from .notifier import AsyncTaskWait, AsyncWorkWait, Share, TaskWait, WorkWait, share
from .polling import AsyncPollingTaskListener, AsyncSleepingListener, PollingTaskListener, SleepingListener

#: How often a wait for a task's end looks again where nothing notifies (seconds): a pooled
#: DSN with no ``listen_dsn``, or the portable mode. (An idle worker claims again every
#: ``idle_poll_interval``, 0.2 s, likewise.)
POLL_SECONDS = 0.2
#: How long a new waiter waits for the notifier to listen on its channels beyond the
#: store's ``connect_timeout`` (seconds) before it fails with BackendUnavailable.
LISTEN_GRACE = 5.0


#: The statements annotated ``-- plan: generic`` in ``sql/postgres/queries.sql``:
#: prepared on their first use on a connection and run with the prepared
#: statement's generic plan (the file's header says why).
GENERIC_PLAN = frozenset(name for name, q in load_named_queries("postgres").items() if q.generic_plan)
#: The statements sent as a call of their definer function that answer no rows
#: (the call itself answers one row, of the function's void result).
SILENT = wire_queries()[1]


def _configure(conn: psycopg.Connection) -> None:
    conn.execute("SET plan_cache_mode = force_generic_plan")


async def _aconfigure(conn: psycopg.AsyncConnection) -> None:
    await conn.execute("SET plan_cache_mode = force_generic_plan")


def _rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any], query: str) -> bool:
    """Whether the statement answered with rows (pgresult.status, not
    cur.description: that would build a Column object per column per call)."""
    result = cur.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK and query not in SILENT


def _encode(params: dict[str, Any]) -> dict[str, Any]:
    return {k: ((Jsonb(v, dumps=str) if isinstance(v, JsonText) else Jsonb(v)) if k in JSON_PARAMS else v)
            for k, v in params.items()}


def _wrong_connection(connection: Any, wanted: str) -> str:
    kind = f"{type(connection).__module__}.{type(connection).__qualname__}"
    return f"must be {wanted} to the queue's PostgreSQL database (got {kind})"


def _check_in_transaction(autocommit: bool, status: pq.TransactionStatus) -> None:
    if status == pq.TransactionStatus.INERROR:
        raise InvalidInput("connection", "its transaction has failed: roll it back first")
    if autocommit and status == pq.TransactionStatus.IDLE:
        raise InvalidInput("connection", "is in autocommit mode with no transaction open: the task would be "
                                         "committed at once; open one (with conn.transaction(): ...)")


def _refused(exc: psycopg.errors.InsufficientPrivilege) -> AccessDenied:
    """What the database refused a role (a definer function's check, or a privilege it lacks),
    as the library's own error: the same one the service answers with (403)."""
    return AccessDenied(f"the database refused this role: {exc.diag.message_primary or str(exc).strip()}")


class _Statements:
    """What :class:`PostgresTx` and :class:`AsyncPostgresTx` keep about the statements they run.

    With ``one_statement`` no BEGIN or COMMIT is sent: the single statement
    the caller runs is its own transaction (one round trip instead of three),
    and a second statement is refused rather than silently committed apart.
    """

    def __init__(self, queries: dict[str, str], *, one_statement: bool, caller: bool, prepare: bool):
        self._queries = queries
        self._statements_left = 1 if one_statement else -1
        #: the application's own connection: its row factory is not ours, and nothing is prepared on it
        self._caller = caller
        #: the "plan: generic" statements are prepared (not behind a transaction-mode pooler)
        self._prepare = GENERIC_PLAN if prepare else frozenset()

    def _one_more(self, query: str) -> None:
        """Count ``query`` as run, refusing it where the one statement already ran."""
        if self._statements_left == 0:
            raise RuntimeError(f"{query}: a one-statement transaction already ran its statement")
        self._statements_left -= 1


class PostgresTx(_Statements):
    """A transaction on one pooled connection (``one_statement``: see :class:`_Statements`)."""

    # Any rows: the pool's connections make dicts (dict_row); a caller's connection
    # may make anything, and is read through a dict_row cursor of its own.
    def __init__(self, conn: psycopg.Connection[Any], queries: dict[str, str], *, one_statement: bool = False,
                 caller: bool = False, prepare: bool = True):
        super().__init__(queries, one_statement=one_statement, caller=caller, prepare=prepare)
        self._conn = conn

    def rows(self, query: str, **params: Any) -> list[dict[str, Any]]:
        self._one_more(query)
        if self._caller:
            with self._conn.cursor(row_factory=dict_row) as own:
                own.execute(self._queries[query], _encode(params), prepare=False)
                return own.fetchall() if _rows(own, query) else []
        cur = self._conn.execute(self._queries[query], _encode(params), prepare=query in self._prepare)
        return cur.fetchall() if _rows(cur, query) else []

    def row(self, query: str, **params: Any) -> dict[str, Any] | None:
        rows = self.rows(query, **params)
        return rows[0] if rows else None

    def rows_together(self, steps: list[tuple[str, dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        """The rows of each of ``steps`` (``(query, params)``), run one after another as
        :meth:`rows` runs each, sent together and answered in one round trip (psycopg's
        pipeline mode). A statement that fails raises its error here once all were sent; the
        statements after it did not run, and the transaction is failed."""
        if len(steps) > self._statements_left >= 0:
            raise RuntimeError(f"{steps[0][0]}: a one-statement transaction runs one statement")
        if self._caller or len(steps) < 2 or not psycopg.Pipeline.is_supported():
            return [self.rows(query, **params) for query, params in steps]
        sent: list[tuple[psycopg.Cursor[Any], str]] = []
        with self._conn.pipeline():
            for query, params in steps:
                cur = self._conn.cursor()
                cur.execute(self._queries[query], _encode(params), prepare=query in self._prepare)
                sent.append((cur, query))
        # the pipeline's end synced it: every answer is in
        return [cur.fetchall() if _rows(cur, query) else [] for cur, query in sent]

    def run_many(self, query: str, params: list[dict[str, Any]]) -> None:
        if self._statements_left >= 0:
            raise RuntimeError(f"{query}: run_many needs a full transaction")
        if params:
            with self._conn.cursor() as cur:
                cur.executemany(self._queries[query], [_encode(p) for p in params])

    def script(self, sql: str) -> None:
        self._conn.execute(sql)  # no parameters: psycopg sends it as one simple query


class AsyncPostgresTx(_Statements):
    """:class:`PostgresTx` on an asyncio connection: the same statements, awaited."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], queries: dict[str, str], *, one_statement: bool = False,
                 caller: bool = False, prepare: bool = True):
        super().__init__(queries, one_statement=one_statement, caller=caller, prepare=prepare)
        self._conn = conn

    async def rows(self, query: str, **params: Any) -> list[dict[str, Any]]:
        self._one_more(query)
        if self._caller:
            async with self._conn.cursor(row_factory=dict_row) as own:
                await own.execute(self._queries[query], _encode(params), prepare=False)
                return await own.fetchall() if _rows(own, query) else []
        cur = await self._conn.execute(self._queries[query], _encode(params), prepare=query in self._prepare)
        return await cur.fetchall() if _rows(cur, query) else []

    async def rows_together(self, steps: list[tuple[str, dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        """The rows of each of ``steps`` (``(query, params)``), run one after another as
        :meth:`rows` runs each, sent together and answered in one round trip (psycopg's
        pipeline mode) rather than one each. A statement that fails raises its error here
        once all were sent; the statements after it did not run, and the transaction is failed."""
        if len(steps) > self._statements_left >= 0:
            raise RuntimeError(f"{steps[0][0]}: a one-statement transaction runs one statement")
        if self._caller or not psycopg.AsyncPipeline.is_supported():  # pragma: no cover - libpq < 14
            return [await self.rows(query, **params) for query, params in steps]
        sent: list[tuple[psycopg.AsyncCursor[Any], str]] = []
        async with self._conn.pipeline():
            for query, params in steps:
                cur = self._conn.cursor()
                await cur.execute(self._queries[query], _encode(params), prepare=query in self._prepare)
                sent.append((cur, query))
        # the pipeline's end synced it: every answer is in
        return [await cur.fetchall() if _rows(cur, query) else [] for cur, query in sent]

    async def script(self, sql: str) -> None:
        await self._conn.execute(sql)


class SharedListener:
    """The connection of a process's :class:`~leaseq.store.notifier.Notifier`: a dedicated
    one (autocommit, outside the pools), LISTENing on the channels its thread asks for
    (``leaseq_work``, ``leaseq_interrupt``, a task's ``leaseq_task_<id>``).

    One thread drives it: :meth:`wait` returns the notifications heard, as
    ``(channel, payload)``; :meth:`poke`, from any thread, ends a wait early so
    that thread can change what the connection listens to. However many
    waiters a process has, it holds this one connection for all of them.
    """

    def __init__(self, dsn: str, *, connect_timeout: float | None = None):
        with map_driver_errors():
            timeout: dict[str, Any] = {} if connect_timeout is None else \
                {"connect_timeout": max(1, round(connect_timeout))}
            self._conn = psycopg.connect(dsn, autocommit=True, **timeout)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def listen(self, channel: str) -> None:
        """LISTEN on ``channel``, a plain identifier (the driving thread only)."""
        self._run(f"LISTEN {channel}")

    def unlisten(self, channel: str) -> None:
        """UNLISTEN ``channel`` (the driving thread only)."""
        self._run(f"UNLISTEN {channel}")

    def _run(self, statement: str) -> None:
        try:
            self._conn.execute(statement)
        except psycopg.Error as exc:
            raise BackendUnavailable(f"PostgreSQL listener: {str(exc).strip()}") from None

    def poke(self) -> None:
        """End the driving thread's :meth:`wait` now (callable from any thread)."""
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):  # already poked, or closed
            pass

    def wait(self, timeout: float) -> list[tuple[str, str]]:
        """The notifications heard within ``timeout`` seconds (fewer: poked, or none came)."""
        try:
            notes = self._heard()  # what arrived while a statement of ours ran
            if notes:
                return notes
            ready, _, _ = select.select([self._conn.fileno(), self._wake_r], [], [], timeout)
            if self._wake_r in ready:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            return self._heard() if self._conn.fileno() in ready else []
        except psycopg.Error as exc:
            raise BackendUnavailable(f"PostgreSQL listener: {str(exc).strip()}") from None
        except (OSError, ValueError) as exc:  # the socket went away under the select
            raise BackendUnavailable(f"PostgreSQL listener: {exc}") from None

    def _heard(self) -> list[tuple[str, str]]:
        return [(n.channel, n.payload) for n in self._conn.notifies(timeout=0)]

    def close(self) -> None:
        try:
            self._conn.close()
        finally:
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:  # pragma: no cover - closed already
                    pass


class AsyncSharedListener:
    """:class:`SharedListener` on an event loop: the notifier's connection when the process's
    first waiter is an asyncio one (:class:`~leaseq.store.notifier.Notifier` then runs on that
    waiter's loop, as a task, not a thread). The loop itself watches the socket, so a
    notification wakes the loop's thread directly, with no thread handing it over.

    One task drives it (:meth:`wait`, :meth:`listen`, :meth:`unlisten`); :meth:`poke` may be
    called from any thread.
    """

    def __init__(self, conn: psycopg.AsyncConnection[Any]):
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._heard: list[tuple[str, str]] = []
        self._woke: asyncio.Future[None] | None = None
        self._poked = False
        self._error: BackendUnavailable | None = None
        self._to: Callable[[str, str], None] | None = None
        # Notifications read with a statement's answer (a LISTEN's) or by _readable come here.
        conn.add_notify_handler(self._notified)

    def _notified(self, n: psycopg.Notify) -> None:
        if self._to is not None:
            self._to(n.channel, n.payload)
        else:
            self._heard.append((n.channel, n.payload))

    def deliver(self, to: Callable[[str, str], None]) -> None:
        """Hand each notification to ``to`` as soon as the loop reads it (:meth:`wait` then
        returns none): in the turn the socket was ready, not a turn later."""
        self._to = to
        heard, self._heard = self._heard, []
        for channel, payload in heard:
            to(channel, payload)

    @classmethod
    async def open(cls, dsn: str, *, connect_timeout: float | None = None) -> AsyncSharedListener:
        """A connection for the notifier, opened on the running loop."""
        with map_driver_errors():
            timeout: dict[str, Any] = {} if connect_timeout is None else \
                {"connect_timeout": max(1, round(connect_timeout))}
            conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, **timeout)
        return cls(conn)

    async def listen(self, channel: str) -> None:
        """LISTEN on ``channel``, a plain identifier (the driving task only)."""
        await self._run(f"LISTEN {channel}")

    async def unlisten(self, channel: str) -> None:
        """UNLISTEN ``channel`` (the driving task only)."""
        await self._run(f"UNLISTEN {channel}")

    async def _run(self, statement: str) -> None:
        try:
            await self._conn.execute(statement)
        except psycopg.Error as exc:
            raise BackendUnavailable(f"PostgreSQL listener: {str(exc).strip()}") from None

    def poke(self) -> None:
        """End the driving task's :meth:`wait` now (callable from any thread)."""
        try:
            self._loop.call_soon_threadsafe(self._poke)
        except RuntimeError:  # its loop closed: nothing waits
            pass

    def _poke(self) -> None:
        self._poked = True
        self._end_wait()

    def _end_wait(self) -> None:
        if self._woke is not None and not self._woke.done():
            self._woke.set_result(None)

    def _readable(self) -> None:
        try:
            pgconn = self._conn.pgconn
            pgconn.consume_input()
            while (n := pgconn.notifies()) is not None:
                if pgconn.notify_handler is not None:
                    pgconn.notify_handler(n)
        except psycopg.Error as exc:
            self._error = BackendUnavailable(f"PostgreSQL listener: {str(exc).strip()}")
        if self._error is not None or self._heard:
            self._end_wait()

    async def wait(self, timeout: float) -> list[tuple[str, str]]:
        """The notifications heard within ``timeout`` seconds (fewer: poked, or none came)."""
        if not self._heard and not self._poked and self._error is None:
            try:
                fd = self._conn.pgconn.socket
            except psycopg.Error as exc:
                raise BackendUnavailable(f"PostgreSQL listener: {str(exc).strip()}") from None
            self._woke = self._loop.create_future()
            self._loop.add_reader(fd, self._readable)
            timer = self._loop.call_later(max(0.0, timeout), self._end_wait)
            try:
                await self._woke
            finally:
                timer.cancel()
                self._loop.remove_reader(fd)
                self._woke = None
        self._poked = False
        if self._error is not None:
            raise self._error
        heard, self._heard = self._heard, []
        return heard

    async def close(self) -> None:
        await self._conn.close()


class PostgresStore:
    """leaseq's tables in a PostgreSQL database, reached through a pool.

    The tables live in the connection's ``search_path`` (``public`` unless the
    DSN says otherwise, e.g. ``?options=-csearch_path%3Dmyschema``). Pooled
    connections are checked at checkout (see :mod:`leaseq.db.postgres`), so a
    server restart does not fail one call per stale connection.
    """

    dialect = "postgres"
    capabilities = BackendCapabilities(native_async=True, writes_own_evidence=True, own_limit_slots=True,
                                       own_fair_share=True, lean_claim=True, lean_complete=True,
                                       listen_notify=True,
                                       serial_writes=False)

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 10, connect_timeout: float = 10.0,
                 pooler: str | None = None, portable: bool | None = None, listen_dsn: str | None = None):
        #: the DSN as given (leaseq's own options included: what a process started from this one is given)
        self.dsn = dsn
        conninfo, mode = postgres_mode(dsn, pooler=pooler, portable=portable, listen_dsn=listen_dsn)
        #: what may be left on a connection, and whether waits are notified (see the module's docstring)
        self.mode: PostgresMode = mode
        #: the DSN libpq is given (leaseq's own options removed)
        self.conninfo = conninfo
        if not mode.listens or mode.portable:
            self.capabilities = replace(type(self).capabilities, listen_notify=mode.listens,
                                        advisory_locks=not mode.portable)
        #: where LISTEN connections go: the pool's own server, or the direct connection named for them
        self._listen_dsn = mode.listen_dsn or conninfo
        self._connect_timeout = connect_timeout
        self._queries = wire_queries()[0]
        check_postgres_dsn(conninfo, connect_timeout)
        # Behind a transaction-mode pooler a connection's next transaction may run in another
        # server session: nothing is prepared on it (prepare_threshold=None: psycopg never
        # prepares by itself either) and nothing is SET on it.
        session = {} if mode.session_state else {"prepare_threshold": None}
        self._pool = open_pool(conninfo, min_size=min_size, max_size=max_size, timeout=connect_timeout,
                               configure=_configure if mode.session_state else None, row_factory=dict_row,
                               **session)
        #: asyncio pools, one per event loop that opened an async transaction
        self._async_pools = AsyncPools(lambda: open_async_pool(
            conninfo, min_size=1, max_size=max_size, timeout=connect_timeout,
            configure=_aconfigure if mode.session_state else None, row_factory=dict_row, **session),
            size=max_size, timeout=connect_timeout)
        #: this store's share of the process's one LISTEN connection for its listening DSN, which
        #: every waiter of the process is woken through (None where nothing notifies)
        self.notifier: Share | None = None
        if mode.listens:
            listen_dsn = self._listen_dsn
            self.notifier = share(listen_dsn, lambda: SharedListener(listen_dsn, connect_timeout=connect_timeout),
                                  aconnect=lambda: AsyncSharedListener.open(listen_dsn, connect_timeout=connect_timeout))

    @contextmanager
    def transaction(self, *, one_statement: bool = False) -> Iterator[PostgresTx]:
        try:
            with checked_connection(self._pool) as conn:
                if one_statement:  # the connection is in autocommit mode
                    yield PostgresTx(conn, self._queries, one_statement=True, prepare=self.mode.session_state)
                else:
                    with conn.transaction():
                        yield PostgresTx(conn, self._queries, prepare=self.mode.session_state)
        except psycopg.errors.UniqueViolation as exc:
            raise KeyConflict(str(exc).strip()) from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise _refused(exc) from None

    @asynccontextmanager
    async def atransaction(self, *, one_statement: bool = False) -> AsyncIterator[AsyncPostgresTx]:
        """:meth:`transaction` on the running event loop's asyncio pool.

        The socket is waited on by the loop itself: no thread hop between
        the event loop and the database (the worker's claims and completions
        come through here)."""
        try:
            async with self._async_pools.connection() as conn:
                if one_statement:  # the connection is in autocommit mode
                    yield AsyncPostgresTx(conn, self._queries, one_statement=True, prepare=self.mode.session_state)
                else:
                    async with conn.transaction():
                        yield AsyncPostgresTx(conn, self._queries, prepare=self.mode.session_state)
        except psycopg.errors.UniqueViolation as exc:
            raise KeyConflict(str(exc).strip()) from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise _refused(exc) from None

    async def close_async(self) -> None:
        """Close the running loop's asyncio pool (the worker does, before its loop ends)."""
        await self._async_pools.close_running()

    def listener(self, queues: set[str], *,
                 on_interrupt: Callable[[str], None] | None = None) -> WorkWait | SleepingListener:
        """A waiter woken by NOTIFY (where nothing can notify: one that sleeps, and the worker polls),
        listening when returned, through the process's one notifier connection."""
        if self.notifier is None:
            return SleepingListener()
        return WorkWait(self.notifier, queues, on_interrupt).open(self._listen_timeout)

    async def alistener(self, queues: set[str]) -> AsyncWorkWait | AsyncSleepingListener:
        """:meth:`listener` for asyncio code (woken on the running event loop)."""
        if self.notifier is None:
            return AsyncSleepingListener()
        return await AsyncWorkWait(self.notifier, queues).open(self._listen_timeout)

    @property
    def _listen_timeout(self) -> float:
        """How long a new waiter waits for the notifier to listen on its channels."""
        return self._connect_timeout + LISTEN_GRACE

    def task_listener(self, task_id: int, *, streams: bool = False) -> TaskWait | PollingTaskListener:
        """A waiter woken when task ``task_id`` ends (or parks); see :meth:`leaseq.Queue.wait`;
        with ``streams``, also when its handler emits (:meth:`leaseq.Queue.stream`). It is
        listening when returned, through the process's one :attr:`notifier` connection
        (however many wait). Where nothing notifies, it sleeps :data:`POLL_SECONDS` and
        the waiter looks again."""
        if self.notifier is None:
            return PollingTaskListener(POLL_SECONDS)
        return TaskWait(self.notifier, task_id, streams=streams).open(self._listen_timeout)

    async def atask_listener(self, task_id: int, *,
                             streams: bool = False) -> AsyncTaskWait | AsyncPollingTaskListener:
        """:meth:`task_listener` for asyncio code (woken on the running event loop)."""
        if self.notifier is None:
            return AsyncPollingTaskListener(POLL_SECONDS)
        return await AsyncTaskWait(self.notifier, task_id, streams=streams).open(self._listen_timeout)

    def caller_tx(self, connection: Any) -> PostgresTx:
        """A transaction view of the application's own open psycopg ``connection``
        (``enqueue(..., connection=)``): leaseq's statements run in the caller's
        transaction, which the caller commits or rolls back."""
        if isinstance(connection, psycopg.AsyncConnection):
            raise InvalidInput("connection", "is an asyncio psycopg connection: pass it to AsyncQueue, or "
                                             "a psycopg.Connection here")
        if not isinstance(connection, psycopg.Connection):
            raise InvalidInput("connection", _wrong_connection(connection, "a psycopg.Connection"))
        _check_in_transaction(connection.autocommit, connection.info.transaction_status)
        return PostgresTx(connection, self._queries, caller=True)

    def acaller_tx(self, connection: Any) -> AsyncPostgresTx:
        """:meth:`caller_tx` for an asyncio psycopg connection."""
        if not isinstance(connection, psycopg.AsyncConnection):
            raise InvalidInput("connection", _wrong_connection(connection, "a psycopg.AsyncConnection"))
        _check_in_transaction(connection.autocommit, connection.info.transaction_status)
        return AsyncPostgresTx(connection, self._queries, caller=True)

    def close(self) -> None:
        if self.notifier is not None:
            self.notifier.close()
        self._pool.close()
