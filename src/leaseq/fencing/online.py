"""Online verification of reference action tokens: the downstream asks the queue.

A reference token (``"lqt1.<id>.<secret>"``, minted by the queue's database
in the transaction that began the effect) is checked by asking the queue's
database, through ``verify_action_token``, whether it is genuine, in scope
and still backed by a live lease::

    verifier = QueueVerifier("postgresql://shop_verifier:…@queue-db/app")   # leaseq roles create verifier NAME
    claims = verifier.verify(token, action="orders.pay", resource="order:17")

On PostgreSQL the DSN is a verifier role's (``leaseq roles create verifier
NAME``): it can call ``verify_action_token`` and nothing else, so a
downstream holding it can neither mint a token nor read the queue's tables.
On SQLite it is the queue's file, opened read-only.

Why online: the queue refuses a token the moment its attempt stops holding
the lease (cancelled, revoked, expired and re-claimed), not when the token
expires, and no process other than the queue's database can mint one. The
price is a round trip per fenced request and a dependency on the queue
being reachable: when it is not, the request is refused (503), never let
through.
"""

from __future__ import annotations

import sqlite3
import threading
from datetime import datetime
from functools import cache
from typing import Any

from ..core import action_tokens
from ..core.errors import BackendUnavailable, ConfigError, InvalidInput
from .errors import InvalidActionToken
from .tokens import ActionClaims

#: The ``key_id`` of the claims of a reference token (it is checked against no key).
REFERENCE_KEY_ID = "reference"
_REASONS = {
    "unknown_token": "no such token (a wrong secret reads the same)",
    "expired": "the token has expired",
    "wrong_action": "the token was issued for another action",
    "wrong_idempotency_key": "the token was issued for another idempotency key",
    "wrong_resource": "the token was issued for another resource",
    "superseded": "the attempt that holds the token was superseded (its task was claimed again, or the "
                  "database failed over and the attempt's claim is not the task's claim there)",
    "lease_ended": "the attempt that holds the token no longer holds its lease (cancelled, revoked, "
                   "finished or expired)",
}


@cache
def _statement(dialect: str) -> str:
    from ..store.functions import call_sql, load_signatures
    from ..store.queries import load_named_queries, load_queries

    if dialect == "sqlite":
        return load_queries("sqlite")["verify_action_token"]
    return call_sql(load_named_queries("postgres")["verify_action_token"], load_signatures()["verify_action_token"])


def _seconds(value: Any) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


class QueueVerifier:
    """Checks reference action tokens online against the queue's database (see the module docstring).

    ``dsn``: a verifier role's ``postgresql://`` DSN, or ``sqlite:///path``
    of the queue's file. Thread-safe; connections are opened on first use.
    """

    def __init__(self, dsn: str):
        from ..db.dsn import parse_dsn

        try:
            dialect, _ = parse_dsn(dsn) if isinstance(dsn, str) and dsn.strip() else ("", "")
        except ConfigError:
            dialect = ""
        if not dialect:
            raise InvalidInput("dsn", "must be a verifier role's postgresql:// DSN (or libpq keyword string, "
                               "e.g. 'host=a,b target_session_attrs=read-write') or the queue's sqlite:///path")
        self.dsn = dsn
        self.dialect = dialect
        self._conninfo = dsn
        self._prepare_threshold: int | None = 5  # psycopg's default
        if self.dialect == "postgres":
            from ..db.dsn import postgres_mode

            self._conninfo, mode = postgres_mode(dsn)
            self._prepare_threshold = 5 if mode.session_state else None  # nothing prepared behind a pooler
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never show the DSN's password
        return f"QueueVerifier(dialect={self.dialect!r})"

    def verify(self, token: str, *, action: str | None = None, idempotency_key: str | None = None,
               resource: str | None = None) -> ActionClaims:
        """The claims of ``token`` if the queue vouches for it now; else :class:`InvalidActionToken`.

        Refused (``reason``): ``malformed``, ``unknown_token`` (no such token,
        or a wrong secret), ``expired``, ``wrong_action``,
        ``wrong_idempotency_key``, ``wrong_resource`` (a token naming no
        resource passes: the caller decides), ``superseded`` and
        ``lease_ended`` (its attempt no longer holds a live lease). An
        unreachable queue raises :class:`leaseq.BackendUnavailable`.
        """
        parsed = action_tokens.parse(token)
        if parsed is None:
            raise InvalidActionToken("malformed", "not a reference action token ('lqt1.<id>.<secret>')")
        token_id, token_hash = parsed
        params = {"token_id": token_id, "token_hash": token_hash, "action": action,
                  "idempotency_key": idempotency_key, "resource": resource}
        row = self._ask(params)
        refusal = row["refusal"]
        if refusal is not None:
            raise InvalidActionToken(str(refusal), _REASONS.get(str(refusal), str(refusal)))
        return ActionClaims(key_id=REFERENCE_KEY_ID, task_id=int(row["task_id"]), generation=int(row["generation"]),
                            action=row["action"], idempotency_key=row["idempotency_key"],
                            issued_at=_seconds(row["issued_at"]), expires_at=_seconds(row["expires_at"]),
                            resource=row["resource"], epoch=int(row.get("claim_epoch") or 0))

    def _ask(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.dialect == "sqlite":
            return self._ask_sqlite(params)
        import psycopg
        from psycopg.rows import dict_row

        with self._lock:
            conn = self._idle.pop() if self._idle else None
        while True:
            reused = conn is not None
            try:
                if conn is None:
                    conn = psycopg.connect(self._conninfo, autocommit=True, row_factory=dict_row, connect_timeout=5,
                                           prepare_threshold=self._prepare_threshold)
                row = conn.execute(_statement("postgres"), params).fetchone()
                break
            except psycopg.Error as exc:
                if conn is not None:
                    conn.close()
                    conn = None
                if reused:
                    # An idle connection that died meanwhile (a restart, a failover: a multi-host
                    # DSN then finds the new primary): asked once more on a new connection.
                    continue
                raise BackendUnavailable(f"the queue could not check the action token: "
                                         f"{str(exc).strip()}") from None
        with self._lock:
            self._idle.append(conn)
        assert row is not None  # the query answers one row, always
        return dict(row)

    def _ask_sqlite(self, params: dict[str, Any]) -> dict[str, Any]:
        path = self.dsn[len("sqlite:///"):]
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"the queue's file could not be opened: {exc}") from None
        try:
            conn.row_factory = sqlite3.Row
            row = conn.execute(_statement("sqlite"), params).fetchone()
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"the queue could not check the action token: {exc}") from None
        finally:
            conn.close()
        return dict(row)

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
