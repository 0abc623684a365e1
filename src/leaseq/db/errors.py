"""The one mapping from database driver errors to leaseq errors.

A database that cannot be reached, or that dropped the connection, is
:class:`leaseq.BackendUnavailable` wherever it happens: at checkout, at
``BEGIN``, in the middle of a statement, at ``COMMIT``. Callers (the worker
runtime, the service, the fencing middleware) treat that class as
infrastructure trouble: retried, answered with 503, never charged to a task.
Every other driver error (a constraint, a syntax error in a caller's write)
passes through unchanged: it is the caller's to handle.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from ..core.errors import BackendUnavailable, ConfigError, LeaseqError

#: sqlite3.OperationalError messages that mean the file cannot be used right
#: now (locked past the busy timeout, missing, unreadable, full), as opposed
#: to a statement that is wrong.
_SQLITE_UNAVAILABLE = ("database is locked", "database is busy", "unable to open", "disk i/o error",
                       "database or disk is full", "readonly database")


def unavailable(exc: BaseException, where: str | None = None) -> BackendUnavailable | None:
    """The :class:`BackendUnavailable` a driver error stands for, or None if it is not one.

    ``where`` names the database in the message (default: the driver's name).
    """
    if isinstance(exc, LeaseqError):
        return None
    if isinstance(exc, sqlite3.OperationalError):
        message = str(exc)
        if any(text in message.lower() for text in _SQLITE_UNAVAILABLE):
            return BackendUnavailable(f"{where or 'SQLite'}: {message}")
        return None
    psycopg = sys.modules.get("psycopg")  # not imported: the error cannot be one of its
    if psycopg is None:
        return None
    pool = sys.modules.get("psycopg_pool")
    if pool is not None and isinstance(exc, pool.PoolTimeout):  # an OperationalError too: test it first
        return BackendUnavailable(f"no PostgreSQL connection available: {exc}")
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        # OperationalError covers a dropped connection (SQLSTATE classes 08
        # and 57: terminated by an administrator, server shutting down) and
        # statement timeouts; InterfaceError a connection already closed.
        return BackendUnavailable(f"{where or 'PostgreSQL'}: {str(exc).strip()}")
    if isinstance(exc, psycopg.InternalError) and exc.sqlstate is None and _BROKEN_REPLY.match(str(exc)):
        # not the server's internal error (SQLSTATE XX000): psycopg's own, where a transaction
        # command's reply broke off; PgBouncer answers a COMMIT whose server connection was
        # dropped so, and closes the client's connection
        return BackendUnavailable(f"{where or 'PostgreSQL'}: the connection broke during {str(exc).strip()}")
    return None


#: psycopg's InternalError (no SQLSTATE) when a BEGIN, COMMIT, ROLLBACK or SAVEPOINT got other
#: than one reply: the connection broke in the middle of it.
_BROKEN_REPLY = re.compile(r"received \d+ results from command ")


def rolled_back(exc: BaseException) -> bool:
    """Whether ``exc`` says PostgreSQL rolled a whole transaction back to break a lock cycle
    (``deadlock_detected``) or a serialization conflict (``serialization_failure``): nothing
    of it was written, so running the same operation again from its start is correct, and
    it then meets the other transaction's outcome. Such an error reaches callers as
    :class:`BackendUnavailable` (retried by workers); an operator's call that can lock a
    tree of tasks retries it itself (:meth:`leaseq.Queue.cancel`)."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None:
        return False
    cause = exc.__cause__ if isinstance(exc, BackendUnavailable) else exc
    return isinstance(cause, (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure))


#: SQLSTATEs of a statement psycopg prepared (``_pg3_<n>``) missing on, or already on, the
#: server connection: invalid_sql_statement_name, duplicate_prepared_statement, and the
#: protocol violation of a bind whose parameters are another statement's.
_PREPARED_MISMATCH = ("26000", "42P05", "08P01")


def pooler_undeclared(exc: BaseException) -> ConfigError | None:
    """The :class:`ConfigError` a driver error stands for when the server connection changed
    under psycopg's prepared statements, or None. Directly connected, that never happens: it
    is a pooler in transaction mode (PgBouncer, RDS Proxy) the DSN did not declare, and a
    retry cannot help (with equal parameter counts it could run another client's statement)."""
    if getattr(exc, "sqlstate", None) not in _PREPARED_MISMATCH or '"_pg3_' not in str(exc):
        return None
    return ConfigError(
        f"dsn: the server connection changed between prepared statements ({str(exc).strip()}): a pooler "
        "in transaction mode (PgBouncer, RDS Proxy) is in front of the server. Declare it in the DSN "
        "(?pooler=transaction), and leaseq prepares nothing and keeps no session state "
        "(docs/how-to/poolers.md)")


@contextmanager
def map_driver_errors(where: str | None = None) -> Iterator[None]:
    """Re-raise driver errors that mean "database unavailable" as :class:`BackendUnavailable`.

    The driver error stays attached as ``__cause__`` for logs; any other
    exception passes through untouched.
    """
    try:
        yield
    except Exception as exc:
        mapped: LeaseqError | None = pooler_undeclared(exc) or unavailable(exc, where)
        if mapped is None:
            raise
        raise mapped from exc
