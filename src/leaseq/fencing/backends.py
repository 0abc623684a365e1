"""Connections for the fenced store: PostgreSQL (psycopg 3 pool) and SQLite (WAL).

Each backend hands out its *raw* driver connection inside a transaction, so
a caller's write can run on it and commit or roll back with the fence. The
fencing SQL lives in ``sql/<dialect>.sql`` as named blocks, parsed with the
same block syntax as leaseq's own queries.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from typing import Any

from ..core.errors import BackendUnavailable, ConfigError
from ..store.base import parse_dsn, parse_named_blocks


@cache
def load_fence_queries(dialect: str) -> dict[str, str]:
    """The named queries of ``leaseq/fencing/sql/<dialect>.sql``: ``{name: sql}``."""
    text = resources.files("leaseq.fencing").joinpath("sql", f"{dialect}.sql").read_text()
    return parse_named_blocks(text, f"fencing/sql/{dialect}.sql")


def _missing_table(exc: Exception) -> ConfigError:
    return ConfigError(f"fencing tables are missing ({str(exc).strip()}); run FencedStore.migrate() first")


class PostgresFence:
    """The fencing tables in PostgreSQL, through a psycopg_pool pool.

    Connections are in autocommit mode and each transaction is an explicit
    ``conn.transaction()`` block, so a write that calls ``conn.commit()``
    inside it is refused by psycopg instead of splitting the transaction.
    """

    dialect = "postgres"

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 10, connect_timeout: float = 10.0):
        import psycopg
        from psycopg_pool import ConnectionPool

        self.dsn = dsn
        self._queries = load_fence_queries("postgres")
        try:
            psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"dsn: cannot parse PostgreSQL DSN: {exc}") from None
        try:  # report a wrong host or password plainly, not as a pool time-out
            psycopg.connect(dsn, connect_timeout=max(1, int(connect_timeout))).close()
        except psycopg.Error as exc:
            raise BackendUnavailable(f"cannot connect to PostgreSQL: {str(exc).strip()}") from None
        # check=: a connection the server dropped is replaced at checkout,
        # rather than failing the next apply with a bare driver error.
        self._pool = ConnectionPool(dsn, min_size=min_size, max_size=max_size, open=False,
                                    timeout=connect_timeout, kwargs={"autocommit": True},
                                    check=ConnectionPool.check_connection)
        self._pool.open(wait=True, timeout=connect_timeout)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A ``psycopg.Connection`` inside ``conn.transaction()``: commits on success."""
        from psycopg import OperationalError
        from psycopg_pool import PoolTimeout

        try:
            conn = self._pool.getconn()
        except PoolTimeout as exc:
            raise BackendUnavailable(f"no PostgreSQL connection available: {exc}") from None
        except OperationalError as exc:
            raise BackendUnavailable(f"PostgreSQL: {str(exc).strip()}") from None
        try:
            with conn.transaction():
                yield conn
        finally:
            self._pool.putconn(conn)  # the pool discards it if it broke

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A pooled connection in autocommit mode, for reads outside any transaction."""
        from psycopg_pool import PoolTimeout

        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise BackendUnavailable(f"no PostgreSQL connection available: {exc}") from None

    def run(self, conn: Any, query: str, **params: Any) -> list[dict[str, Any]]:
        """Run a named query on ``conn`` and return its rows as dicts."""
        from psycopg import errors
        from psycopg.rows import dict_row

        with conn.cursor(row_factory=dict_row) as cur:
            try:
                cur.execute(self._queries[query], params)
            except errors.UndefinedTable as exc:
                raise _missing_table(exc) from None
            return cur.fetchall() if cur.description else []

    def close(self) -> None:
        """Close the pool."""
        self._pool.close()


class SqliteFence:
    """The fencing tables in one SQLite file, one connection per thread.

    Transactions are ``BEGIN IMMEDIATE``: the file's write lock is taken
    before the fence is read. Connections are opened with
    ``check_same_thread=False`` so a write may be run from another thread
    while the applying thread waits for it (the ASGI middleware does this);
    the connection is never used by two threads at once.
    """

    dialect = "sqlite"

    def __init__(self, path: str, *, busy_timeout: float = 30.0):
        self.path = path
        self.dsn = f"sqlite:///{path}"
        self._busy_timeout = busy_timeout
        self._queries = load_fence_queries("sqlite")
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._conn()  # fail now, with a clear message, if the file cannot be opened

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                                       check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from None
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A ``sqlite3.Connection`` inside ``BEGIN IMMEDIATE``: commits on success."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise BackendUnavailable(f"SQLite database {self.path!r}: {exc}") from None
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if not conn.in_transaction:
            # The write ran COMMIT or ROLLBACK itself: the fence can no longer
            # promise its write and the records happened together.
            raise RuntimeError("the write ended the fence transaction itself (COMMIT/ROLLBACK); "
                               "leave transaction control to FencedStore.apply")
        conn.execute("COMMIT")

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection in autocommit mode, for reads outside any transaction."""
        yield self._conn()

    def run(self, conn: sqlite3.Connection, query: str, **params: Any) -> list[dict[str, Any]]:
        """Run a named query on ``conn`` and return its rows as dicts (times as datetimes)."""
        try:
            cur = conn.execute(self._queries[query], params)
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                raise _missing_table(exc) from None
            raise
        names = [d[0] for d in cur.description or ()]
        rows = []
        for values in cur.fetchall():
            row = dict(zip(names, values))
            for key, value in row.items():
                if key.endswith("_at") and value is not None:
                    row[key] = datetime.fromtimestamp(value, tz=timezone.utc)
                elif key == "outcome" and value is not None:
                    row[key] = json.loads(value)
            rows.append(row)
        return rows

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            for conn in self._all:
                try:
                    conn.close()
                except sqlite3.Error:  # pragma: no cover - closing from another thread
                    pass
            self._all.clear()
        self._local = threading.local()


def open_fence_backend(dsn: str, **options: Any) -> PostgresFence | SqliteFence:
    """The backend a DSN names (``postgresql://…`` or ``sqlite:///file.db``)."""
    if dsn is None:
        raise ConfigError("dsn: FencedStore needs a DSN such as sqlite:///fence.db or postgresql://host/db")
    dialect, target = parse_dsn(dsn)
    if dialect == "postgres":
        return PostgresFence(target, **options)
    return SqliteFence(target, **options)
