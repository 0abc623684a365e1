"""The fenced store's two databases: its queries and how its rows are decoded.

Connections, pools, transactions and error mapping come from
:mod:`leaseq.db`, as for the queue's own store. Each backend hands out its
*raw* driver connection inside a transaction, so a caller's write can run on
it and commit or roll back with the fence. A driver error that means the
database is unavailable (a connection dropped mid-write, a lock wait past
the busy timeout) is raised as :class:`leaseq.BackendUnavailable` wherever
it happens inside the transaction, so the middleware answers 503. The
fencing SQL lives in ``sql/<dialect>.sql`` as named blocks, parsed with the
same block syntax as leaseq's own queries.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from typing import Any

from ..core.errors import ConfigError
from ..db.dsn import parse_dsn
from ..db.sqlite import SqliteConnections
from ..store.base import parse_named_blocks


@cache
def load_fence_queries(dialect: str) -> dict[str, str]:
    """The named queries of ``leaseq/fencing/sql/<dialect>.sql``: ``{name: sql}``."""
    text = resources.files("leaseq.fencing").joinpath("sql", f"{dialect}.sql").read_text()
    return parse_named_blocks(text, f"fencing/sql/{dialect}.sql")


def _missing_table(exc: Exception) -> ConfigError:
    return ConfigError(f"fencing tables are missing ({str(exc).strip()}); run FencedStore.migrate() first")


class PostgresFence:
    """The fencing tables in PostgreSQL, through a pool checked at checkout.

    Connections are in autocommit mode and each transaction is an explicit
    ``conn.transaction()`` block, so a write that calls ``conn.commit()``
    inside it is refused by psycopg instead of splitting the transaction.
    """

    dialect = "postgres"

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 10, connect_timeout: float = 10.0):
        from ..db.dsn import check_postgres_dsn, postgres_mode
        from ..db.postgres import open_pool

        self.dsn = dsn
        self._queries = load_fence_queries("postgres")
        conninfo, mode = postgres_mode(dsn)
        check_postgres_dsn(conninfo, connect_timeout)
        #: False in the portable mode (``?portable=true``): migrate() locks a table instead
        self.advisory_locks: bool = not mode.portable
        # behind a transaction-mode pooler (?pooler=transaction) psycopg must prepare nothing
        self._pool = open_pool(conninfo, min_size=min_size, max_size=max_size, timeout=connect_timeout,
                               **({} if mode.session_state else {"prepare_threshold": None}))

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A ``psycopg.Connection`` inside ``conn.transaction()``: commits on success."""
        from ..db.postgres import checked_connection

        with checked_connection(self._pool) as conn:
            with conn.transaction():
                yield conn

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A pooled connection in autocommit mode, for reads outside any transaction."""
        from ..db.postgres import checked_connection

        with checked_connection(self._pool) as conn:
            yield conn

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
    before the fence is read. A connection may be used from another thread
    while the applying thread waits for it (the ASGI middleware does this);
    it is never used by two threads at once.
    """

    dialect = "sqlite"
    #: SQLite's write lock serialises migrate() runs; its schema_lock is a no-op
    advisory_locks = True

    def __init__(self, path: str, *, busy_timeout: float = 30.0):
        self.path = path
        self.dsn = f"sqlite:///{path}"
        self._queries = load_fence_queries("sqlite")
        self._connections = SqliteConnections(path, busy_timeout=busy_timeout)
        self._connections.get()  # fail now, with a clear message, if the file cannot be opened

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A ``sqlite3.Connection`` inside ``BEGIN IMMEDIATE``: commits on success.

        A write that runs COMMIT or ROLLBACK itself makes the apply fail with
        a ``RuntimeError``: the fence could no longer promise that its
        records and the write happened together.
        """
        with self._connections.transaction() as conn:
            yield conn

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection in autocommit mode, for reads outside any transaction."""
        with self._connections.use() as conn:
            yield conn

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
        self._connections.close()


def open_fence_backend(dsn: str, **options: Any) -> PostgresFence | SqliteFence:
    """The backend a DSN names (``postgresql://…`` or ``sqlite:///file.db``)."""
    if dsn is None:
        raise ConfigError("dsn: FencedStore needs a DSN such as sqlite:///fence.db or postgresql://host/db")
    dialect, target = parse_dsn(dsn)
    if dialect == "postgres":
        return PostgresFence(target, **options)
    return SqliteFence(target, **options)
