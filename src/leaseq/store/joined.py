"""A store whose every transaction is one transaction already open.

:meth:`leaseq.Queue.joined` hands out a view of a queue built on it, so
that several operations (and whatever the caller runs first, such as a
token check) commit or roll back together, through the very same
operations, queries and guards as usual. Nothing here knows a lease rule.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from typing import Any

from .base import Store, TaskListener, Tx


class JoinedStore:
    """Wraps ``store``; :meth:`transaction` yields the open ``tx`` every time.

    A ``one_statement`` promise is simply kept inside the larger transaction
    (the store contract allows a backend to ignore it). There is no asyncio
    path: callers run the sync operations (``run_async`` is None).
    """

    run_async = None

    def __init__(self, store: Store, tx: Tx):
        self._store = store
        self._tx = tx
        self.dialect = store.dialect
        self.dsn = store.dsn
        #: what the wrapped backend declares (its statements run as they always do)
        self.capabilities = store.capabilities
        #: the wrapped store's share of the process's notifier
        self.notifier = store.notifier

    @contextmanager
    def transaction(self, *, one_statement: bool = False) -> Iterator[Tx]:
        yield self._tx

    def listener(self, queues: set[str], *, on_interrupt: Any = None) -> Any:
        return self._store.listener(queues, on_interrupt=on_interrupt)

    async def alistener(self, queues: set[str]) -> Any:
        return await self._store.alistener(queues)

    def task_listener(self, task_id: int, *, streams: bool = False) -> TaskListener:
        return self._store.task_listener(task_id, streams=streams)

    async def atask_listener(self, task_id: int, *, streams: bool = False) -> Any:
        return await self._store.atask_listener(task_id, streams=streams)

    def caller_tx(self, connection: Any) -> Tx:
        return self._store.caller_tx(connection)

    def acaller_tx(self, connection: Any) -> Any:
        return self._store.acaller_tx(connection)

    def close(self) -> None:
        """Nothing: the wrapped store belongs to the queue the view was made from."""

    async def close_async(self) -> None:
        """Nothing: see :meth:`close`."""


class CallerStore(JoinedStore):
    """Wraps ``store``; every transaction is the caller's own open one.

    ``enqueue(..., connection=conn)`` runs through it: the statements run on
    the caller's connection, in the caller's transaction, and nothing is
    committed here, so the task exists only if the caller commits (the
    outbox pattern). ``tx`` for blocking code; ``atx`` for asyncio code
    (then the operation is awaited on the event loop), as
    :meth:`leaseq.Queue.ajoined` hands it out.
    """

    def __init__(self, store: Store, tx: Tx | None = None, atx: Any = None):
        super().__init__(store, tx)  # type: ignore[arg-type]
        self._atx = atx
        self.capabilities = replace(store.capabilities, native_async=atx is not None)

    @asynccontextmanager
    async def atransaction(self, *, one_statement: bool = False) -> AsyncIterator[Any]:
        yield self._atx
