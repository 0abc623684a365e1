"""Which database a DSN names, and the checks a PostgreSQL DSN passes before a pool opens."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

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


#: The environment variable naming a direct PostgreSQL connection for LISTEN when the
#: pooled connections cannot listen (``pooler=transaction``); see :class:`PostgresMode`.
LISTEN_DSN_ENV = "LEASEQ_LISTEN_DSN"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
#: The values of ``pooler=``: how the server connections behind the DSN are shared.
POOLERS = ("transaction", "none")


@dataclass(frozen=True)
class PostgresMode:
    """How leaseq may use the connections a PostgreSQL DSN gives it.

    Declared once, by the DSN's own options (``?pooler=transaction``,
    ``?portable=true``, removed before the DSN reaches libpq) or by the
    keywords of the same names to :func:`leaseq.connect`:

    * ``pooler="transaction"``: a pooler in transaction mode (PgBouncer's
      ``pool_mode = transaction``) stands between leaseq and the server, and
      each transaction may run on a different server connection: no
      server-side prepared statements, no session setting, and LISTEN only on
      ``listen_dsn`` (a direct connection), else waits poll;
    * ``portable=True``: a server that speaks PostgreSQL's protocol but lacks
      parts of it: all of the above, and no LISTEN at all (waits poll), no
      advisory lock.
    """

    #: a transaction-mode pooler: no prepared statement, no session setting
    pooled: bool = False
    #: a server lacking LISTEN/NOTIFY and advisory locks (implies ``pooled``'s restrictions)
    portable: bool = False
    #: the direct connection LISTENed on while ``pooled`` (None: waits poll)
    listen_dsn: str | None = None

    @property
    def session_state(self) -> bool:
        """Whether state may be left on a connection between transactions (prepared
        statements, ``SET``): only when every transaction of a connection reaches the same
        server session."""
        return not (self.pooled or self.portable)

    @property
    def listens(self) -> bool:
        """Whether waits are woken by LISTEN/NOTIFY (else they poll)."""
        if self.portable:
            return False
        return not self.pooled or self.listen_dsn is not None


def _flag(name: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ConfigError(f"dsn: {name}={value!r}: write {name}=true or {name}=false")


def _pooler(value: str) -> bool:
    if value not in POOLERS:
        hint = (" (statement mode cannot run leaseq's transactions of several statements)"
                if value == "statement" else "")
        raise ConfigError(f"dsn: pooler={value!r} is not supported{hint}: write pooler=transaction for a "
                          f"pooler in transaction mode such as PgBouncer's, or leave it out (direct connections "
                          f"and session mode need nothing)")
    return value == "transaction"


def postgres_mode(dsn: str, *, pooler: str | None = None, portable: bool | None = None,
                  listen_dsn: str | None = None) -> tuple[str, PostgresMode]:
    """``(the DSN for libpq, the mode it declares)``: leaseq's own options (``pooler``,
    ``portable``) are read from the DSN's query and removed; the keywords, where given,
    decide instead. The LISTEN connection is ``listen_dsn``, else ``$LEASEQ_LISTEN_DSN``
    (read only for a pooled DSN: a direct one listens on its own connections)."""
    conninfo, found = split_leaseq_options(dsn)
    is_pooled = _pooler(pooler) if pooler is not None else _pooler(found["pooler"]) if "pooler" in found else False
    is_portable = bool(portable) if portable is not None else (
        _flag("portable", found["portable"]) if "portable" in found else False)
    if is_portable and listen_dsn is not None:
        raise ConfigError("listen_dsn: the portable mode does not LISTEN (its waits poll): leave listen_dsn out")
    if is_pooled and not is_portable and listen_dsn is None:
        listen_dsn = os.environ.get(LISTEN_DSN_ENV) or None
    if listen_dsn is not None:
        if not listen_dsn.startswith(("postgresql://", "postgres://")):
            raise ConfigError("listen_dsn: must be a postgresql:// DSN of a direct connection to the same database")
        listen_dsn = split_leaseq_options(listen_dsn)[0]
        if not is_pooled:
            listen_dsn = None  # a direct connection listens on its own server
    return conninfo, PostgresMode(pooled=is_pooled, portable=is_portable, listen_dsn=listen_dsn)


def split_leaseq_options(dsn: str) -> tuple[str, dict[str, str]]:
    """``dsn`` without leaseq's own query options (``pooler``, ``portable``), and those options."""
    if "?" not in dsn:
        return dsn, {}
    try:
        parts = urlsplit(dsn)
    except ValueError:  # not a URL: libpq says what is wrong with it
        return dsn, {}
    kept, found = [], {}
    for piece in parts.query.split("&"):
        key, _, value = piece.partition("=")
        if unquote(key) in ("pooler", "portable"):
            found[unquote(key)] = unquote(value)
        elif piece:
            kept.append(piece)
    return urlunsplit(parts._replace(query="&".join(kept))), found


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
