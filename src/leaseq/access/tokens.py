"""API tokens and dashboard sessions: create, verify, list and revoke them.

A token looks like ``lq_<id>_<secret>``: ``id`` (12 hex digits) is public and
names the token in listings and logs; ``secret`` (64 hex digits) is random.
Only the SHA-256 of the whole token is stored, and verification compares
hashes in constant time, so neither the database nor response timing gives
a token away. Expiry is judged by the database clock, like leases. What a
token's role and scope allow is :mod:`leaseq.access.principals`'s business.

The token check is an engine operation (:func:`verifying`, :func:`token_check`):
written once, driven blocking or on the event loop (:mod:`leaseq.engine.drive`).

Workers remember the token that registered them (:func:`leaseq.engine.common.worker_token`
reads that link, the one place it is read): revoking a token revokes its workers
in the same transaction, so their leases stop renewing at once. Every token
change is written to the audit log with the actor's identity.

Dashboard sessions (:func:`create_session`) are credentials of their own: a
browser never holds the API token it logged in with, only a random session
id, stored hashed, which expires, ends at logout and ends when its token is
revoked.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..core import checks
from ..core.errors import InvalidInput, NotFound, Unauthorized
from ..engine import common
from ..engine.drive import adrive, adrive_in, drive, drive_in
from ..engine.expiry import end_worker_leases
from ..engine.steps import BEGIN, BEGIN_ONE, COMMIT, One, Op, Rows, T, one, rows
from .actions import DEFAULT_READ_PAYLOADS, ROLES
from .principals import Principal

if TYPE_CHECKING:  # pragma: no cover
    from ..queue import Queue

_TOKEN = re.compile(r"lq_([0-9a-f]{12})_([0-9a-f]{64})")
_SESSION = re.compile(r"lqs_[A-Za-z0-9_-]{43}")
#: Longest dashboard session accepted (seconds).
MAX_SESSION_SECONDS = 30 * 86400.0
# Compared against when the token id is unknown, so that case costs the same.
_DUMMY_HASH = hashlib.sha256(b"leaseq: no such token").hexdigest()


def hash_token(token: str) -> str:
    """The stored form of a token: SHA-256 of the whole token, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def _principal(row: dict[str, Any]) -> Principal:
    queues = row.get("queues")
    return Principal(token_id=row["id"], name=row["name"], role=row["role"],
                     queues=frozenset(queues.split(",")) if queues else None,
                     read_payloads=bool(row["read_payloads"]), expires_at=row.get("expires_at"),
                     own_intents=bool(row.get("own_intents")))


def _public(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k != "secret_hash"}
    out["queues"] = sorted(row["queues"].split(",")) if row.get("queues") else None
    out["read_payloads"] = bool(row["read_payloads"])
    out["own_intents"] = bool(row.get("own_intents"))
    out["expired"] = bool(row.get("expired"))
    return out


def create_token(q: Queue, *, name: str, role: str, queues: list[str] | None = None,
                 all_queues: bool = False, read_payloads: bool | None = None, own_intents: bool = False,
                 expires_in: float | None = None, created_by: str | None = None) -> tuple[str, dict[str, Any]]:
    """Create a token (:func:`creating_token`). Returns ``(token, record)``: show the token once."""
    return drive(q.store, creating_token(name=name, role=role, queues=queues, all_queues=all_queues,
                                         read_payloads=read_payloads, own_intents=own_intents,
                                         expires_in=expires_in, created_by=created_by))


def creating_token(*, name: str, role: str, queues: list[str] | None = None, all_queues: bool = False,
                   read_payloads: bool | None = None, own_intents: bool = False, expires_in: float | None = None,
                   created_by: str | None = None) -> Op[tuple[str, dict[str, Any]]]:
    """Create a token. Returns ``(token, record)``: show the token once, it cannot be read back.

    ``queues`` limits a worker, viewer or operator token to those queues
    (an admin token cannot be limited). A worker token needs ``queues`` or
    the explicit ``all_queues=True``; viewer and operator tokens without
    ``queues`` use every queue. ``read_payloads`` overrides the role's
    default (:data:`DEFAULT_READ_PAYLOADS`); ``own_intents=True`` lets a
    worker token record intents that run without approval on queues it may
    claim from itself (off: such an intent needs ``approval="required"``);
    ``expires_in`` is a lifetime in seconds (None: no expiry).
    """
    checks.check_name("name", name)
    if role not in ROLES:
        raise InvalidInput("role", f"must be one of {', '.join(ROLES)} (got {role!r})")
    if not isinstance(all_queues, bool):
        raise InvalidInput("all_queues", "must be true or false")
    if not isinstance(own_intents, bool):
        raise InvalidInput("own_intents", "must be true or false")
    if queues is not None:
        if role == "admin":
            raise InvalidInput("queues", "an admin token cannot be limited to queues (it manages every "
                                         "token); use an operator token")
        if all_queues:
            raise InvalidInput("queues", "give queues or all_queues, not both")
        if isinstance(queues, str) or not queues:
            raise InvalidInput("queues", "must be a non-empty list of queue names")
        queues = sorted({checks.check_name("queues", name_) for name_ in queues})
    elif role == "worker" and not all_queues:
        raise InvalidInput("queues", "a worker token is limited to the queues it serves: name them (queues=[...], "
                                     "--queue Q), or pass all_queues=True (--all-queues) for every queue")
    if own_intents and role != "worker":
        raise InvalidInput("own_intents", "only a worker token records intents")
    if read_payloads is not None and not isinstance(read_payloads, bool):
        raise InvalidInput("read_payloads", "must be true or false")
    if expires_in is not None:
        expires_in = checks.check_seconds("expires_in", expires_in, allow_zero=False,
                                          maximum=10 * 365 * 86400.0)
    if created_by is not None:
        checks.check_text("created_by", created_by)
    token_id = secrets.token_hex(6)
    token = f"lq_{token_id}_{secrets.token_hex(32)}"
    grant = DEFAULT_READ_PAYLOADS[role] if read_payloads is None else read_payloads
    yield BEGIN
    created = yield rows("token_insert", token_id=token_id, name=name, role=role, secret_hash=hash_token(token),
                         queues=",".join(queues) if queues else None, read_payloads=grant,
                         own_intents=own_intents, expires_in=expires_in, created_by=created_by)
    yield rows("audit_insert", actor=created_by or "unknown", action="token_created", target=token_id,
               detail={"name": name, "role": role, "queues": queues, "read_payloads": grant,
                       "own_intents": own_intents, "expires_in": expires_in})
    yield COMMIT
    return token, _public(created[0])


def verify_token(q: Queue, token: str | None) -> Principal:
    """The principal a token stands for; raises :class:`Unauthorized` otherwise."""
    return drive(q.store, verifying(token))


async def averify_token(q: Queue, token: str | None) -> Principal:
    """:func:`verify_token` for asyncio code: on the event loop where the backend has an
    asyncio driver (PostgreSQL), else in a thread."""
    return await adrive(q.store, verifying(token))


def verifying(token: str | None) -> Op[Principal]:
    """The token check outside any transaction (:func:`verify_token`, :func:`averify_token`).

    The lookup is a statement of its own (one round trip on PostgreSQL, not
    the three of BEGIN, lookup, COMMIT: every operator request pays it), and
    the once-a-minute record of use another, when due. Nothing needs them in
    one transaction: the lookup reads committed state, and the record is a
    guarded write that only moves a time forward."""
    yield BEGIN_ONE
    row = yield from _looked_up(token)
    yield COMMIT
    if row.get("touch_due", True):
        yield BEGIN_ONE
        yield from _touched(row)
        yield COMMIT
    return _principal(row)


def check_token(tx: Any, token: str | None) -> Principal:
    """:func:`verify_token` inside an open transaction ``tx`` (the service checks a
    worker's token in the same transaction as the operation it asks for)."""
    return drive_in(tx, token_check(token))


async def acheck_token(atx: Any, token: str | None) -> Principal:
    """:func:`check_token` inside an open asyncio transaction ``atx``."""
    return await adrive_in(atx, token_check(token))


def token_check(token: str | None) -> Op[Principal]:
    """The token check, as an operation the engine's drivers run inside an open
    transaction (:func:`check_token`, :func:`acheck_token`): written once for both."""
    row = yield from _looked_up(token)
    if row.get("touch_due", True):
        yield from _touched(row)
    return _principal(row)


def _touched(row: dict[str, Any]) -> Op[None]:
    """Record the token's use (the statement writes at most once a minute per token)."""
    yield rows("token_touch", token_id=row["id"])


def _looked_up(token: str | None) -> Op[dict[str, Any]]:
    """The stored record of a valid, live ``token`` (one statement); Unauthorized otherwise."""
    if not token:
        raise Unauthorized("missing credential: send 'Authorization: Bearer <token>'")
    token_id = token_id_of(token)
    if token_id is None:
        raise Unauthorized("malformed token: expected lq_<id>_<secret>")
    presented = hash_token(token)
    row: dict[str, Any] | None = yield one("token_get", token_id=token_id)
    stored = row["secret_hash"] if row is not None else _DUMMY_HASH
    if not hmac.compare_digest(presented, stored) or row is None:
        raise Unauthorized("invalid token", token_id=row["id"] if row is not None else None)
    _refuse_ended(row)
    return row


def _refuse_ended(row: dict[str, Any]) -> None:
    """Unauthorized if the token of ``row`` (a token's or a session's record) was revoked or has expired."""
    if row["revoked_at"] is not None:
        raise Unauthorized(f"token {row['id']} was revoked", token_id=row["id"])
    if row["expired"]:
        raise Unauthorized(f"token {row['id']} has expired", token_id=row["id"])


def token_id_of(token: Any) -> str | None:
    """The id of a well-formed token (``lq_<id>_<secret>``), else None."""
    m = _TOKEN.fullmatch(token) if isinstance(token, str) and len(token) < 200 else None
    return m.group(1) if m is not None else None


def session_hash(session_id: Any) -> str | None:
    """The stored form of a well-formed dashboard session id, else None."""
    return hash_token(session_id) if isinstance(session_id, str) and _SESSION.fullmatch(session_id) else None


def token_hashes(q: Queue) -> dict[str, str]:
    """Every token's id and stored hash (neither ever changes; revoked tokens included)."""
    return {r["id"]: r["secret_hash"] for r in drive(q.store, _read("token_hashes"))}


def list_tokens(q: Queue) -> list[dict[str, Any]]:
    """Every token's record (never its secret or hash), oldest first, with its worker count."""
    return [_public(r) for r in drive(q.store, _read("token_list"))]


def revoke_token(q: Queue, token_id: str, *, by: str) -> list[str]:
    """Revoke a token and every worker it registered (:func:`revoking_token`). Returns the worker ids revoked."""
    return drive(q.store, revoking_token(q.settings, token_id, by=by))


def revoking_token(s: common.Settings, token_id: str, *, by: str) -> Op[list[str]]:
    """Revoke a token and every worker it registered, ending their leases and the token's
    dashboard sessions, in one transaction. Returns the worker ids revoked.

    Revoking an already revoked token changes nothing and is not an error.
    """
    if not isinstance(token_id, str) or not re.fullmatch(r"[0-9a-f]{12}", token_id):
        raise InvalidInput("token_id", f"must be the 12 hex digits of a token id (got {token_id!r})")
    checks.check_text("by", by, required=True)
    yield BEGIN
    if (yield one("token_get", token_id=token_id)) is None:
        raise NotFound(f"token {token_id} does not exist")
    yield rows("token_revoke", token_id=token_id, actor=by)
    workers = [r["id"] for r in (yield rows("token_revoke_workers", token_id=token_id))]
    for wid in workers:
        yield from end_worker_leases(s, wid, f"token {token_id} revoked")
    sessions = yield rows("session_delete_for_token", token_id=token_id)
    yield rows("audit_insert", actor=by, action="token_revoked", target=token_id,
               detail={"revoked_workers": workers, "ended_sessions": len(sessions)})
    yield COMMIT
    return workers


def revoke_worker_token(q: Queue, worker_id: str, *, by: str) -> tuple[str, list[str]]:
    """Revoke the token that registered ``worker_id``, and so every worker it registered.

    Revoking the worker alone (:meth:`leaseq.Queue.revoke_worker`) leaves
    its token free to register a new worker and claim again; this closes
    that door. Returns ``(token_id, revoked worker ids)``.
    """
    if not isinstance(worker_id, str) or not worker_id:
        raise InvalidInput("worker_id", "must be a worker id")
    token_id = worker_token(q, worker_id)
    if token_id is None:
        raise NotFound(f"worker {worker_id!r} does not exist or was not registered with a token")
    return token_id, revoke_token(q, token_id, by=by)  # the worker is one of the token's workers


def create_session(q: Queue, principal: Principal, *, seconds: float) -> str:
    """A dashboard session for a verified ``principal``, lasting ``seconds``. Returns its id.

    The id is random and shown once (it goes into the browser's cookie);
    only its SHA-256 is stored. Expired sessions are dropped here too.
    """
    seconds = checks.check_seconds("session_seconds", seconds, allow_zero=False, maximum=MAX_SESSION_SECONDS)
    session_id = f"lqs_{secrets.token_urlsafe(32)}"
    drive(q.store, _written(rows("session_prune"), one("session_insert", id_hash=hash_token(session_id),
                                                        token_id=principal.token_id, seconds=seconds)))
    return session_id


def verify_session(q: Queue, session_id: str | None) -> Principal:
    """The principal of a live dashboard session; raises :class:`Unauthorized` otherwise.

    A session is as good as its token: a revoked or expired token ends it.
    """
    if not session_id:
        raise Unauthorized("no session: log in")
    if not isinstance(session_id, str) or not _SESSION.fullmatch(session_id):
        raise Unauthorized("malformed session id: log in again")
    found = drive(q.store, _read("session_get", id_hash=hash_token(session_id)))
    row = found[0] if found else None
    if row is None:
        raise Unauthorized("session ended (logged out or replaced): log in again")
    _refuse_ended(row)
    if row["session_expired"]:
        raise Unauthorized("session expired: log in again")
    return _principal(row)


def end_session(q: Queue, session_id: str) -> None:
    """Log out: the session ends for every replica (an unknown id changes nothing)."""
    if isinstance(session_id, str) and _SESSION.fullmatch(session_id):
        drive(q.store, _written(rows("session_delete", id_hash=hash_token(session_id))))


def worker_token(q: Queue, worker_id: str) -> str | None:
    """The id of the token that registered ``worker_id`` (None if none did or no such worker):
    :func:`leaseq.engine.common.worker_token`, the one read of that link, in a statement of its own."""
    return drive(q.store, alone(common.worker_token(worker_id)))


def token_held_task(q: Queue, token_id: str, task_id: int) -> bool:
    """Whether a worker registered by ``token_id`` holds or has held a lease on ``task_id``."""
    return drive(q.store, alone(token_held(token_id, task_id)))


def token_held(token_id: str, task_id: int) -> Op[bool]:
    """:func:`token_held_task` inside the caller's transaction."""
    found = yield one("token_held_task", token_id=token_id, task_id=task_id)
    return bool(found["held"])


def _read(query: str, **params: Any) -> Op[list[dict[str, Any]]]:
    """The rows of one read, in a transaction of its own."""
    yield BEGIN
    found: list[dict[str, Any]] = yield rows(query, **params)
    yield COMMIT
    return found


def _written(*steps: Rows | One) -> Op[None]:
    """``steps``, writes whose answers nobody needs, in one transaction of their own."""
    yield BEGIN
    for step in steps:
        yield step
    yield COMMIT


def alone(op: Op[T]) -> Op[T]:
    """``op``, a read inside a transaction, as a statement of its own (one round trip on PostgreSQL)."""
    yield BEGIN_ONE
    result = yield from op
    yield COMMIT
    return result


def record_action(q: Queue, actor: str, action: str, target: str | None = None, **detail: Any) -> None:
    """Write one entry to the audit log, in a transaction of its own.

    Not for operator or admin actions on the data: those go through
    :func:`leaseq.access.perform`, whose Queue method writes the entry in the action's own
    transaction. This is for entries that accompany no other write.
    """
    drive(q.store, _written(rows("audit_insert", actor=actor, action=action, target=target, detail=detail)))


def audit_log(q: Queue, limit: int = 100) -> list[dict[str, Any]]:
    """The newest audit entries first."""
    checks.check_int("limit", limit, minimum=1, maximum=10_000)
    entries = drive(q.store, _read("audit_list", limit=limit))
    for r in entries:  # SQLite hands back a column named plainly "at" as epoch seconds
        if isinstance(r["at"], (int, float)):
            r["at"] = datetime.fromtimestamp(r["at"], tz=timezone.utc)
    return entries
