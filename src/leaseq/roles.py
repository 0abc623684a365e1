"""Database roles on PostgreSQL: a login role per worker host (or pool), operator, viewer and verifier.

``leaseq roles create worker NAME`` makes a login role that is a member of
``leaseq_worker`` and of nothing else: it holds no privilege on any leaseq
table, and reaches the queue only through the definer functions of
:mod:`leaseq.store.functions`, which hold it to the leases its own worker
identities were given. Operator roles (``leaseq_operator``) add the operator
actions; viewer roles (``leaseq_viewer``) read; verifier roles
(``leaseq_verifier``), for downstream services, may check an action token
online (``verify_action_token``) and do nothing else: they read no table and
mint nothing. A role may be scoped to queues.
Revoking a role takes its group away and its right to log in (one
transaction: from its commit, the role can call nothing), ends its sessions,
then revokes each worker identity it registered, which ends their leases with
evidence.

On SQLite there are no database roles: whoever can open the file has full
authority. Untrusted workers reach a SQLite queue through the service.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from .core.errors import InvalidInput
from .store.functions import GROUPS

__all__ = ["DbRole", "create_role", "list_roles", "revoke_role", "role_dsn"]

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_RESERVED = ("leaseq_owner", *GROUPS.values())


@dataclass(frozen=True)
class DbRole:
    """A login role ``leaseq roles create`` made."""

    role: str
    kind: str
    queues: list[str] | None
    created_by: str
    created_at: datetime
    revoked_at: datetime | None
    can_login: bool
    sessions: int


@contextmanager
def _as_admin(q: Any) -> Iterator[Any]:
    """A connection of ``q``'s for managing roles: the refusals a role that may not (a worker,
    operator or viewer role, or an unmigrated schema) meets become one clear error."""
    from psycopg import errors

    try:
        with _postgres(q) as conn:
            yield conn
    except errors.UndefinedTable:
        raise InvalidInput("dsn", "the schema is not migrated: run leaseq migrate first") from None
    except errors.InsufficientPrivilege as exc:
        raise InvalidInput("dsn", f"this connection may not manage roles ({str(exc).strip()}): "
                                  "run it as the role that migrates the schema") from None


def _postgres(q: Any) -> Any:
    if q.dialect != "postgres":
        raise InvalidInput("dsn", "database roles exist on PostgreSQL only: on SQLite whoever can open the "
                                  "file has full authority (give untrusted workers the service: leaseq serve)")
    import psycopg

    return psycopg.connect(q.store.conninfo)  # leaseq's own options removed


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInput("name", f"must be a PostgreSQL role name of lower-case letters, digits and _, "
                                   f"at most 63 characters, not starting with a digit (got {name!r})")
    if name in _RESERVED or name.startswith("pg_"):
        raise InvalidInput("name", f"{name!r} is reserved")
    return name


#: The most server connections one login role may hold at once (``CONNECTION LIMIT``), unless
#: ``create_role(connection_limit=)`` says otherwise: a worker process holds at most its two pools
#: (10 each by default) and a listening connection, so this is two such processes with room to
#: spare, and a stolen credential cannot take every connection the server has (max_connections).
DEFAULT_CONNECTION_LIMIT = 50


def create_role(q: Any, kind: str, name: str, *, queues: list[str] | None = None,
                password: str | None = None, connection_limit: int = DEFAULT_CONNECTION_LIMIT) -> str:
    """Make login role ``name`` of ``kind`` (worker, operator, viewer, verifier), scoped to ``queues``
    if given; returns the DSN it logs in with (the password generated unless given). The role
    may hold at most ``connection_limit`` connections at once (-1: no limit of its own)."""
    from psycopg import errors, sql

    if kind not in GROUPS:
        raise InvalidInput("kind", f"must be one of {', '.join(GROUPS)} (got {kind!r})")
    _check_name(name)
    if isinstance(connection_limit, bool) or not isinstance(connection_limit, int) or connection_limit < -1 \
            or connection_limit == 0 or connection_limit > 100_000:
        raise InvalidInput("connection_limit", f"must be a number of connections from 1 to 100000, or -1 for "
                                               f"no limit of the role's own (got {connection_limit!r})")
    if queues is not None:
        queues = sorted({str(x) for x in queues})
        if not queues:
            queues = None
    password = password if password is not None else secrets.token_urlsafe(24)
    if not password or "\n" in password:
        raise InvalidInput("password", "must be one line, not empty")
    with _as_admin(q) as conn:
        try:
            with conn.transaction():
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} CONNECTION LIMIT {} IN ROLE {}").format(
                    sql.Identifier(name), sql.Literal(password), sql.Literal(connection_limit),
                    sql.Identifier(GROUPS[kind])))
                conn.execute("INSERT INTO leaseq_db_roles (role, kind, queues) VALUES (%s, %s, %s)",
                             (name, kind, queues))
        except errors.DuplicateObject:
            raise InvalidInput("name", f"role {name!r} already exists") from None
    return role_dsn(q.store.dsn, name, password)


def role_dsn(dsn: str, user: str, password: str) -> str:
    """``dsn`` (URL or key=value form) logging in as ``user`` with ``password``; leaseq's own
    options (``pooler``, ``portable``) are kept, so the role reaches the server the same way."""
    from psycopg.conninfo import conninfo_to_dict

    from .db.dsn import split_leaseq_options

    conninfo, options = split_leaseq_options(dsn)
    params = {k: str(v) for k, v in conninfo_to_dict(conninfo).items() if v is not None}
    host = params.pop("host", "localhost")
    port = params.pop("port", "")
    dbname = params.pop("dbname", "")
    params.pop("user", None)
    params.pop("password", None)
    params.update(options)
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}" + (f":{port}" if port else "")
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{netloc}/{quote(dbname, safe='')}{query}"


def list_roles(q: Any) -> list[DbRole]:
    """Every role ``leaseq roles create`` made on this schema, revoked ones too."""
    with _as_admin(q) as conn:
        rows = conn.execute(
            "SELECT r.role, r.kind, r.queues, r.created_by, r.created_at, r.revoked_at,"
            " coalesce(p.rolcanlogin, false),"
            " (SELECT count(*) FROM pg_stat_activity a WHERE a.usename = r.role)"
            " FROM leaseq_db_roles r LEFT JOIN pg_roles p ON p.rolname = r.role ORDER BY r.created_at").fetchall()
    return [DbRole(*row) for row in rows]


def revoke_role(q: Any, name: str, *, by: str | None = None, via: str | None = None) -> dict[str, Any]:
    """Revoke login role ``name``: in one transaction it loses its group and its login (from
    the commit it can call nothing); its sessions are ended; then each worker identity it
    registered is revoked, ending its leases (``lease_revoked`` events)."""
    from psycopg import sql

    _check_name(name)
    with _as_admin(q) as conn:
        with conn.transaction():
            row = conn.execute("SELECT kind FROM leaseq_db_roles WHERE role = %s FOR UPDATE", (name,)).fetchone()
            if row is None:
                raise InvalidInput("name", f"no role {name!r} was made by leaseq roles create")
            conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(name)))
            conn.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(GROUPS[row[0]]), sql.Identifier(name)))
            conn.execute("UPDATE leaseq_db_roles SET revoked_at = coalesce(revoked_at, now()) WHERE role = %s",
                         (name,))
        ended = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = %s",
                             (name,)).fetchone()
        workers = [r[0] for r in conn.execute(
            "SELECT id FROM leaseq_workers WHERE db_role = %s AND revoked_at IS NULL", (name,)).fetchall()]
        conn.commit()
    for wid in workers:
        q.revoke_worker(wid, by=by, via=via)
    return {"role": name, "sessions_ended": int(ended[0]) if ended else 0, "workers_revoked": workers}
