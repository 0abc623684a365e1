"""The backend contract and the named-query loader (DSN parsing lives in :mod:`leaseq.db.dsn`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Protocol

from ..db.dsn import DEFAULT_DSN, parse_dsn
from .queries import load_named_queries, load_queries, parse_named_blocks

__all__ = ["BackendCapabilities", "DEFAULT_DSN", "JSON_COLUMNS", "JSON_PARAMS", "JsonText", "STREAM_PAYLOAD", "KeyConflict", "Migration", "Store", "TaskListener", "Tx",
           "WorkListener", "load_migrations", "load_named_queries", "load_queries", "open_store", "parse_dsn", "parse_named_blocks"]

#: Parameters that carry JSON documents (encoded by each backend its own way);
#: the plural ones are the row documents of batched statements.
JSON_PARAMS = frozenset({"payload", "result", "detail", "response", "tasks", "items", "events", "keys", "leases",
                         "declarations", "item", "budget"})

#: The payload of a notification on a task's channel (``leaseq_task_<id>``) saying its
#: handler emitted (``notify_stream``); a settled task's says its status.
STREAM_PAYLOAD = "stream"


class KeyConflict(Exception):
    """A statement without ON CONFLICT met a unique key already stored; nothing was written."""


class JsonText(str):
    """A JSON parameter already encoded (and checked) by the caller: sent as it is."""


#: Columns that come back as JSON documents.
JSON_COLUMNS = frozenset({"payload", "result", "detail", "response", "actions", "resources", "limits", "signature",
                          "kinds", "item", "wait_children", "budget", "spent", "budget_owners"})


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend can do, declared once on its class; code asks these, never the dialect's name."""

    #: an asyncio driver: operations are awaited on the event loop itself
    #: (else an async caller runs them in a thread)
    native_async: bool
    #: claim_batch and complete_batch write their own "claimed" and
    #: "completed" events in the same statement (else the caller writes them
    #: in the same transaction)
    writes_own_evidence: bool
    #: enqueues wake idle workers (LISTEN/NOTIFY); else workers poll
    listen_notify: bool
    #: one write transaction at a time: more writer threads only pass the lock around
    serial_writes: bool
    #: claim_batch takes, and complete_batch gives back, their tasks' limit
    #: slots in the same statement (else the caller does, with take_limits and
    #: release_limits, in the same transaction)
    own_limit_slots: bool = False
    #: claim_fair charges the fairness keys of the tasks it claims in the same
    #: statement (else the caller does, with charge_fair_share, in the same transaction)
    own_fair_share: bool = False
    #: lean claim statements: claim_plain for a queue whose tasks never named a
    #: fairness key, a limit or a singleton key, which says in its answer when the
    #: queue needs the full one (else every claim runs claim_batch), and
    #: claim_fair_one for a queue where one fairness key alone is queued, which
    #: says when the queue needs claim_fair again (else claim_fair serves it), and
    #: claim_fair_one_plain, its form for a queue whose tasks never named a limit or
    #: a singleton key, which says when the queue needs claim_fair_one
    lean_claim: bool = False
    #: a lean completion: complete_plain for leases whose tasks name no limit,
    #: without complete_batch's steps that give limit slots back (it leaves a task
    #: that names one to complete_batch); else every completion runs complete_batch
    lean_complete: bool = False
    #: migrations are serialised by an advisory lock (else by a lock on their bookkeeping
    #: table: the portable mode, for servers without advisory locks)
    advisory_locks: bool = True


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


@cache
def load_migrations(dialect: str) -> tuple[Migration, ...]:
    """The numbered migrations of ``sql/<dialect>/migrations/``, in order."""
    folder = resources.files("leaseq").joinpath("sql", dialect, "migrations")
    found = []
    for entry in folder.iterdir():
        m = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    return tuple(sorted(found, key=lambda mig: mig.version))


class Tx(Protocol):
    """One open transaction."""

    def rows(self, query: str, **params: Any) -> list[dict[str, Any]]:
        """Run a named query and return every row."""

    def row(self, query: str, **params: Any) -> dict[str, Any] | None:
        """Run a named query and return its first row, or None."""

    def run_many(self, query: str, params: list[dict[str, Any]]) -> None:
        """Run a named query once per parameter set."""

    def script(self, sql: str) -> None:
        """Run a migration script (several statements, no parameters)."""


class WorkListener(Protocol):
    """Blocks until work may be waiting; see :meth:`leaseq.Queue.listener`."""

    def wait(self, timeout: float) -> bool:
        """Return True when woken by a notification, False after ``timeout`` seconds."""

    def close(self) -> None:
        """Stop listening."""


class TaskListener(Protocol):
    """Blocks until one task may have ended; see :meth:`leaseq.Queue.wait`."""

    def wait(self, timeout: float) -> bool:
        """Return True when notified, False after at most ``timeout`` seconds (a backend
        that cannot notify returns sooner: its waiters poll)."""

    def close(self) -> None:
        """Stop listening."""


class Store(Protocol):
    """A database holding leaseq's tables."""

    dialect: str
    dsn: str
    capabilities: BackendCapabilities
    #: the store's share of its process's one LISTEN connection
    #: (:class:`leaseq.store.notifier.Share`), which every waiter of the process is woken
    #: through; None where :attr:`capabilities` declares no ``listen_notify``
    notifier: Any

    def transaction(self, *, one_statement: bool = False) -> AbstractContextManager[Tx]:
        """A read-write transaction that commits on success, rolls back on error.

        ``one_statement=True`` promises the block runs a single statement that
        is atomic by itself; a backend may then skip BEGIN and COMMIT. Code in
        the block must still be correct if the backend ignores the promise.
        """

    def atransaction(self, *, one_statement: bool = False) -> AbstractAsyncContextManager[Any]:
        """:meth:`transaction` for asyncio code, whose ``rows`` and ``script`` are awaited.
        Only where :attr:`capabilities` declares ``native_async``."""

    def listener(self, queues: set[str], *, on_interrupt: Callable[[str], None] | None = None) -> WorkListener:
        """A waiter woken when work arrives on one of ``queues``. ``on_interrupt``: called
        (on the waiting thread) with the id of each worker whose waiting claims a service
        process was asked to end (``notify_interrupt``), where the backend notifies."""

    async def alistener(self, queues: set[str]) -> Any:
        """:meth:`listener` for asyncio code: its ``wait`` and ``close`` are awaited, on the
        running event loop (the worker runtime's LISTEN)."""

    def task_listener(self, task_id: int, *, streams: bool = False) -> TaskListener:
        """A waiter woken when task ``task_id`` may have ended (see :meth:`leaseq.Queue.wait`);
        with ``streams``, also when its handler emits (see :meth:`leaseq.Queue.stream`)."""

    async def atask_listener(self, task_id: int, *, streams: bool = False) -> Any:
        """:meth:`task_listener` for asyncio code: its ``wait`` and ``close`` are awaited."""

    def caller_tx(self, connection: Any) -> Tx:
        """The application's own open transaction on ``connection``, as a :class:`Tx`
        (``enqueue(..., connection=)``); InvalidInput (field ``connection``) for a
        connection this backend cannot use."""

    def acaller_tx(self, connection: Any) -> Any:
        """:meth:`caller_tx` for an asyncio connection (backends that declare ``native_async``)."""

    def close(self) -> None:
        """Release every connection."""

    async def close_async(self) -> None:
        """Release the connections :meth:`atransaction` opened for the running event loop."""


def open_store(dsn: str | None = None, **options: Any) -> Store:
    """Open the backend a DSN names."""
    dialect, target = parse_dsn(dsn)
    if dialect == "postgres":
        from .postgres import PostgresStore

        return PostgresStore(target, **options)
    from .sqlite import SqliteStore

    return SqliteStore(target, **options)
