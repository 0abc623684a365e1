"""SQLite: per-thread connections to one file, and the ``BEGIN IMMEDIATE`` transaction.

Closing is safe while other threads still run statements: ``sqlite3`` closes
a connection that another thread is stepping a statement on without any
guard, and the process crashes. So every use of a connection is counted,
:meth:`SqliteConnections.close` closes only the idle ones at once, and a
connection in use is closed by the thread using it when its transaction (or
read) ends. After ``close()`` nothing opens a connection again: each call is
refused with :class:`leaseq.BackendUnavailable`, as on PostgreSQL once the
pool is closed.

The file is created owner-only (0600) when it does not exist yet; SQLite
gives the ``-wal`` and ``-shm`` files it creates beside it the database
file's permissions, so they are owner-only too. An existing file keeps the
permissions its owner gave it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..core.errors import BackendUnavailable
from .errors import map_driver_errors

logger = logging.getLogger("leaseq.db")

#: Permissions of a database file leaseq creates: the owner's only.
FILE_MODE = 0o600


def create_private_file(path: str) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (an existing file is left alone)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return
    except OSError:
        return  # a missing folder or no permission: sqlite3.connect reports it in its words
    os.close(fd)


class TransactionEnded(RuntimeError):
    """Code inside a transaction ran COMMIT or ROLLBACK itself; the transaction was not committed."""


class SqliteConnections:
    """One connection per thread to one SQLite file, in WAL mode and autocommit (``isolation_level=None``).

    Connections are opened with ``check_same_thread=False`` so a thread may
    hand its connection to another while it waits (the fencing middleware
    does); a connection is still never used by two threads at once. Every
    use goes through :meth:`use` (or :meth:`transaction`): :meth:`close`
    never closes a connection in use, its user closes it when the use ends.
    """

    def __init__(self, path: str, *, busy_timeout: float = 30.0, pragmas: tuple[str, ...] = ()):
        self.path = path
        self._busy_timeout = busy_timeout
        self._pragmas = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", *pragmas)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        #: the connections in use (a count each: a read may run inside a transaction's thread)
        self._busy: dict[sqlite3.Connection, int] = {}
        self._closed = False
        self._lock = threading.Lock()
        self._where = f"SQLite database {path!r}"

    def _refuse_closed(self) -> None:
        if self._closed:
            raise BackendUnavailable(f"{self._where} is closed: close() was called on it")

    def get(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use. Run statements on it inside
        :meth:`use` only: a connection used outside it may be closed under the statement."""
        self._refuse_closed()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            create_private_file(self.path)
            try:
                conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                                       check_same_thread=False)
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from None
            try:
                for pragma in self._pragmas:
                    conn.execute(pragma)
            except sqlite3.Error as exc:
                conn.close()
                raise BackendUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from None
            with self._lock:
                if self._closed:  # closed while this one opened
                    conn.close()
                    self._refuse_closed()
                self._all.append(conn)
            self._local.conn = conn
        return conn

    @contextmanager
    def use(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, marked in use for the block: :meth:`close` leaves it
        open until the block ends, and the block's end closes it if ``close()`` came meanwhile."""
        conn = self.get()
        with self._lock:
            self._refuse_closed()  # close() may have closed it since get(), while it was idle
            self._busy[conn] = self._busy.get(conn, 0) + 1
        try:
            yield conn
        finally:
            with self._lock:
                left = self._busy.pop(conn) - 1
                if left:
                    self._busy[conn] = left
                last_user_of_closed = self._closed and not left
            if last_user_of_closed:
                _close_quietly(conn)

    def discard(self, conn: sqlite3.Connection) -> None:
        """Close ``conn`` and forget it; the thread's next :meth:`get` opens a new one."""
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)
        _close_quietly(conn)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection inside ``BEGIN IMMEDIATE``: commits on success, rolls back on error.

        The write lock is taken at BEGIN, so the transaction's reads and
        writes cannot be split by another writer. "Database unavailable"
        errors (locked past the busy timeout, unreadable file) come out as
        :class:`leaseq.BackendUnavailable`; any other exception from the
        block propagates as it is, never hidden by a failing ROLLBACK.
        """
        with self.use() as conn:
            with map_driver_errors(self._where):
                conn.execute("BEGIN IMMEDIATE")
            try:
                with map_driver_errors(self._where):
                    yield conn
                    if not conn.in_transaction:
                        raise TransactionEnded("the transaction was ended inside its block (COMMIT or ROLLBACK); "
                                               "leave transaction control to leaseq")
                    conn.execute("COMMIT")
            except BaseException:
                self.rollback(conn)
                raise

    def rollback(self, conn: sqlite3.Connection) -> None:
        """Roll back ``conn``'s open transaction, if one is still open, without raising.

        SQLite may already have rolled the transaction back itself (a
        ``RAISE(ROLLBACK)`` trigger, some I/O and full-disk errors); a
        ROLLBACK then fails with "no transaction is active" and would hide
        the error that matters. A connection whose ROLLBACK fails with the
        transaction still open is discarded, so no later call inherits it.
        """
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            logger.warning("ROLLBACK failed on %s: %s", self.path, exc)
        if conn.in_transaction:
            self.discard(conn)

    def close(self) -> None:
        """Close every connection, and refuse every use from now on. A connection
        another thread is using stays open until that use ends (see :meth:`use`):
        closing it under a running statement would crash the process."""
        with self._lock:
            self._closed = True
            idle = [conn for conn in self._all if conn not in self._busy]
            self._all.clear()
        for conn in idle:
            _close_quietly(conn)
        self._local = threading.local()


def _close_quietly(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error:  # pragma: no cover - closing is best effort
        pass
