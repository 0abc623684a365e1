"""AsyncQueue: the queue's operations for asyncio applications.

Each method drives the same operation as its :class:`leaseq.Queue` method
(written once in :mod:`leaseq.engine`), with the same signature, awaited:
on PostgreSQL on the event loop itself (psycopg's asyncio connections), on
SQLite in a thread, as sqlite3 has no asyncio form.
tests/conformance/test_async.py checks that every method's signature matches.

It is also the worker runtime's port onto a database
(:class:`leaseq.worker.transport.Transport`): the runtime awaits every call
of a direct worker here, on its own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, Literal, overload

from . import engine
from .core import checks
from .core.capabilities import Capabilities
from .core.errors import BackendUnavailable, LeaseLost
from .core.model import Approval, Claim, Effect, Event, StreamItem, Task, Worker
from .engine.steps import Op, T
from .observability.tracing import atraced_enqueue
from .queue import Queue, connect
from .queue.operator import deciding


class AsyncQueue:
    """Asyncio facade over a :class:`Queue`. Create it with :func:`leaseq.connect_async`."""

    def __init__(self, queue: Queue):
        self.sync = queue
        self.settings = queue.settings

    async def _arun(self, op: Op[T]) -> T:
        return await engine.adrive(self.sync.store, op)

    async def _arun_again(self, make: Callable[[], Op[T]]) -> T:
        """:meth:`Queue._run_again`, awaited."""
        attempt = 1
        while True:
            try:
                return await self._arun(make())
            except BackendUnavailable as exc:
                if not self.sync._run_again_after(exc, attempt):
                    raise
                attempt += 1

    @property
    def dialect(self) -> str:
        """``"postgres"`` or ``"sqlite"``."""
        return self.sync.dialect

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection, the event loop's own included."""
        await self.sync.close_async()
        await asyncio.to_thread(self.sync.close)

    @property
    def capabilities(self) -> Capabilities:
        """What the worker runtime may rely on (those of the :class:`Queue` underneath)."""
        return self.sync.capabilities

    async def close_async(self) -> None:
        """Close the connections opened for the running event loop only (the queue stays open)."""
        await self.sync.close_async()

    async def listener(self, queues: list[str]) -> Any:
        """:meth:`Queue.listener` for asyncio code: a waiter woken when work is enqueued on
        ``queues``, whose ``wait(timeout)`` and ``close()`` are awaited (PostgreSQL LISTEN/NOTIFY
        on the event loop; on SQLite it only sleeps, so workers poll)."""
        for name in queues:
            checks.check_name("queue", name)
        return await self.sync.store.alistener(set(queues))

    async def migrate(self) -> list[int]:
        """:meth:`Queue.migrate`, awaited."""
        return await self._arun(engine.schema.migrate(self.settings, self.dialect))

    async def schema_version(self) -> int:
        """:meth:`Queue.schema_version`, awaited."""
        return await self._arun(engine.schema.schema_version(self.settings))

    async def register_worker(self, name: str = "worker", *, token_id: str | None = None,
                              kinds: list[dict[str, Any]] | None = None, heartbeat_seconds: float | None = None,
                              lease_seconds: float | None = None, version: str | None = None,
                              compatible_versions: list[str] | None = None) -> Worker:
        """:meth:`Queue.register_worker`, awaited."""
        return await self._arun(engine.operator.register_worker(
            self.settings, name, token_id=token_id, kinds=kinds, heartbeat_seconds=heartbeat_seconds,
            lease_seconds=lease_seconds, version=version, compatible_versions=compatible_versions))

    async def heartbeat_worker(self, worker: Worker | str) -> None:
        """:meth:`Queue.heartbeat_worker`, awaited."""
        await self._arun(engine.operator.heartbeat_worker(self.settings, worker))

    async def stop_worker(self, worker: Worker | str, reason: str = "stopped") -> None:
        """:meth:`Queue.stop_worker`, awaited."""
        await self._arun(engine.operator.stop_worker(self.settings, worker, reason))

    async def revoke_worker(self, worker: Worker | str, *, by: str | None = None,
                            via: str | None = None) -> dict[str, Any]:
        """:meth:`Queue.revoke_worker`, awaited."""
        return await self._arun(engine.operator.revoke_worker(self.settings, worker, by=by, via=via))

    async def workers(self) -> list[Worker]:
        """:meth:`Queue.workers`, awaited."""
        return await self._arun(engine.reads.workers(self.settings))

    async def kind_declaration(self, kind: str) -> dict[str, Any] | None:
        """:meth:`Queue.kind_declaration`, awaited."""
        return await self._arun(engine.reads.kind_declaration(self.settings, kind))

    @atraced_enqueue
    async def enqueue(self, kind: str, payload: Any = None, *, effect: str = "read_only", queue: str = "default",
                      idempotency_key: str | None = None, priority: int = 0, delay: float = 0,
                      max_attempts: int = 5, lease_seconds: float = checks.DEFAULT_LEASE_SECONDS,
                      actions: Iterable[str] | None = None, timeout: float | None = None,
                      deadline: datetime | timedelta | None = None, approval: str | None = None,
                      approval_deadline: float | None = None, by: str | None = None,
                      trace_context: str | None = None, after: Iterable[int] | None = None,
                      on_dependency_failure: str = "cancel", connection: Any = None,
                      limits: Iterable[str] | None = None, units: int = 1, token_id: str | None = None,
                      resources: Iterable[str] | None = None, singleton_key: str | None = None,
                      on_conflict: str = "skip", debounce: float | None = None, key: str | None = None,
                      debounce_mode: str = "trailing", max_delay: float | None = None,
                      budget: Mapping[str, int] | None = None,
                      fairness_key: str | None = None, fairness_weight: float = 1.0) -> Task:
        """:meth:`Queue.enqueue`, awaited. ``connection``: a ``psycopg.AsyncConnection``
        on PostgreSQL, a ``sqlite3.Connection`` on SQLite."""
        op = engine.enqueue.enqueue(self.settings, kind, payload, effect=effect, queue=queue,
                                    idempotency_key=idempotency_key, priority=priority, delay=delay,
                                    max_attempts=max_attempts, lease_seconds=lease_seconds, actions=actions,
                                    timeout=timeout, deadline=deadline, approval=approval,
                                    approval_deadline=approval_deadline, by=by, trace_context=trace_context,
                                    after=after,
                                    on_dependency_failure=on_dependency_failure, limits=limits, units=units,
                                    token_id=token_id, resources=resources, singleton_key=singleton_key,
                                    on_conflict=on_conflict, debounce=debounce, key=key,
                                    debounce_mode=debounce_mode, max_delay=max_delay, budget=budget,
                                    fairness_key=fairness_key, fairness_weight=fairness_weight)
        return await (self._arun(op) if connection is None else self._arun_in(connection, op))

    async def enqueue_many(self, kind: str, payloads: Iterable[Any], *, effect: str = "read_only",
                           queue: str = "default", idempotency_keys: Sequence[str | None] | None = None,
                           priority: int = 0, delay: float = 0, max_attempts: int = 5,
                           lease_seconds: float = checks.DEFAULT_LEASE_SECONDS,
                           actions: Iterable[str] | None = None, timeout: float | None = None,
                           deadline: datetime | timedelta | None = None, after: Iterable[int] | None = None,
                           on_dependency_failure: str = "cancel", connection: Any = None,
                           limits: Iterable[str] | None = None, units: int = 1,
                           resources: Iterable[str] | None = None, fairness_key: str | None = None,
                           fairness_weight: float = 1.0, budget: Mapping[str, int] | None = None,
                           trace_context: str | None = None) -> list[int]:
        """:meth:`Queue.enqueue_many`, awaited."""
        op = engine.enqueue.enqueue_many(self.settings, kind, payloads, effect=effect, queue=queue,
                                         idempotency_keys=idempotency_keys, priority=priority, delay=delay,
                                         max_attempts=max_attempts, lease_seconds=lease_seconds, actions=actions,
                                         timeout=timeout, deadline=deadline, after=after,
                                         on_dependency_failure=on_dependency_failure, limits=limits, units=units,
                                         resources=resources, fairness_key=fairness_key,
                                         fairness_weight=fairness_weight, budget=budget,
                                         trace_context=trace_context)
        return await (self._arun(op) if connection is None else self._arun_in(connection, op))

    async def _arun_in(self, connection: Any, op: Op[T]) -> T:
        """Run ``op`` in the application's own open transaction on ``connection``; never commits.

        Awaited on the event loop where the backend has an asyncio driver;
        else (a sqlite3 connection, bound to its thread) run right here: the
        statements are local and short."""
        from .store.joined import CallerStore

        store = self.sync.store
        try:
            joined = (CallerStore(store, atx=store.acaller_tx(connection)) if store.capabilities.native_async
                      else CallerStore(store, tx=store.caller_tx(connection)))
        except BaseException:
            op.close()
            raise
        if joined.capabilities.native_async:
            return await engine.adrive(joined, op)
        return engine.drive(joined, op)

    async def dependency_results(self, task_id: int) -> dict[int, Any]:
        """:meth:`Queue.dependency_results`, awaited."""
        return await self._arun(engine.dependencies.dependency_results(self.settings, task_id))

    @contextlib.asynccontextmanager
    async def joined(self) -> AsyncIterator[tuple[AsyncQueue, Any]]:
        """:meth:`Queue.joined`, awaited: one transaction, and a view of this queue whose
        awaited operations all run in it, committed together when the block ends (rolled
        back together if it raises).

        On PostgreSQL the transaction is an asyncio one on the event loop, and ``tx`` is
        its asyncio transaction (``await tx.rows(query, **params)``). On SQLite, whose
        connections belong to the thread that opened them, it is held by a thread of its
        own, where every operation of the view runs; ``tx`` is that thread's transaction,
        for :meth:`run_in` (``await view.run_in(lambda tx: tx.rows(...))``).
        """
        if self.sync.native_async:
            async with self.sync.ajoined() as (view, atx):
                yield AsyncQueue(view), atx
            return
        async with _held_in_own_thread(self.sync.joined()) as ((view, tx), own):
            yield _ThreadJoined(view, own, tx), tx

    async def run_in(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(tx)`` in the transaction of a :meth:`joined` view on SQLite (on its
        thread); outside one, TypeError."""
        raise TypeError("run_in() is for the view a joined() block yields on SQLite")

    @contextlib.asynccontextmanager
    async def hold_attempt(self, task_id: int, generation: int, *, epoch: int = 0) -> AsyncIterator[None]:
        """:meth:`Queue.hold_attempt`, awaited: :class:`LeaseLost` unless attempt
        ``generation`` of ``task_id`` (lease epoch ``epoch``) holds a live lease; else the task stays
        held (no claim, cancel or expiry routing can take it) while the block runs. Keep the block short."""
        task_id = checks.check_task_id(task_id)
        generation = checks.check_int("generation", generation, minimum=0)
        epoch = checks.check_int("epoch", epoch, minimum=0)
        if not self.sync.native_async:
            async with _held_in_own_thread(self.sync.hold_attempt(task_id, generation, epoch=epoch)):
                yield
            return
        async with self.sync.store.atransaction() as atx:
            if not await atx.rows("attempt_holds_lease", task_id=task_id, generation=generation, epoch=epoch):
                raise LeaseLost(task_id, generation, "the attempt no longer holds its lease")
            yield

    async def wait(self, task_id: int, *, timeout: float | None = None) -> Task:
        """:meth:`Queue.wait`, awaited: LISTEN/NOTIFY on the event loop (PostgreSQL), else a short poll."""
        return await await_task(self.sync, task_id, timeout=timeout)

    async def claim(self, worker: Worker | str, *, queue: str = "default", limit: int = 1,
                    lease_seconds: float | None = None, kinds: Iterable[str] | None = None) -> list[Claim]:
        """:meth:`Queue.claim`, awaited."""
        return await self._arun(engine.leases.claim(self.settings, worker, queue=queue, limit=limit,
                                                    lease_seconds=lease_seconds, kinds=kinds))

    async def heartbeat(self, worker: Worker | str, claim: Claim) -> datetime:
        """:meth:`Queue.heartbeat`, awaited."""
        return await self._arun(engine.leases.heartbeat(self.settings, worker, claim))

    async def renew_leases(self, worker: Worker | str, claims: list[Claim]) -> dict[int, datetime]:
        """:meth:`Queue.renew_leases`, awaited."""
        return await self._arun(engine.leases.renew_leases(self.settings, worker, claims))

    async def complete(self, worker: Worker | str, claim: Claim, result: Any = None) -> None:
        """:meth:`Queue.complete`, awaited."""
        return await self._arun(engine.leases.complete(self.settings, worker, claim, result))

    async def complete_many(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> set[int]:
        """:meth:`Queue.complete_many`, awaited."""
        return await self._arun(engine.leases.complete_many(self.settings, worker, done))

    async def fail(self, worker: Worker | str, claim: Claim, error: str, *, retry: bool = True,
                   block: bool = False, delay: float | None = None) -> Task:
        """:meth:`Queue.fail`, awaited."""
        return await self._arun(engine.leases.fail(self.settings, worker, claim, error, retry=retry, block=block,
                                                   delay=delay))

    async def retry(self, worker: Worker | str, claim: Claim, after: float = 0.0,
                    reason: str = "retry requested") -> Task:
        """:meth:`Queue.retry`, awaited."""
        return await self._arun(engine.leases.retry(self.settings, worker, claim, after, reason))

    async def release(self, worker: Worker | str, claim: Claim, reason: str = "released", *,
                      started: bool = True) -> Task:
        """:meth:`Queue.release`, awaited."""
        return await self._arun(engine.leases.release(self.settings, worker, claim, reason, started=started))

    async def report_loss(self, worker: Worker | str, claim: Claim, reason: str) -> None:
        """:meth:`Queue.report_loss`, awaited."""
        return await self._arun(engine.leases.report_loss(self.settings, worker, claim, reason))

    async def sweep(self) -> int:
        """:meth:`Queue.sweep`, awaited."""
        return await self._arun(engine.expiry.sweep(self.settings))

    async def begin_effect(self, worker: Worker | str, claim: Claim, action: str, key: str | None = None, *,
                           resource: str | None = None, effect: str | None = None,
                           args_digest: str | None = None) -> Effect:
        """:meth:`Queue.begin_effect`, awaited."""
        return await self._arun(engine.effects.begin_effect(self.settings, worker, claim, action, key,
                                                            resource=resource, effect=effect,
                                                            args_digest=args_digest))

    async def finish_effect(self, worker: Worker | str, claim: Claim, effect: Effect, response: Any = None) -> Effect:
        """:meth:`Queue.finish_effect`, awaited."""
        return await self._arun(engine.effects.finish_effect(self.settings, worker, claim, effect, response))

    async def sleep(self, worker: Worker | str, claim: Claim, key: str, *, seconds: float | None = None,
                    until: Any = None) -> dict[str, Any]:
        """:meth:`Queue.sleep`, awaited."""
        return await self._arun(engine.durable.sleep(self.settings, worker, claim, key, seconds=seconds,
                                                     until=until))

    async def wait_signal(self, worker: Worker | str, claim: Claim, key: str, name: str, *,
                          timeout: float | None = None, ask: dict[str, Any] | None = None) -> dict[str, Any]:
        """:meth:`Queue.wait_signal`, awaited."""
        return await self._arun(engine.durable.wait_signal(self.settings, worker, claim, key, name,
                                                           timeout=timeout, ask=ask))

    async def spawn(self, worker: Worker | str, claim: Claim, kind: str, payload: Any = None, *, key: str,
                    queue: str | None = None, effect: str = "read_only", priority: int = 0, max_attempts: int = 5,
                    lease_seconds: float = checks.DEFAULT_LEASE_SECONDS, actions: Iterable[str] | None = None,
                    timeout: float | None = None, limits: Iterable[str] | None = None, units: int = 1,
                    resources: Iterable[str] | None = None) -> Task:
        """:meth:`Queue.spawn`, awaited."""
        return await self._arun(engine.children.spawn(
            self.settings, worker, claim, kind, payload, key=key, queue=queue, effect=effect, priority=priority,
            max_attempts=max_attempts, lease_seconds=lease_seconds, actions=actions, timeout=timeout,
            limits=limits, units=units, resources=resources))

    async def wait_children(self, worker: Worker | str, claim: Claim, key: str,
                            child_ids: Sequence[int], *, timeout: float | None = None) -> dict[str, Any]:
        """:meth:`Queue.wait_children`, awaited."""
        return await self._arun(engine.children.wait_children(self.settings, worker, claim, key, child_ids,
                                                              timeout=timeout))

    async def signal(self, task_id: int, name: str, payload: Any = None, *, by: str | None = None,
                     via: str | None = None) -> dict[str, Any]:
        """:meth:`Queue.signal`, awaited."""
        return await self._arun(engine.durable.signal(self.settings, task_id, name, payload, by=by, via=via))

    async def signals(self, task_id: int) -> list[dict[str, Any]]:
        """:meth:`Queue.signals`, awaited."""
        return await self._arun(engine.durable.signals(self.settings, task_id))

    async def emit(self, worker: Worker | str, claim: Claim, item: Any, *, key: str | None = None) -> dict[str, Any]:
        """:meth:`Queue.emit`, awaited."""
        return await self._arun(engine.streams.emit(self.settings, worker, claim, item, key=key))

    def stream(self, task_id: int, *, after: int = 0, follow: bool = True,
               timeout: float | None = None) -> AsyncIterator[StreamItem]:
        """:meth:`Queue.stream` for asyncio code: ``async for entry in aq.stream(task_id):``,
        following on LISTEN/NOTIFY on the event loop (PostgreSQL), else a short poll."""
        return astream(self.sync, engine.streams.Cursor(task_id, after=after, follow=follow, timeout=timeout))

    async def stream_stats(self, task_id: int) -> dict[str, Any]:
        """:meth:`Queue.stream_stats`, awaited."""
        return await self._arun(engine.streams.stats(self.settings, task_id))

    async def answer(self, task_id: int, answer: Any, *, by: str | None = None,
                     via: str | None = None) -> dict[str, Any]:
        """:meth:`Queue.answer`, awaited."""
        return await self._arun(engine.asks.answer(self.settings, task_id, answer, by=by, via=via))

    async def asks(self, *, queue: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """:meth:`Queue.asks`, awaited."""
        return await self._arun(engine.asks.asks(self.settings, queue=queue, limit=limit))

    async def effects(self, task_id: int) -> list[Effect]:
        """:meth:`Queue.effects`, awaited."""
        return await self._arun(engine.effects.effects(self.settings, task_id))

    @overload
    async def cancel(self, task_id: int, reason: str = ..., *, by: str | None = ..., via: str | None = ...,
                     tree: Literal[False] = ...) -> Task: ...

    @overload
    async def cancel(self, task_id: int, reason: str = ..., *, by: str | None = ..., via: str | None = ...,
                     tree: Literal[True]) -> dict[str, Any]: ...

    async def cancel(self, task_id: int, reason: str = "cancelled", *, by: str | None = None,
                     via: str | None = None, tree: bool = False) -> Task | dict[str, Any]:
        """:meth:`Queue.cancel`, awaited (``tree=True``: the cancel tree's report)."""
        return await self._arun_again(lambda: engine.operator.cancel(self.settings, task_id, reason, by=by,
                                                                          via=via, tree=tree))

    async def reconcile(self, task_id: int, outcome: str, note: str, *, result: Any = None, by: str | None = None,
                        via: str | None = None) -> Task:
        """:meth:`Queue.reconcile`, awaited."""
        return await self._arun_again(lambda: engine.operator.reconcile(self.settings, task_id, outcome, note,
                                                                        result=result, by=by, via=via))

    async def unblock(self, task_id: int, note: str, *, by: str | None = None, via: str | None = None) -> Task:
        """:meth:`Queue.unblock`, awaited."""
        return await self._arun(engine.operator.unblock(self.settings, task_id, note, by=by, via=via))

    async def requeue(self, task_id: int, note: str = "requeued by operator", *, by: str | None = None,
                      via: str | None = None) -> Task:
        """:meth:`Queue.requeue`, awaited."""
        return await self._arun(engine.operator.requeue(self.settings, task_id, note, by=by, via=via))

    async def redrive(self, *, status: str | list[str] = "dead", queue: str | None = None,
                      kind: str | None = None, error: str | None = None, older_than: float | None = None,
                      limit: int = 1000, dry_run: bool = False, note: str = "redriven", by: str | None = None,
                      via: str | None = None) -> dict[str, Any]:
        """:meth:`Queue.redrive`, awaited."""
        return await self._arun(engine.operator.redrive(self.settings, status=status, queue=queue, kind=kind,
                                                        error=error, older_than=older_than, limit=limit,
                                                        dry_run=dry_run, note=note, by=by, via=via))

    async def cancel_where(self, *, status: str | list[str], queue: str | None = None, kind: str | None = None,
                           error: str | None = None, older_than: float | None = None, limit: int = 1000,
                           dry_run: bool = False, reason: str = "cancelled", by: str | None = None,
                           via: str | None = None) -> dict[str, Any]:
        """:meth:`Queue.cancel_where`, awaited."""
        return await self._arun_again(lambda: engine.operator.cancel_where(
            self.settings, status=status, queue=queue, kind=kind, error=error, older_than=older_than, limit=limit,
            dry_run=dry_run, reason=reason, by=by, via=via))

    async def pause(self, queue: str, *, create: bool = False, by: str | None = None,
                    via: str | None = None) -> dict[str, Any]:
        """:meth:`Queue.pause`, awaited (an unknown queue is refused unless ``create``)."""
        return await self._arun(engine.operator.set_paused(self.settings, queue, True, create=create, by=by,
                                                           via=via))

    async def resume(self, queue: str, *, create: bool = False, by: str | None = None,
                     via: str | None = None) -> dict[str, Any]:
        """:meth:`Queue.resume`, awaited (an unknown queue is refused unless ``create``)."""
        return await self._arun(engine.operator.set_paused(self.settings, queue, False, create=create, by=by,
                                                           via=via))

    async def queues(self) -> list[dict[str, Any]]:
        """:meth:`Queue.queues`, awaited."""
        return await self._arun(engine.reads.queues(self.settings))

    async def set_limit(self, key: str, *, max_running: int | None = None, per_second: float | None = None,
                        burst: float | None = None, counts: str = "tasks", per_minute: int | None = None,
                        per_hour: int | None = None, per_day: int | None = None, by: str | None = None,
                        via: str | None = None) -> dict[str, Any]:
        """:meth:`Queue.set_limit`, awaited."""
        return await self._arun(engine.limits.set_limit(self.settings, key, max_running=max_running,
                                                        per_second=per_second, burst=burst, counts=counts,
                                                        per_minute=per_minute, per_hour=per_hour, per_day=per_day,
                                                        by=by, via=via))

    async def delete_limit(self, key: str, *, by: str | None = None, via: str | None = None) -> None:
        """:meth:`Queue.delete_limit`, awaited."""
        return await self._arun(engine.limits.delete_limit(self.settings, key, by=by, via=via))

    async def limits(self, key: str | None = None) -> list[dict[str, Any]]:
        """:meth:`Queue.limits`, awaited."""
        return await self._arun(engine.limits.limits(self.settings, key))

    async def limit_spend(self, key: str | None = None, *, days: int = 7) -> list[dict[str, Any]]:
        """:meth:`Queue.limit_spend`, awaited."""
        return await self._arun(engine.budgets.limit_spend(self.settings, key, days=days))

    async def consume(self, worker: Worker | str, claim: Claim, key: str, limit_key: str,
                      units: int) -> dict[str, Any]:
        """:meth:`Queue.consume`, awaited."""
        return await self._arun(engine.budgets.consume(self.settings, worker, claim, key, limit_key, units))

    async def get(self, task_id: int) -> Task:
        """:meth:`Queue.get`, awaited."""
        return await self._arun(engine.reads.get(self.settings, task_id))

    async def list_tasks(self, *, status: str | None = None, queue: str | None = None, limit: int = 100) -> list[Task]:
        """:meth:`Queue.list_tasks`, awaited."""
        return await self._arun(engine.reads.list_tasks(self.settings, status=status, queue=queue, limit=limit))

    async def events(self, task_id: int) -> list[Event]:
        """:meth:`Queue.events`, awaited."""
        return await self._arun(engine.reads.events(self.settings, task_id))

    async def stats(self) -> list[dict[str, Any]]:
        """:meth:`Queue.stats`, awaited."""
        return await self._arun(engine.reads.stats(self.settings))

    async def database_authority(self) -> str | None:
        """:meth:`Queue.database_authority`, awaited."""
        return await self._arun(engine.reads.database_authority(self.settings))

    async def now(self) -> datetime:
        """:meth:`Queue.now`, awaited."""
        return await self._arun(engine.reads.now(self.settings))

    async def prune(self, older_than_seconds: float, *, payloads_older_than_seconds: float | None = None,
                    evidence_older_than_seconds: float | None = None, batch: int = 1000, by: str | None = None,
                    via: str | None = None, record_empty: bool = True,
                    streams_older_than_seconds: float | None = None) -> dict[str, int]:
        """:meth:`Queue.prune`, awaited."""
        return await self._arun(engine.schema.prune(self.settings, older_than_seconds,
                                                    payloads_older_than_seconds=payloads_older_than_seconds,
                                                    evidence_older_than_seconds=evidence_older_than_seconds,
                                                    batch=batch, by=by, via=via, record_empty=record_empty,
                                                    streams_older_than_seconds=streams_older_than_seconds))

    async def evidence_record(self, task_id: int) -> list[dict[str, Any]]:
        """:meth:`Queue.evidence_record`, awaited."""
        return await self._arun(engine.schema.evidence_record(self.settings, task_id))


    async def approve(self, task_id: int, digest: str, note: str | None = None, *, by: str | None = None,
                      via: str | None = None, worker: Worker | str | None = None,
                      token_id: str | None = None, raise_budget: Mapping[str, int] | None = None) -> Task:
        """:meth:`Queue.approve`, awaited (from an async handler, on behalf of its worker and task)."""
        return await self._arun(engine.approvals.approve(self.settings, task_id, digest, note, by=by, via=via,
                                                         decider=deciding(worker, token_id),
                                                         raise_budget=raise_budget))

    async def deny(self, task_id: int, reason: str, *, by: str | None = None, via: str | None = None,
                   worker: Worker | str | None = None, token_id: str | None = None) -> Task:
        """:meth:`Queue.deny`, awaited."""
        return await self._arun(engine.approvals.deny(self.settings, task_id, reason, by=by, via=via,
                                                      decider=deciding(worker, token_id)))

    async def expire_approvals(self) -> int:
        """:meth:`Queue.expire_approvals`, awaited."""
        return await self._arun(engine.approvals.expire_approvals(self.settings))

    async def approvals(self, *, queue: str | None = None, limit: int = 100) -> list[Approval]:
        """:meth:`Queue.approvals`, awaited."""
        return await self._arun(engine.approvals.approvals(self.settings, queue=queue, limit=limit))

    async def approval(self, task_id: int) -> Approval:
        """:meth:`Queue.approval`, awaited."""
        return await self._arun(engine.approvals.approval(self.settings, task_id))

    async def intend(self, worker: Worker | str, claim: Claim, kind: str, payload: Any = None, *, key: str,
                     queue: str = "default", effect: str = "side_effect", approval: str | None = None,
                     approval_deadline: float | None = None, priority: int = 0, max_attempts: int = 5,
                     lease_seconds: float = checks.DEFAULT_LEASE_SECONDS,
                     actions: Iterable[str] | None = None) -> Task:
        """:meth:`Queue.intend`, awaited."""
        return await self._arun(engine.intents.intend(self.settings, worker, claim, kind, payload, key=key,
                                                      queue=queue, effect=effect, approval=approval,
                                                      approval_deadline=approval_deadline, priority=priority,
                                                      max_attempts=max_attempts, lease_seconds=lease_seconds,
                                                      actions=actions))

    async def list(self, *, status: str | None = None, queue: str | None = None, limit: int = 100) -> list[Task]:
        """Deprecated name of :meth:`list_tasks`."""
        import warnings

        warnings.warn("AsyncQueue.list() is deprecated; use AsyncQueue.list_tasks()", DeprecationWarning,
                      stacklevel=2)
        return await self.list_tasks(status=status, queue=queue, limit=limit)


async def await_task(queue: Queue, task_id: int, *, timeout: float | None = None) -> Task:
    """:meth:`Queue.wait` for asyncio code, on ``queue`` (also the service's long poll)."""
    task_id = checks.check_task_id(task_id)
    timeout = engine.waits.check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    listener = await queue.store.atask_listener(task_id)  # listening before the first look
    try:
        task = await engine.adrive(queue.store, engine.waits.watch(queue.settings, task_id))
        while task.status not in engine.waits.SETTLED:
            left = engine.waits.LONGEST_SLEEP if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise engine.waits.timed_out(task, timeout)
            await listener.wait(min(left, engine.waits.LONGEST_SLEEP))
            task = await engine.adrive(queue.store, engine.reads.get(queue.settings, task_id))
        return task
    finally:
        await listener.close()


async def astream(queue: Queue, cursor: engine.streams.Cursor) -> AsyncIterator[StreamItem]:
    """:meth:`Queue.stream` for asyncio code, on ``queue``, as ``cursor`` says."""
    # listening before the first look: no entry, and no end, slips by
    listener = await queue.store.atask_listener(cursor.task_id, streams=True) if cursor.follow else None
    try:
        page = await engine.adrive(queue.store, cursor.read(queue.settings, first=True))
        while True:
            for item in cursor.take(page):
                yield item
            if cursor.done or cursor.capped:
                return
            pause = cursor.pause()
            if pause is None:
                return
            if pause and listener is not None:
                await listener.wait(pause)
            page = await engine.adrive(queue.store, cursor.read(queue.settings))
    finally:
        if listener is not None:
            await listener.close()


async def connect_async(dsn: str | None = None, **options: Any) -> AsyncQueue:
    """Open a queue for asyncio code; see :func:`leaseq.connect` for ``dsn``."""
    return AsyncQueue(await asyncio.to_thread(connect, dsn, **options))


class _OwnThread:
    """One thread of its own: a sqlite3 connection belongs to the thread that opened it, so
    a transaction held across awaits is entered, used and left on one thread."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leaseq-held")

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


@contextlib.asynccontextmanager
async def _held_in_own_thread(cm: contextlib.AbstractContextManager[T]) -> AsyncIterator[tuple[T, _OwnThread]]:
    """Enter the blocking context manager ``cm`` on a thread of its own, and leave it there."""
    own = _OwnThread()
    try:
        value = await own.call(cm.__enter__)
        try:
            yield value, own
        except BaseException as exc:
            if not await own.call(cm.__exit__, type(exc), exc, exc.__traceback__):
                raise
        else:
            await own.call(cm.__exit__, None, None, None)
    finally:
        own.close()


class _ThreadJoined(AsyncQueue):
    """The view a :meth:`AsyncQueue.joined` block yields on SQLite: every operation runs on
    the thread that holds the block's transaction."""

    def __init__(self, view: Queue, own: _OwnThread, tx: Any):
        super().__init__(view)
        self._own = own
        self._tx = tx

    async def _arun(self, op: Op[T]) -> T:
        return await self._own.call(engine.drive, self.sync.store, op)

    async def run_in(self, fn: Callable[[Any], T]) -> T:
        return await self._own.call(fn, self._tx)
