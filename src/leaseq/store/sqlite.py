"""SQLite backend: the standard library's sqlite3, WAL mode, one connection per thread."""

from __future__ import annotations

import functools
import json
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from datetime import datetime, timezone
from typing import Any

from ..core.errors import InvalidInput
from ..db.sqlite import SqliteConnections
from .base import JSON_COLUMNS, BackendCapabilities, JSON_PARAMS, JsonText, KeyConflict, load_named_queries
from .polling import AsyncPollingTaskListener, AsyncSleepingListener, PollingTaskListener, SleepingListener

_BOOL_COLUMNS = frozenset({"paused"})


def _to_time(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=timezone.utc)


@functools.lru_cache(maxsize=256)
def _decoders(columns: tuple[str, ...]) -> tuple[tuple[int, str, Callable[[Any], Any]], ...]:
    """For one result shape: which columns need converting, and how (worked out once)."""
    plan: list[tuple[int, str, Callable[[Any], Any]]] = []
    for i, key in enumerate(columns):
        if key in JSON_COLUMNS:
            plan.append((i, key, json.loads))
        elif key == "at" or key.endswith("_at") or key == "now":
            plan.append((i, key, _to_time))
        elif key in _BOOL_COLUMNS:
            plan.append((i, key, bool))
    return tuple(plan)


def _decode_all(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
    """Every row of ``cur`` as a dict, times as aware datetimes and JSON decoded."""
    rows = cur.fetchall()
    if not rows:
        return []
    columns = tuple(d[0] for d in cur.description)
    plan = _decoders(columns)
    out = []
    for row in rows:
        values = list(row)
        for i, _, convert in plan:
            if values[i] is not None:
                values[i] = convert(values[i])
        out.append(dict(zip(columns, values)))
    return out


def _encode(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in params.items():
        if isinstance(value, JsonText):
            value = str(value)
        elif key in JSON_PARAMS or isinstance(value, (list, tuple, dict)):
            value = json.dumps(value)
        elif isinstance(value, datetime):  # times are stored as Unix seconds
            value = value.timestamp()
        out[key] = value
    return out


_WRITABLE_SCHEMA_OFF = re.compile(r"^\s*PRAGMA\s+writable_schema\s*=\s*(OFF|0|FALSE)\s*;?\s*$", re.I)


class SqliteTx:
    """A transaction on one SQLite connection."""

    def __init__(self, conn: sqlite3.Connection, queries: dict[str, str | None], *, caller: bool = False):
        self._conn = conn
        self._queries = queries
        #: the application's own connection: its row factory is not ours
        self._caller = caller

    def rows(self, query: str, **params: Any) -> list[dict[str, Any]]:
        sql = self._queries[query]
        if sql is None:  # annotated "-- no-op:" for SQLite: nothing to run
            return []
        if self._caller:
            cur = self._conn.cursor()
            cur.row_factory = None
            return _decode_all(cur.execute(sql, _encode(params)))
        return _decode_all(self._conn.execute(sql, _encode(params)))

    def row(self, query: str, **params: Any) -> dict[str, Any] | None:
        rows = self.rows(query, **params)
        return rows[0] if rows else None

    def run_many(self, query: str, params: list[dict[str, Any]]) -> None:
        sql = self._queries[query]
        if params and sql is not None:
            self._conn.executemany(sql, [_encode(p) for p in params])

    def script(self, sql: str) -> None:
        statement = ""
        for line in sql.splitlines(keepends=True):
            statement += line
            if sqlite3.complete_statement(statement):
                self._statement(statement)
                statement = ""
        if statement.strip():
            self._statement(statement)

    def _statement(self, statement: str) -> None:
        if _WRITABLE_SCHEMA_OFF.match(statement):
            # A migration edited sqlite_schema directly (to widen a CHECK): raise the
            # schema cookie in the same transaction, so that this and every other
            # open connection reloads the schema instead of using its stale copy.
            (version,) = self._conn.execute("PRAGMA schema_version").fetchone()
            self._conn.execute(f"PRAGMA schema_version = {int(version) + 1}")
        self._conn.execute(statement)


#: How often a wait for a task's end looks again on SQLite (seconds).
WAIT_POLL = 0.05


class SqliteStore:
    """leaseq's tables in one SQLite file.

    Each thread gets its own connection (sqlite3 connections are not shared
    across threads). Writes run in ``BEGIN IMMEDIATE`` transactions, which take
    the file's write lock at once, so a claim's read and its update cannot be
    split by another writer.
    """

    dialect = "sqlite"
    #: nothing notifies (see :attr:`leaseq.store.base.Store.notifier`): waiters poll
    notifier = None
    capabilities = BackendCapabilities(native_async=False, writes_own_evidence=False, listen_notify=False,
                                       serial_writes=True)

    def __init__(self, path: str, *, busy_timeout: float = 30.0):
        self.path = path
        self.dsn = f"sqlite:///{path}"
        #: the SQL of each named query; None for the ones annotated "-- no-op:"
        self._queries = {name: None if q.noop else q.sql for name, q in load_named_queries("sqlite").items()}
        self._connections = SqliteConnections(path, busy_timeout=busy_timeout, pragmas=("PRAGMA foreign_keys=ON",))
        # Threads of one process queue here for the write lock: a handoff on a
        # Python lock is immediate, where SQLite's busy handler sleeps and retries.
        self._writer = threading.RLock()
        self._connections.get()  # fail now, with a clear message, if the file cannot be opened

    @contextmanager
    def transaction(self, *, one_statement: bool = False) -> Iterator[SqliteTx]:
        # one_statement changes nothing here: BEGIN IMMEDIATE costs no round trip.
        with self._writer:
            try:
                with self._connections.transaction() as conn:
                    yield SqliteTx(conn, self._queries)
            except sqlite3.IntegrityError as exc:
                if "UNIQUE" in str(exc):
                    raise KeyConflict(str(exc)) from None
                raise

    def atransaction(self, *, one_statement: bool = False) -> AbstractAsyncContextManager[Any]:
        """Not available: the capabilities declare no ``native_async``, so asyncio
        callers run :meth:`transaction` on a thread instead."""
        raise NotImplementedError("SQLite has no asyncio transactions (capabilities.native_async is False)")

    def listener(self, queues: set[str], *, on_interrupt: Callable[[str], None] | None = None) -> SleepingListener:
        return SleepingListener()

    async def alistener(self, queues: set[str]) -> AsyncSleepingListener:
        return AsyncSleepingListener()

    def task_listener(self, task_id: int, *, streams: bool = False) -> PollingTaskListener:
        """A waiter for task ``task_id``'s end (and its stream's next entry): a short sleep
        (SQLite cannot notify)."""
        return PollingTaskListener(WAIT_POLL)

    async def atask_listener(self, task_id: int, *, streams: bool = False) -> AsyncPollingTaskListener:
        """:meth:`task_listener` for asyncio code."""
        return AsyncPollingTaskListener(WAIT_POLL)

    def caller_tx(self, connection: Any) -> SqliteTx:
        """A transaction view of the application's own ``sqlite3`` ``connection``
        to this queue's file (``enqueue(..., connection=)``): leaseq's statements
        run in the caller's transaction, which the caller commits or rolls back."""
        if not isinstance(connection, sqlite3.Connection):
            kind = f"{type(connection).__module__}.{type(connection).__qualname__}"
            raise InvalidInput("connection", f"must be a sqlite3.Connection to the queue's SQLite file (got {kind})")
        try:
            files = {row[1]: row[2] for row in connection.execute("PRAGMA database_list").fetchall()}
        except sqlite3.ProgrammingError as exc:
            raise InvalidInput("connection", f"cannot be used: {exc}") from None
        if not files.get("main") or os.path.realpath(files["main"]) != os.path.realpath(self.path):
            raise InvalidInput("connection", f"is open on {files.get('main') or 'a memory database'!r}, "
                                             f"not on the queue's file {self.path!r}")
        if connection.isolation_level is None and not connection.in_transaction:
            raise InvalidInput("connection", "is in autocommit mode with no transaction open: the task would be "
                                             "committed at once; run BEGIN first")
        return SqliteTx(connection, self._queries, caller=True)

    def acaller_tx(self, connection: Any) -> Any:
        """SQLite has no asyncio connections: AsyncQueue runs :meth:`caller_tx`'s view on its thread."""
        raise InvalidInput("connection", "SQLite has no asyncio connections: pass a sqlite3.Connection")

    async def close_async(self) -> None:
        """Nothing to do: SQLite has no connections bound to an event loop."""

    def close(self) -> None:
        self._connections.close()
