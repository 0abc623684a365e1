"""FencedStore: refuse stale writers and run each idempotent action once.

A downstream service keeps two small tables (``leaseq_fence_tokens``,
``leaseq_fence_outcomes``) in its own database, PostgreSQL or SQLite, and
routes every write it wants protected through :meth:`FencedStore.apply`::

    store = FencedStore("postgresql://localhost/shop")
    store.migrate()

    def charge(conn):                      # conn: the store's own connection
        conn.execute("UPDATE orders SET paid = true WHERE id = %s", (order_id,))
        return {"charged": order_id}

    store.apply(f"order:{order_id}", fencing_token=generation, write=charge,
                idempotency_key=fx.idempotency_key)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from ..core.errors import InvalidInput, StaleToken
from .backends import open_fence_backend
from .errors import IdempotencyKeyReused

T = TypeVar("T")

#: Fencing tokens are stored as BIGINT.
MAX_TOKEN = 2**63 - 1
#: Longest resource key or idempotency key accepted.
MAX_KEY_LENGTH = 1000
# An escaped NUL (\u0000 not preceded by an odd run of backslashes) in JSON text.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


@dataclass(frozen=True)
class StoredOutcome:
    """The recorded result of one idempotency key."""

    idempotency_key: str
    #: The resource the key is bound to; it cannot be reused for another.
    resource_key: str
    #: The fencing token the action was applied with (None when unfenced).
    fencing_token: int | None
    #: The write's return value, as JSON gave it back.
    value: Any
    recorded_at: datetime


def check_token(field: str, token: Any) -> int:
    """``token`` if it is a usable fencing token, else :class:`InvalidInput` naming ``field``."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidInput(field, f"must be an integer, not {type(token).__name__}")
    if not 0 <= token <= MAX_TOKEN:
        raise InvalidInput(field, f"must be between 0 and {MAX_TOKEN}, not {token}")
    return token


def check_key(field: str, key: Any) -> str:
    """``key`` if it is a usable resource or idempotency key, else :class:`InvalidInput`."""
    if not isinstance(key, str) or not key:
        raise InvalidInput(field, "must be a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidInput(field, f"must be at most {MAX_KEY_LENGTH} characters, not {len(key)}")
    if "\x00" in key:
        raise InvalidInput(field, "must not contain NUL characters")
    return key


class FencedStore:
    """Fencing tokens and idempotency records for a downstream resource.

    ``dsn`` is ``postgresql://…`` (psycopg 3 with a connection pool; options
    ``min_size``, ``max_size``, ``connect_timeout``) or ``sqlite:///file.db``
    (WAL mode, one connection per thread; option ``busy_timeout``). The
    tables live beside the service's own, so a write on the store's
    connection commits or rolls back together with the fence. Open one
    store per process (connections do not survive ``fork``); a store is
    safe to share between threads.
    """

    def __init__(self, dsn: str, **options: Any):
        self._backend = open_fence_backend(dsn, **options)
        #: ``"postgres"`` or ``"sqlite"``: which SQL dialect a write must speak.
        self.dialect: str = self._backend.dialect

    def __repr__(self) -> str:
        return f"FencedStore(dialect={self.dialect!r})"

    def migrate(self) -> None:
        """Create the fencing tables if they do not exist. Idempotent and safe to race."""
        with self._backend.transaction() as conn:
            for query in ("schema_lock", "create_tokens_table", "create_outcomes_table"):
                self._backend.run(conn, query)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A transaction on the store's database with no fence: for the service's own tables.

        Yields the same kind of connection :meth:`apply` passes to a write.
        """
        with self._backend.transaction() as conn:
            yield conn

    def apply(self, resource_key: str, fencing_token: int | None, write: Callable[[Any], T], *,
              idempotency_key: str | None = None) -> T | Any:
        """Run ``write(conn)`` if ``fencing_token`` is not older than any token accepted for ``resource_key``.

        One transaction holds, in order:

        1. The fence. The fence row of ``resource_key`` is locked to the end
           of the transaction. If ``fencing_token`` is lower than the newest
           token accepted for that key, :class:`leaseq.StaleToken` is raised,
           ``write`` is not called and nothing changes. A token higher than
           the newest is recorded as the newest; an equal one is accepted
           (the same attempt may write several times). ``None`` skips the
           fence: idempotency only.
        2. The idempotency key, when given. If ``idempotency_key`` already
           has a stored outcome, that outcome is returned and ``write`` is
           not called (the fence of step 1 still applies first: a stale token
           is refused even for an action already done). A key is bound to the
           resource it was first applied to; reusing it for another resource
           raises :class:`IdempotencyKeyReused` and changes nothing.
        3. ``write(conn)``. ``conn`` is the store's own connection inside the
           transaction: a ``psycopg.Connection`` (autocommit mode, inside a
           ``conn.transaction()`` block, ``%s`` parameters, tuple rows) whose
           transaction holds ``SELECT … FOR UPDATE`` on the fence row, or a
           ``sqlite3.Connection`` inside ``BEGIN IMMEDIATE`` (``?``
           parameters). Writes made through ``conn`` commit together with the
           fence and the outcome; the write must not commit or roll back
           itself. Anything else the write does (an HTTP call, another
           database) is not undone if the transaction rolls back.
        4. The outcome. With ``idempotency_key``, the write's return value
           must be JSON-serialisable; it is stored with the key in the same
           transaction, and the JSON form is returned (so the first call and
           every replay return equal values). Without a key, the return
           value is passed through as it is.

        If ``write`` raises, the transaction rolls back (no token recorded,
        no outcome stored) and the exception propagates. Concurrent applies
        on one resource key run one after another; a concurrent apply with
        an idempotency key still in flight waits for it, then replays it.
        """
        check_key("resource_key", resource_key)
        if fencing_token is not None:
            check_token("fencing_token", fencing_token)
        if idempotency_key is not None:
            check_key("idempotency_key", idempotency_key)
        if not callable(write):
            raise InvalidInput("write", "must be a callable taking the store's connection")
        run = self._backend.run
        with self._backend.transaction() as conn:
            if fencing_token is not None:
                self._pass_fence(conn, resource_key, fencing_token)
            if idempotency_key is not None:
                reserved = run(conn, "reserve_key", idempotency_key=idempotency_key,
                               resource_key=resource_key, token=fencing_token)
                if not reserved:
                    return self._replay(conn, idempotency_key, resource_key)
            value = write(conn)
            if idempotency_key is None:
                return value
            encoded = self._encode_outcome(value)
            run(conn, "record_outcome", idempotency_key=idempotency_key, outcome=encoded)
            return json.loads(encoded)

    def newest_token(self, resource_key: str) -> int | None:
        """The newest fencing token accepted for ``resource_key``, or None if none was."""
        check_key("resource_key", resource_key)
        with self._backend.connection() as conn:
            rows = self._backend.run(conn, "newest_token", resource_key=resource_key)
        return rows[0]["newest_token"] if rows else None

    def outcome(self, idempotency_key: str) -> StoredOutcome | None:
        """The stored outcome of ``idempotency_key``, or None if it was never applied."""
        check_key("idempotency_key", idempotency_key)
        with self._backend.connection() as conn:
            rows = self._backend.run(conn, "get_outcome", idempotency_key=idempotency_key)
        if not rows:
            return None
        row = rows[0]
        return StoredOutcome(idempotency_key=row["idempotency_key"], resource_key=row["resource_key"],
                             fencing_token=row["fencing_token"], value=row["outcome"],
                             recorded_at=row["recorded_at"])

    def close(self) -> None:
        """Release every connection."""
        self._backend.close()

    def __enter__(self) -> FencedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pass_fence(self, conn: Any, resource_key: str, token: int) -> None:
        """Lock the fence row of ``resource_key``; raise StaleToken or record ``token``."""
        run = self._backend.run
        rows = run(conn, "lock_fence", resource_key=resource_key)
        if not rows:
            if run(conn, "create_fence", resource_key=resource_key, token=token):
                return  # the first token ever seen for this key
            rows = run(conn, "lock_fence", resource_key=resource_key)  # lost the race to create it
        newest = rows[0]["newest_token"]
        if token < newest:
            exc = StaleToken(f"resource {resource_key!r}: fencing token {token} is older than "
                             f"the newest accepted token {newest}; the write was refused")
            exc.resource_key, exc.token, exc.newest_token = resource_key, token, newest
            raise exc
        if token > newest:
            run(conn, "advance_fence", resource_key=resource_key, token=token)

    def _replay(self, conn: Any, idempotency_key: str, resource_key: str) -> Any:
        rows = self._backend.run(conn, "get_outcome", idempotency_key=idempotency_key)
        if not rows:  # pragma: no cover - outcomes are never deleted
            raise RuntimeError(f"idempotency key {idempotency_key!r} is reserved but has no outcome")
        if rows[0]["resource_key"] != resource_key:
            raise IdempotencyKeyReused(idempotency_key, rows[0]["resource_key"], resource_key)
        return rows[0]["outcome"]

    def _encode_outcome(self, value: Any) -> str:
        try:
            encoded = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise InvalidInput("outcome", f"the write's return value must be JSON-serialisable "
                               f"when an idempotency key is given: {exc}") from None
        if self.dialect == "postgres" and _JSON_NUL.search(encoded):
            raise InvalidInput("outcome", "PostgreSQL JSON cannot hold the NUL character (\\u0000)")
        return encoded
