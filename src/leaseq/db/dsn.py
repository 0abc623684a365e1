"""Which database a DSN names, and the checks a PostgreSQL DSN passes before a pool opens."""

from __future__ import annotations

import os
import re

from ..core.errors import BackendUnavailable, ConfigError

DEFAULT_DSN = "sqlite:///leaseq.db"
#: A libpq keyword/value connection string starts with a keyword and '='.
_KEYWORDS = re.compile(r"[a-z_]+\s*=")

#: What PostgreSQL (or libpq) says when it answered and refused the login: a wrong password or
#: role, no pg_hba.conf entry, no such database, no right to connect. Waiting does not heal these,
#: unlike a server that is down, starting up or shutting down (SQLSTATE 57P03 and the like).
#: libpq gives no SQLSTATE for a failed connection, so the server's (English) words are read.
_REFUSED = re.compile(
    r"authentication failed|role \S+ does not exist|database \S+ does not exist|no pg_hba\.conf entry"
    r"|no password supplied|is not permitted to log in|permission denied for database"
    r"|password authentication is not supported|server does not support SSL", re.I)


def parse_dsn(dsn: str | None) -> tuple[str, str]:
    """``(dialect, target)`` for a DSN; None means ``$LEASEQ_DSN`` or the embedded default.

    ``sqlite:///relative.db`` and ``sqlite:////absolute/path.db`` name files;
    ``postgresql://…`` and ``postgres://…`` name a PostgreSQL database, and so
    does a libpq keyword/value string (``host=a,b port=5432,5432 dbname=app
    target_session_attrs=read-write``: a primary and its standbys, the
    connection following whichever accepts writes).
    """
    if dsn is None:
        dsn = os.environ.get("LEASEQ_DSN") or DEFAULT_DSN
    if not isinstance(dsn, str) or not dsn.strip():
        raise ConfigError("dsn: must be a non-empty string such as sqlite:///leaseq.db or postgresql://host/db")
    dsn = dsn.strip()
    if dsn.startswith(("postgresql://", "postgres://")) or _KEYWORDS.match(dsn):
        return "postgres", dsn
    if dsn.startswith("sqlite://"):
        path = dsn[len("sqlite://"):]
        if not path.startswith("/") or len(path) < 2:
            raise ConfigError(f"dsn: {dsn!r} has no file path; write sqlite:///file.db or sqlite:////abs/file.db")
        path = path[1:]
        if path in (":memory:", "") or path.startswith("file::memory"):
            raise ConfigError("dsn: in-memory SQLite is not supported (each connection would see its own "
                              "database); use a file such as sqlite:///leaseq.db")
        return "sqlite", path
    scheme = dsn.split(":", 1)[0] if ":" in dsn else dsn
    raise ConfigError(f"dsn: unsupported scheme {scheme!r}; use sqlite:///path.db or postgresql://…")


def check_postgres_dsn(dsn: str, connect_timeout: float) -> None:
    """Refuse a PostgreSQL DSN that cannot be parsed or whose server cannot be reached.

    One direct connection is made, so a wrong host or password is reported
    plainly rather than as a pool time-out later. A server that cannot be
    reached (down, starting up, out of connections) is
    :class:`BackendUnavailable`, worth another try; one that answered and
    refused the login (password, role, database, pg_hba.conf) is
    :class:`ConfigError`: trying again will not help.
    """
    import psycopg

    try:
        parts = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"dsn: cannot parse PostgreSQL DSN: {exc}") from None
    port = str(parts.get("port") or "5432")
    if not all(p.strip().isdigit() for p in port.split(",")):
        raise ConfigError(f"dsn: port {port!r} is not a number")
    try:
        psycopg.connect(dsn, connect_timeout=max(1, int(connect_timeout))).close()
    except psycopg.Error as exc:
        text = str(exc).strip()
        if _REFUSED.search(text):
            raise ConfigError(f"dsn: PostgreSQL refused the connection: {text}") from None
        raise BackendUnavailable(f"cannot connect to PostgreSQL: {text}") from None
