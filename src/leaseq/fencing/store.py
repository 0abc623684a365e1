"""FencedStore: refuse stale writers and run each idempotent action once.

A downstream service keeps two small tables (``leaseq_fence_tokens``,
``leaseq_fence_outcomes``) in its own database, PostgreSQL or SQLite, and
routes every write it wants protected through :meth:`FencedStore.apply`::

    store = FencedStore("postgresql://localhost/shop")
    store.migrate()

    def charge(conn):                      # conn: the store's own connection
        conn.execute("UPDATE orders SET paid = true WHERE id = %s", (order_id,))
        return {"charged": order_id}

    store.apply(f"order:{order_id}", fx.fencing_token, charge,
                idempotency_key=fx.idempotency_key)

A fencing token names its task: ``"<task_id>.<epoch>.<generation>"``, or
``"<task_id>.<generation>"`` when the lease epoch is 0 (what
``fx.fencing_token`` and ``ActionClaims.fencing_token`` give). Claim
generations only order the attempts of one task, so the fence keeps the
newest (epoch, generation) per resource *and task*: two tasks writing one
record never refuse each other, and a task's superseded attempt is refused.
The epoch is compared first: it grows whenever the queue's database history
may have been cut (a failover to a standby that had not received every
claim can hand one generation out twice), so an attempt made before a
failover is older than any made after it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from ..core.errors import InvalidInput, StaleToken
from ..core.model import format_fencing_token
from .backends import open_fence_backend
from .errors import IdempotencyKeyReused
from .lease_check import LeaseCheck

T = TypeVar("T")

#: Task ids and generations are stored as BIGINT.
MAX_TOKEN = 2**63 - 1
_FENCING_TOKEN = re.compile(r"([0-9]{1,19})\.(?:([0-9]{1,19})\.)?([0-9]{1,19})")
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
    fencing_token: str | None
    #: The write's return value, as JSON gave it back.
    value: Any
    recorded_at: datetime


def fencing_token(task_id: int, generation: int, epoch: int = 0) -> str:
    """The fencing token of attempt ``generation`` of task ``task_id`` claimed in lease epoch ``epoch``:
    ``"<task_id>.<epoch>.<generation>"``, or ``"<task_id>.<generation>"`` when the epoch is 0."""
    for field, value in (("task_id", task_id), ("generation", generation), ("epoch", epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN:
            raise InvalidInput(field, f"must be an integer between 0 and {MAX_TOKEN}, not {value!r}")
    return format_fencing_token(task_id, generation, epoch)


def stored_key(idempotency_key: str, task_id: int | None) -> str:
    """The key an outcome is stored under: per task, so no task can squat another's key.

    A fenced apply's key is namespaced by its task, ``"<task_id>:<key>"``,
    unless it already is (the key an action token names,
    ``fx.idempotency_key``, is). Two tasks using the same key therefore never
    meet; an unfenced apply (no task) keeps the key as given.
    """
    if task_id is None or idempotency_key.startswith(f"{task_id}:"):
        return idempotency_key
    return f"{task_id}:{idempotency_key}"


class Attempt(NamedTuple):
    """What a fencing token names: one attempt of one task."""

    task_id: int
    #: the lease epoch of the attempt's claim (0: a token of the form ``"<task_id>.<generation>"``)
    epoch: int
    generation: int

    @property
    def token(self) -> str:
        """The fencing token's string form."""
        return format_fencing_token(self.task_id, self.generation, self.epoch)


def parse_token(field: str, token: Any) -> Attempt:
    """The :class:`Attempt` a fencing token names, else :class:`InvalidInput` naming ``field``.

    ``"<task_id>.<epoch>.<generation>"``, or ``"<task_id>.<generation>"``
    (epoch 0: SQLite's claims, and PostgreSQL's made before schema 25).
    A bare integer is refused: a generation alone cannot be compared with
    anything, since generations only order the attempts of one task.
    """
    if isinstance(token, bool) or isinstance(token, int):
        raise InvalidInput(field, "must name its task: '<task_id>.<generation>' (fx.fencing_token), "
                           f"not the bare generation {token!r}")
    if not isinstance(token, str):
        raise InvalidInput(field, f"must be a string '<task_id>.<generation>', not {type(token).__name__}")
    match = _FENCING_TOKEN.fullmatch(token)
    if match is None:
        raise InvalidInput(field, f"must be '<task_id>.<generation>' or '<task_id>.<epoch>.<generation>' "
                           f"(non-negative integers), not {token[:40]!r}")
    attempt = Attempt(int(match[1]), int(match[2] or 0), int(match[3]))
    if max(attempt) > MAX_TOKEN:
        raise InvalidInput(field, f"task id, epoch and generation must each be at most {MAX_TOKEN}")
    return attempt


def check_token(field: str, token: Any) -> str:
    """``token`` if it is a usable fencing token, else :class:`InvalidInput` naming ``field``."""
    parse_token(field, token)  # a string, or it raised
    return str(token)


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

    def __init__(self, dsn: str, *, lease_check: LeaseCheck | None = None, **options: Any):
        if lease_check is not None and not isinstance(lease_check, LeaseCheck):
            raise InvalidInput("lease_check", "must be a leaseq.fencing.QueueLeaseCheck (or another LeaseCheck)")
        #: asks the queue, inside each fenced apply, whether the attempt still holds its lease
        self.lease_check = lease_check
        self._backend = open_fence_backend(dsn, **options)
        #: ``"postgres"`` or ``"sqlite"``: which SQL dialect a write must speak.
        self.dialect: str = self._backend.dialect

    def __repr__(self) -> str:
        return f"FencedStore(dialect={self.dialect!r})"

    def migrate(self) -> None:
        """Create the fencing tables if they do not exist. Idempotent and safe to race."""
        try:
            self._migrate()
        except Exception as exc:
            # 23505: a unique violation, here on the catalogue (psycopg may not be installed)
            if self._backend.advisory_locks or getattr(exc, "sqlstate", None) != "23505":
                raise
            # The portable mode locks the attempts table, which the first migrate creates: two
            # that both found none raced to create it, and this one lost. The winner has
            # committed (the loser waited for it): this time the table is there to lock.
            self._migrate()

    def _migrate(self) -> None:
        with self._backend.transaction() as conn:
            if self._backend.advisory_locks:
                queries = ("schema_lock", "create_attempts_table", "create_outcomes_table")
            else:  # no advisory lock (the portable mode): the attempts table is the lock
                queries = ("create_attempts_table", "schema_lock_table", "create_outcomes_table")
            for query in queries:
                self._backend.run(conn, query)
            # Stores made before fences were per task: their outcomes gain the task column.
            if not self._backend.run(conn, "outcomes_have_task"):
                self._backend.run(conn, "add_outcomes_task")
            # Stores made before lease epochs: every attempt they accepted was of epoch 0.
            if not self._backend.run(conn, "fences_have_epoch"):
                self._backend.run(conn, "add_fence_epoch")
            if not self._backend.run(conn, "outcomes_have_epoch"):
                self._backend.run(conn, "add_outcomes_epoch")

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A transaction on the store's database with no fence: for the service's own tables.

        Yields the same kind of connection :meth:`apply` passes to a write.
        """
        with self._backend.transaction() as conn:
            yield conn

    def apply(self, resource_key: str, fencing_token: str | None, write: Callable[[Any], T], *,
              idempotency_key: str | None = None) -> T | Any:
        """Run ``write(conn)`` unless a newer attempt of the token's task already wrote to ``resource_key``.

        ``fencing_token`` is ``"<task_id>.<epoch>.<generation>"`` or
        ``"<task_id>.<generation>"`` (epoch 0) (``fx.fencing_token``).
        One transaction holds, in order:

        1. The fence. The fence row of (``resource_key``, task) is locked to
           the end of the transaction. Attempts are ordered by lease epoch,
           then generation: if the token's (epoch, generation) is lower than
           the newest one accepted for that task on that resource,
           :class:`leaseq.StaleToken` is raised, ``write`` is not called and
           nothing changes (an attempt made before a failover is refused once
           an attempt made after it has written, whatever their generations).
           A higher one is recorded as the newest; an
           equal one is accepted (the same attempt may write several times).
           Other tasks' generations are never compared: each task has its
           own row. ``None`` skips the fence: idempotency only.
        2. The exact check, when the store has a ``lease_check``
           (:class:`~leaseq.fencing.QueueLeaseCheck`): the queue is asked
           whether that attempt still holds its lease, and the answer is
           held until commit. If not, :class:`leaseq.StaleToken`, nothing
           changes.
        3. The idempotency key, when given. If ``idempotency_key`` already
           has a stored outcome, that outcome is returned and ``write`` is
           not called (the fence still applies first: a stale token is
           refused even for an action already done). Keys are kept per
           task (:func:`stored_key`): another task's use of the same key is
           another key, so no task can make another get
           :class:`IdempotencyKeyReused`. A key is bound to the resource it
           was first applied with; reusing it for another resource raises
           :class:`IdempotencyKeyReused` and changes nothing.
        4. ``write(conn)``. ``conn`` is the store's own connection inside the
           transaction: a ``psycopg.Connection`` (autocommit mode, inside a
           ``conn.transaction()`` block, ``%s`` parameters, tuple rows) whose
           transaction holds ``SELECT … FOR UPDATE`` on the fence row, or a
           ``sqlite3.Connection`` inside ``BEGIN IMMEDIATE`` (``?``
           parameters). Writes made through ``conn`` commit together with the
           fence and the outcome; the write must not commit or roll back
           itself. Anything else the write does (an HTTP call, another
           database) is not undone if the transaction rolls back.
        5. The outcome. With ``idempotency_key``, the write's return value
           must be JSON-serialisable; it is stored with the key in the same
           transaction, and the JSON form is returned (so the first call and
           every replay return equal values). Without a key, the return
           value is passed through as it is.

        If ``write`` raises, the transaction rolls back (no token recorded,
        no outcome stored) and the exception propagates. Concurrent applies
        on one resource and task run one after another; a concurrent apply
        with an idempotency key still in flight waits for it, then replays it.
        """
        check_key("resource_key", resource_key)
        attempt = None if fencing_token is None else parse_token("fencing_token", fencing_token)
        if idempotency_key is not None:
            check_key("idempotency_key", idempotency_key)
        if not callable(write):
            raise InvalidInput("write", "must be a callable taking the store's connection")
        run = self._backend.run
        with ExitStack() as lease_held:  # left after the fence transaction has committed
            with self._backend.transaction() as conn:
                if attempt is not None:
                    self._pass_fence(conn, resource_key, attempt)
                    if self.lease_check is not None:
                        lease_held.enter_context(self.lease_check.hold(
                            conn, self.dialect, attempt.task_id, attempt.generation, epoch=attempt.epoch))
                if idempotency_key is not None:
                    given, idempotency_key = idempotency_key, stored_key(idempotency_key, attempt and attempt[0])
                    reserved = run(conn, "reserve_key", idempotency_key=idempotency_key,
                                   resource_key=resource_key, task_id=attempt and attempt.task_id,
                                   generation=attempt and attempt.generation, epoch=attempt and attempt.epoch)
                    if not reserved:
                        return self._replay(conn, idempotency_key, given, resource_key, attempt)
                value = write(conn)
                if idempotency_key is None:
                    return value
                encoded = self._encode_outcome(value)
                run(conn, "record_outcome", idempotency_key=idempotency_key, outcome=encoded)
                return json.loads(encoded)

    def newest_generation(self, resource_key: str, task_id: int) -> int | None:
        """The generation of the newest attempt of task ``task_id`` accepted for ``resource_key``, or None
        if none was (:meth:`newest_attempt` gives its lease epoch too)."""
        newest = self.newest_attempt(resource_key, task_id)
        return None if newest is None else newest.generation

    def newest_attempt(self, resource_key: str, task_id: int) -> Attempt | None:
        """The newest attempt of task ``task_id`` accepted for ``resource_key`` (highest lease epoch,
        then generation), or None if none was."""
        check_key("resource_key", resource_key)
        fencing_token(task_id, 0)  # checks task_id
        with self._backend.connection() as conn:
            rows = self._backend.run(conn, "newest_generation", resource_key=resource_key, task_id=task_id)
        if not rows:
            return None
        return Attempt(task_id, int(rows[0]["newest_epoch"]), int(rows[0]["newest_generation"]))

    def outcome(self, idempotency_key: str, task_id: int | None = None) -> StoredOutcome | None:
        """The stored outcome of ``idempotency_key``, or None if it was never applied.

        ``task_id``: the task whose fenced apply stored it (keys are kept per
        task; see :func:`stored_key`); None for an unfenced apply's key.
        """
        check_key("idempotency_key", idempotency_key)
        if task_id is not None:
            fencing_token(task_id, 0)  # checks task_id
        with self._backend.connection() as conn:
            rows = self._backend.run(conn, "get_outcome", idempotency_key=stored_key(idempotency_key, task_id))
        if not rows:
            return None
        row = rows[0]
        token = None if row["task_id"] is None else format_fencing_token(
            row["task_id"], row["fencing_token"], row["fencing_epoch"] or 0)
        return StoredOutcome(idempotency_key=row["idempotency_key"], resource_key=row["resource_key"],
                             fencing_token=token, value=row["outcome"], recorded_at=row["recorded_at"])

    def close(self) -> None:
        """Release every connection."""
        self._backend.close()

    def __enter__(self) -> FencedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pass_fence(self, conn: Any, resource_key: str, attempt: Attempt) -> None:
        """Lock the fence row of (``resource_key``, task); raise StaleToken or record ``attempt``."""
        run = self._backend.run
        task_id = attempt.task_id
        where = dict(resource_key=resource_key, task_id=task_id)
        rows = run(conn, "lock_fence", **where)
        if not rows:
            if run(conn, "create_fence", **where, epoch=attempt.epoch, generation=attempt.generation):
                return  # the task's first write to this resource
            rows = run(conn, "lock_fence", **where)  # lost the race to create it
        newest = Attempt(task_id, int(rows[0]["newest_epoch"]), int(rows[0]["newest_generation"]))
        # The epoch first: an attempt from before a failover is older than any after it.
        if (attempt.epoch, attempt.generation) < (newest.epoch, newest.generation):
            what = (f"generation {attempt.generation} is older than its generation {newest.generation}"
                    if attempt.epoch == newest.epoch else
                    f"attempt {attempt.token} is from lease epoch {attempt.epoch}, before its attempt "
                    f"{newest.token} of epoch {newest.epoch} (the queue's database failed over in between)")
            exc = StaleToken(f"resource {resource_key!r}: task {task_id} {what} already accepted; "
                             "the write was refused")
            exc.resource_key, exc.token = resource_key, attempt.token
            exc.newest_token = newest.token
            raise exc
        if (attempt.epoch, attempt.generation) > (newest.epoch, newest.generation):
            run(conn, "advance_fence", **where, epoch=attempt.epoch, generation=attempt.generation)

    def _replay(self, conn: Any, idempotency_key: str, given: str, resource_key: str,
                attempt: Attempt | None) -> Any:
        """The outcome stored under ``idempotency_key`` (the caller's key ``given``, as stored)."""
        rows = self._backend.run(conn, "get_outcome", idempotency_key=idempotency_key)
        if not rows:  # pragma: no cover - outcomes are never deleted
            raise RuntimeError(f"idempotency key {idempotency_key!r} is reserved but has no outcome")
        row = rows[0]
        if row["resource_key"] != resource_key:
            raise IdempotencyKeyReused(given, row["resource_key"], resource_key)
        task_id = None if attempt is None else attempt[0]
        if row["task_id"] is not None and row["task_id"] != task_id:
            # Only the task that did the action may see its outcome again.
            raise IdempotencyKeyReused(given, row["resource_key"], resource_key,
                                       bound_task=row["task_id"], task_id=task_id)
        return row["outcome"]

    def _encode_outcome(self, value: Any) -> str:
        try:
            encoded = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise InvalidInput("outcome", f"the write's return value must be JSON-serialisable "
                               f"when an idempotency key is given: {exc}") from None
        if self.dialect == "postgres" and _JSON_NUL.search(encoded):
            raise InvalidInput("outcome", "PostgreSQL JSON cannot hold the NUL character (\\u0000)")
        return encoded
