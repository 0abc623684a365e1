"""Queue: the synchronous driver of the queue's operations.

Each operation is written once, without I/O, in :mod:`leaseq.engine` (where
it validates, which named statements it runs, what it decides); this class
runs them on the backend, blocking. :class:`leaseq.AsyncQueue` drives the
same operations on the event loop, with the same signatures. The lease
guard itself is in SQL (``sql/<dialect>/queries.sql``).
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import engine
from .core import checks
from .core.errors import InvalidInput, LeaseLost
from .core.model import Approval, Claim, Effect, Event, Task, Worker
from .core.retry import DEFAULT_MAX_SNOOZES
from .engine.common import EVIDENCE_LEVELS, ROUTINE_EVENTS, Settings
from .engine.enqueue import ENQUEUE_CHUNK
from .engine.effects import check_actions as _check_actions  # noqa: F401 - leaseq.app imports it
from .engine.enqueue import fresh_keys as _fresh_keys  # noqa: F401
from .engine.leases import ROUTE_BATCH
from .engine.steps import Op, T
from .store import Store, Tx, open_store
from .store.base import WorkListener
from .observability.tracing import traced_enqueue
from .worker.transport import Capabilities

if TYPE_CHECKING:  # pragma: no cover
    from .fencing.tokens import ActionSigner

__all__ = ["ENQUEUE_CHUNK", "EVIDENCE_LEVELS", "ROUTE_BATCH", "ROUTINE_EVENTS", "Queue", "connect"]


class Queue:
    """A leaseq queue on one database. Thread-safe; share one per process.

    Create it with :func:`leaseq.connect`. Worker-side calls (``claim``,
    ``heartbeat``, ``complete``, ``fail``, ``begin_effect``...) are guarded
    by the lease; operator calls (``cancel``, ``reconcile``...) are not.
    """

    def __init__(self, store: Store, *, max_same_error: int = checks.DEFAULT_MAX_SAME_ERROR,
                 signer: ActionSigner | None = None, action_token_ttl: float = 300.0, evidence: str = "full",
                 max_snoozes: int = DEFAULT_MAX_SNOOZES):
        self.store = store
        if evidence not in EVIDENCE_LEVELS:
            raise InvalidInput("evidence", f"must be one of {', '.join(EVIDENCE_LEVELS)} (got {evidence!r})")
        #: what every operation reads: the evidence level ("full": every event
        #: carries its detail; "compact": the routine claimed/completed events
        #: keep only task, type, generation, worker and time), the same-error
        #: limit, the limit of retries on request (max_snoozes), the action-token signer and the backend's
        #: capabilities
        self.settings = Settings(
            backend=store.capabilities, evidence=evidence,
            max_same_error=checks.check_int("max_same_error", max_same_error, minimum=1),
            max_snoozes=checks.check_int("max_snoozes", max_snoozes, minimum=0, maximum=1_000_000),
            signer=signer,
            action_token_ttl=checks.check_seconds("action_token_ttl", action_token_ttl, allow_zero=False))
        backend = store.capabilities
        #: what the worker runtime may rely on (see :class:`leaseq.worker.Capabilities`)
        self.capabilities = Capabilities(
            native_async=backend.native_async, batched_completion=True, listen_notify=backend.listen_notify,
            loss_reports=True, serial_writes=backend.serial_writes)

    def _run(self, op: Op[T]) -> T:
        return engine.drive(self.store, op)

    # -- set-up -----------------------------------------------------------

    @property
    def dialect(self) -> str:
        """``"postgres"`` or ``"sqlite"``."""
        return self.store.dialect

    @property
    def evidence(self) -> str:
        """The evidence level: ``"full"`` or ``"compact"``."""
        return self.settings.evidence

    @property
    def max_same_error(self) -> int:
        """Failures in a row with the same error that send a task to ``dead``."""
        return self.settings.max_same_error

    @property
    def max_snoozes(self) -> int:
        """Retries on request (:class:`leaseq.Retry`) a task may make before the next counts as a failure."""
        return self.settings.max_snoozes

    @property
    def signer(self) -> ActionSigner | None:
        """Signs an action token for every effect (None: effects carry no token)."""
        return self.settings.signer

    @property
    def action_token_ttl(self) -> float:
        """Longest life of an action token, in seconds (the lease deadline may end it sooner)."""
        return self.settings.action_token_ttl

    @property
    def native_async(self) -> bool:
        """Whether async operations run on the event loop itself (PostgreSQL)
        rather than in a thread (SQLite)."""
        return self.capabilities.native_async

    async def close_async(self) -> None:
        """Close the connections the async operations opened for the running event loop."""
        await self.store.close_async()

    def close(self) -> None:
        """Close every connection."""
        self.store.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def listener(self, queues: list[str]) -> WorkListener:
        """A blocking waiter woken when work is enqueued on ``queues``
        (PostgreSQL LISTEN/NOTIFY; on SQLite it only sleeps, so workers poll)."""
        for name in queues:
            checks.check_name("queue", name)
        return self.store.listener(set(queues))

    def end_worker_leases(self, tx: Tx, wid: str, reason: str) -> int:
        """End every lease of a just-revoked worker, with a ``lease_revoked`` event each (in ``tx``).
        Returns how many leases ended."""
        return engine.drive_in(tx, engine.leases.end_worker_leases(self.settings, wid, reason))

    @contextlib.contextmanager
    def hold_attempt(self, task_id: int, generation: int) -> Iterator[None]:
        """Hold attempt ``generation`` of ``task_id`` to its live lease while the block runs.

        For a downstream fence on another database
        (:class:`leaseq.fencing.QueueLeaseCheck`): raises :class:`LeaseLost` if
        the attempt is not the running one with a live lease; otherwise keeps
        a transaction open (the row ``FOR SHARE`` on PostgreSQL, the write
        lock on SQLite) so no claim, cancel or expiry routing can take the
        task until the block ends. Keep the block short.
        """
        task_id = checks.check_task_id(task_id)
        generation = checks.check_int("generation", generation, minimum=0)
        with self.store.transaction() as tx:
            if tx.row("attempt_holds_lease", task_id=task_id, generation=generation) is None:
                raise LeaseLost(task_id, generation, "the attempt no longer holds its lease")
            yield

    # -- the worker runtime's awaited calls (Capabilities.native_async) -------

    async def aclaim(self, worker: Worker | str, *, queue: str = "default", limit: int = 1,
                     lease_seconds: float | None = None, kinds: Iterable[str] | None = None) -> list[Claim]:
        """:meth:`claim` for asyncio code: the same operation, awaited on the
        event loop where the backend can (PostgreSQL), else run in a thread."""
        return await engine.adrive(self.store, engine.leases.claim(
            self.settings, worker, queue=queue, limit=limit, lease_seconds=lease_seconds, kinds=kinds))

    async def acomplete_many(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> set[int]:
        """:meth:`complete_many` for asyncio code (awaited on the loop where the backend can)."""
        return await engine.adrive(self.store, engine.leases.complete_many(self.settings, worker, done))

    # -- operations (each one is written in leaseq.engine) ----------------------

    def migrate(self) -> list[int]:
        """Create or upgrade the schema. Idempotent; returns the versions applied now."""
        return self._run(engine.schema.migrate(self.settings, self.dialect))

    def schema_version(self) -> int:
        """The newest migration applied (0 for an empty database)."""
        return self._run(engine.schema.schema_version(self.settings))

    def register_worker(self, name: str = "worker", *, token_id: str | None = None) -> Worker:
        """Issue a new worker identity. The queue picks the id; ``name`` is a label.

        ``token_id`` links the worker to the service credential that registered
        it, so revoking that credential revokes the worker too.
        """
        return self._run(engine.operator.register_worker(self.settings, name, token_id=token_id))

    def revoke_worker(self, worker: Worker | str, *, by: str | None = None,
                      via: str | None = None) -> dict[str, Any]:
        """Revoke a worker: it claims nothing more, and the leases it holds end
        now: every guarded write it sends afterwards is refused, and its tasks
        are routed by the recovery policy at the next claim. Audited (``by``)
        in the same transaction. Returns ``{"worker_id": id, "revoked": True}``."""
        return self._run(engine.operator.revoke_worker(self.settings, worker, by=by, via=via))

    def workers(self) -> list[dict[str, Any]]:
        """Every registered worker with the number of leases it holds."""
        return self._run(engine.reads.workers(self.settings))

    @traced_enqueue
    def enqueue(self, kind: str, payload: Any = None, *, effect: str = "read_only", queue: str = "default",
                idempotency_key: str | None = None, priority: int = 0, delay: float = 0,
                max_attempts: int = 5, lease_seconds: float = checks.DEFAULT_LEASE_SECONDS,
                actions: Iterable[str] | None = None, timeout: float | None = None,
                deadline: datetime | timedelta | None = None, approval: str | None = None,
                approval_deadline: float | None = None, by: str | None = None,
                trace_context: str | None = None, after: Iterable[int] | None = None,
                on_dependency_failure: str = "cancel", connection: Any = None,
                limits: Iterable[str] | None = None, units: int = 1) -> Task:
        """Add a task. A second enqueue with the same ``idempotency_key`` in the
        same queue returns the existing task instead of a duplicate.

        ``actions`` lists the actions the task may begin (:meth:`begin_effect`
        refuses any other); None leaves them undeclared: any action for an
        idempotent or side_effect task, none for a read_only one.

        ``timeout``: seconds one attempt may run; the worker cancels an attempt
        that runs longer and gives its lease up with reason ``timeout`` (the
        recovery policy routes the task). ``deadline``: the latest time the
        task may start, a timezone-aware datetime or a timedelta from now (by
        the database's clock); claims skip it once that has passed, and the
        sweep ends it ``expired`` with a ``deadline_passed`` event.

        ``approval="required"``: the task waits in ``awaiting_approval``,
        holding no lease, until an operator approves it (:meth:`approve`) or
        denies it (:meth:`deny`); ``approval_deadline`` seconds after the
        enqueue, an undecided request is denied (:meth:`expire_approvals`).
        ``by`` names who asks, shown to the approver (default: the OS user).

        ``trace_context`` is a W3C traceparent stored with the task, under
        which the worker starts the task's spans; by default, with
        OpenTelemetry tracing on, that of this enqueue's own span.

        ``after`` lists tasks this one waits for: it is ``waiting`` (not
        claimable, holding nothing) until every one of them is ``completed``,
        then ``queued``. If one ends ``dead``, ``cancelled``, ``denied`` or
        ``expired``, this task is cancelled with that reason (and so are the
        tasks waiting for it), or ``blocked`` with
        ``on_dependency_failure="block"``. An id that does not exist, or names
        a task that already ended without success, is an InvalidInput
        (field ``after``) and nothing is written.

        ``connection``: the application's own open database connection (a
        ``psycopg.Connection`` on PostgreSQL, a ``sqlite3.Connection`` to the
        queue's file on SQLite). The task is written in the caller's
        transaction and exists only if the caller commits (the outbox pattern).

        ``limits`` names the limits the task counts against (see
        :meth:`set_limit`): no claim hands it out while one of them has no
        room. ``units`` is its weight in limits that count units (a token
        budget, say); 1 by default.
        """
        op = engine.enqueue.enqueue(self.settings, kind, payload, effect=effect, queue=queue,
                                    idempotency_key=idempotency_key, priority=priority, delay=delay,
                                    max_attempts=max_attempts, lease_seconds=lease_seconds, actions=actions,
                                    timeout=timeout, deadline=deadline, approval=approval,
                                    approval_deadline=approval_deadline, by=by, trace_context=trace_context,
                                    after=after,
                                    on_dependency_failure=on_dependency_failure, limits=limits, units=units)
        return self._run(op) if connection is None else self._run_in(connection, op)

    def enqueue_many(self, kind: str, payloads: Iterable[Any], *, effect: str = "read_only",
                     queue: str = "default", idempotency_keys: Sequence[str | None] | None = None,
                     priority: int = 0, delay: float = 0, max_attempts: int = 5,
                     lease_seconds: float = checks.DEFAULT_LEASE_SECONDS,
                     actions: Iterable[str] | None = None, timeout: float | None = None,
                     deadline: datetime | timedelta | None = None, after: Iterable[int] | None = None,
                     on_dependency_failure: str = "cancel", connection: Any = None,
                     limits: Iterable[str] | None = None, units: int = 1) -> list[int]:
        """Add many tasks of one ``kind`` at once; returns their ids, in order.

        The options are those of :meth:`enqueue`, shared by every task (with
        ``after``, every task waits for the same tasks; with ``connection``,
        all are written in the caller's transaction).
        ``idempotency_keys`` (one per payload, None for a fresh key) dedupe as
        in :meth:`enqueue`: a key already present gives the existing task's id.
        Rows are written by multi-row statements in one transaction, so
        either every task is added or none is.
        """
        op = engine.enqueue.enqueue_many(self.settings, kind, payloads, effect=effect, queue=queue,
                                         idempotency_keys=idempotency_keys, priority=priority, delay=delay,
                                         max_attempts=max_attempts, lease_seconds=lease_seconds, actions=actions,
                                         timeout=timeout, deadline=deadline, after=after,
                                         on_dependency_failure=on_dependency_failure, limits=limits, units=units)
        return self._run(op) if connection is None else self._run_in(connection, op)

    def _run_in(self, connection: Any, op: Op[T]) -> T:
        """Run ``op`` in the application's own open transaction on ``connection``; never commits."""
        from .store.joined import CallerStore

        try:
            tx = self.store.caller_tx(connection)
        except BaseException:
            op.close()
            raise
        return engine.drive(CallerStore(self.store, tx=tx), op)

    def dependency_results(self, task_id: int) -> dict[int, Any]:
        """The results of the tasks ``task_id`` waits (or waited) for: ``{task id: result}``,
        in id order (None for one that has not completed). A handler reads them
        with ``ctx.results()``."""
        return self._run(engine.dependencies.dependency_results(self.settings, task_id))

    def wait(self, task_id: int, *, timeout: float | None = None) -> Task:
        """Block until the task has ended or is parked for a person, and return it.

        Returns once its status is one of ``completed``, ``dead``,
        ``cancelled``, ``needs_reconciliation``, ``blocked``, ``denied``,
        ``expired``; raises :class:`TimeoutError` after ``timeout`` seconds
        (None: no limit; 0: one look). On PostgreSQL the wait is woken by
        LISTEN/NOTIFY on the task's own channel (a dedicated connection for
        the wait, no polling); on SQLite it looks again every 50 ms.
        """
        task_id = checks.check_task_id(task_id)
        timeout = engine.waits.check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        listener = self.store.task_listener(task_id)  # listening before the first look: no end slips by
        try:
            task = self._run(engine.waits.watch(self.settings, task_id))
            while task.status not in engine.waits.SETTLED:
                left = engine.waits.LONGEST_SLEEP if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise engine.waits.timed_out(task, timeout)
                listener.wait(min(left, engine.waits.LONGEST_SLEEP))
                task = self._run(engine.reads.get(self.settings, task_id))
            return task
        finally:
            listener.close()

    def claim(self, worker: Worker | str, *, queue: str = "default", limit: int = 1,
              lease_seconds: float | None = None, kinds: Iterable[str] | None = None) -> list[Claim]:
        """Lease up to ``limit`` due tasks of ``queue`` to ``worker``.

        Expired leases are routed by the recovery policy first, in the same
        transaction. Each claim carries a new generation (fencing token).
        ``kinds`` limits the claim to tasks of those kinds (the worker runtime
        passes the kinds it has handlers for); None claims any kind.
        Returns an empty list when nothing is due or the queue is paused.
        """
        return self._run(engine.leases.claim(self.settings, worker, queue=queue, limit=limit,
                                             lease_seconds=lease_seconds, kinds=kinds))

    def heartbeat(self, worker: Worker | str, claim: Claim) -> datetime:
        """Renew one lease; returns the new deadline or raises :class:`LeaseLost`."""
        return self._run(engine.leases.heartbeat(self.settings, worker, claim))

    def renew_leases(self, worker: Worker | str, claims: list[Claim]) -> dict[int, datetime]:
        """Renew many leases in one guarded statement.

        Returns ``{task_id: new_deadline}`` for the leases still held; a claim
        missing from the result has been lost.
        """
        return self._run(engine.leases.renew_leases(self.settings, worker, claims))

    def complete(self, worker: Worker | str, claim: Claim, result: Any = None) -> None:
        """Finish the task with ``result``; raises :class:`LeaseLost` without authority.

        A batch of one: the same guarded statement as :meth:`complete_many`."""
        return self._run(engine.leases.complete(self.settings, worker, claim, result))

    def complete_many(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> set[int]:
        """Finish many tasks of one worker in one guarded statement.

        ``done`` holds ``(claim, result)`` pairs. Returns the ids of the tasks
        completed; a task missing from the answer had lost its lease and was
        left untouched, exactly as :meth:`complete` would have refused it.
        """
        return self._run(engine.leases.complete_many(self.settings, worker, done))

    def fail(self, worker: Worker | str, claim: Claim, error: str, *, retry: bool = True,
             block: bool = False, delay: float | None = None) -> Task:
        """End the attempt with ``error``.

        The task is retried after an exponential, jittered backoff (or
        ``delay`` seconds), unless ``retry`` is false, attempts are exhausted or
        the same error repeats ``max_same_error`` times in a row, which send it
        to ``dead``. ``block=True`` marks a missing or revoked credential: the
        task waits in ``blocked`` for :meth:`unblock`. A side-effect task with
        an intent still open goes to ``needs_reconciliation`` instead.
        """
        return self._run(engine.leases.fail(self.settings, worker, claim, error, retry=retry, block=block,
                                            delay=delay))

    def retry(self, worker: Worker | str, claim: Claim, after: float = 0.0, reason: str = "retry requested") -> Task:
        """End the attempt on request: run the task again ``after`` seconds from now (the database's clock).

        Not a failure (what a handler's :class:`leaseq.Retry` sends): the attempt
        is given back, the same-error streak is left alone, and a
        ``retry_requested`` event records ``reason``. Each request counts in
        ``snoozes``; past the queue's ``max_snoozes`` it is recorded as a
        failure instead. A side-effect task with an open intent goes to
        ``needs_reconciliation``. Guarded by the lease: raises
        :class:`LeaseLost` without authority.
        """
        return self._run(engine.leases.retry(self.settings, worker, claim, after, reason))

    def release(self, worker: Worker | str, claim: Claim, reason: str = "released") -> Task:
        """Give a lease back early (worker shutdown).

        The task goes through the recovery policy exactly as if its lease had
        expired: a side-effect task with an open intent is not simply requeued.
        """
        return self._run(engine.leases.release(self.settings, worker, claim, reason))

    def report_loss(self, worker: Worker | str, claim: Claim, reason: str) -> None:
        """Add the worker's own account of losing a lease to the evidence trail.

        Evidence only: the task itself is not touched (the guards already
        refused whatever the worker tried). ``reason`` says how the worker
        found out (heartbeat refused, deadline passed unrenewed, shutdown...).
        One report per generation the worker held; none for a generation it
        ended itself (completed, failed or released): the ``report_loss``
        query enforces both.
        """
        return self._run(engine.leases.report_loss(self.settings, worker, claim, reason))

    def sweep(self) -> int:
        """Route every expired lease now (claims do this too). Returns how many."""
        return self._run(engine.leases.sweep(self.settings))

    def begin_effect(self, worker: Worker | str, claim: Claim, action: str, key: str | None = None, *,
                     resource: str | None = None, effect: str | None = None,
                     args_digest: str | None = None) -> Effect:
        """Record the intent of a tool call before making it, under the lease guard.

        ``key`` (the action's idempotency key) defaults to one derived from the
        task's idempotency key and ``action``, so it is the same on every
        attempt. If an earlier attempt already recorded a response under that
        key, that effect is returned with ``replayed=True``: do not call again.
        Raises :class:`QueuePaused` while the queue's off-switch is on, and
        :class:`InvalidInput` (field ``action``) for an action the task may
        not take: one it did not declare (``actions=``), or any action of a
        read_only task.

        With a signing key the effect carries ``token``, naming the task, the
        generation, the action, the key and ``resource`` when given; it
        expires at the lease deadline (or after ``action_token_ttl``, if
        sooner). Calling again for the same pending effect returns it with a
        token re-issued from the current deadline (the worker does so after
        each renewal); nothing is written then.

        ``effect`` and ``args_digest`` make the entry a tool call (what
        :meth:`leaseq.TaskContext.tool` sends): ``effect`` is the call's own
        class (read_only, idempotent, side_effect; default: the task's), and
        only an open side_effect entry sends an expired or failed attempt to
        reconciliation. A read_only call is no action: any task may make it.
        A replayed tool call writes a ``tool_replayed`` event, and one whose
        recorded action, class or ``args_digest`` differs raises
        :class:`leaseq.ToolCallDiverged`.
        """
        return self._run(engine.effects.begin_effect(self.settings, worker, claim, action, key, resource=resource,
                                                     effect=effect, args_digest=args_digest))

    def finish_effect(self, worker: Worker | str, claim: Claim, effect: Effect, response: Any = None) -> Effect:
        """Record the response of a tool call whose intent :meth:`begin_effect` recorded."""
        return self._run(engine.effects.finish_effect(self.settings, worker, claim, effect, response))

    def effects(self, task_id: int) -> list[Effect]:
        """The action ledger of a task, oldest first."""
        return self._run(engine.effects.effects(self.settings, task_id))

    def cancel(self, task_id: int, reason: str = "cancelled", *, by: str | None = None,
               via: str | None = None) -> Task:
        """Cancel a task. It stays cancelled; a running holder loses its lease at
        its next guarded call, and expiry never revives it."""
        return self._run(engine.operator.cancel(self.settings, task_id, reason, by=by, via=via))

    def reconcile(self, task_id: int, outcome: str, note: str, *, result: Any = None, by: str | None = None,
                  via: str | None = None) -> Task:
        """Resolve a ``needs_reconciliation`` task after checking the outside world.

        ``outcome``: ``completed`` (the action did happen; ``result`` is stored),
        ``requeue`` (it did not; run again with the same keys) or ``cancel``.
        Open intents are marked ``reconciled``.
        """
        return self._run(engine.operator.reconcile(self.settings, task_id, outcome, note, result=result, by=by,
                                                   via=via))

    def unblock(self, task_id: int, note: str, *, by: str | None = None, via: str | None = None) -> Task:
        """Return a ``blocked`` task to the queue once its credential is repaired."""
        return self._run(engine.operator.unblock(self.settings, task_id, note, by=by, via=via))

    def requeue(self, task_id: int, note: str = "requeued by operator", *, by: str | None = None,
                via: str | None = None) -> Task:
        """Return a ``dead`` task to the queue with a fresh attempt budget."""
        return self._run(engine.operator.requeue(self.settings, task_id, note, by=by, via=via))

    def pause(self, queue: str, *, by: str | None = None, via: str | None = None) -> dict[str, Any]:
        """Turn the off-switch on: no claims, and no new effects in running tasks.
        Returns ``{"queue": name, "paused": True}``."""
        return self._run(engine.operator.set_paused(self.settings, queue, True, by=by, via=via))

    def resume(self, queue: str, *, by: str | None = None, via: str | None = None) -> dict[str, Any]:
        """Turn the off-switch off. Returns ``{"queue": name, "paused": False}``."""
        return self._run(engine.operator.set_paused(self.settings, queue, False, by=by, via=via))

    def set_limit(self, key: str, *, max_running: int | None = None, per_second: float | None = None,
                  burst: float | None = None, counts: str = "tasks", by: str | None = None,
                  via: str | None = None) -> dict[str, Any]:
        """Create or change the limit ``key``, shared by every worker.

        ``max_running``: at most this many live leases of tasks naming the
        key at once. ``per_second``: a rate bucket refilled by the database
        clock, holding at most ``burst`` tokens (default: one second's worth,
        at least 1); each claim takes its cost from it. ``counts``: ``"tasks"``
        (each lease costs 1) or ``"units"`` (each costs its task's
        ``units``, e.g. a token budget). A task larger than the limit is
        handed out alone (no other lease of the key, or a full bucket).
        Claims judge limits inside the claim statement, exactly under
        concurrent claims. Audited (``by``). Returns the limit's usage, as
        :meth:`limits` reports it.
        """
        return self._run(engine.limits.set_limit(self.settings, key, max_running=max_running,
                                                 per_second=per_second, burst=burst, counts=counts, by=by, via=via))

    def delete_limit(self, key: str, *, by: str | None = None, via: str | None = None) -> None:
        """Remove the limit ``key``: tasks naming it are no longer limited by it.
        Raises :class:`NotFound` if there is no such limit. Audited (``by``)."""
        return self._run(engine.limits.delete_limit(self.settings, key, by=by, via=via))

    def limits(self, key: str | None = None) -> list[dict[str, Any]]:
        """Every limit (or the one named ``key``) with its usage: ``running`` (what
        live leases hold: leases, or units when it counts units), ``leases``,
        ``available`` (room left under ``max_running``) and ``tokens`` (the
        rate bucket now, by the database clock)."""
        return self._run(engine.limits.limits(self.settings, key))

    def queues(self) -> list[dict[str, Any]]:
        """Queues that have had their off-switch set, with its state."""
        return self._run(engine.reads.queues(self.settings))

    def get(self, task_id: int) -> Task:
        """One task; raises :class:`NotFound`."""
        return self._run(engine.reads.get(self.settings, task_id))

    def list_tasks(self, *, status: str | None = None, queue: str | None = None, limit: int = 100) -> list[Task]:
        """Tasks, newest first, optionally filtered by status and queue (formerly ``list``)."""
        return self._run(engine.reads.list_tasks(self.settings, status=status, queue=queue, limit=limit))

    def events(self, task_id: int) -> list[Event]:
        """The evidence trail of a task, in order."""
        return self._run(engine.reads.events(self.settings, task_id))

    def stats(self) -> list[dict[str, Any]]:
        """Counts by queue and status, with the oldest due task's age and unrouted expired leases."""
        return self._run(engine.reads.stats(self.settings))

    def now(self) -> datetime:
        """The database's clock, the only clock leases are judged by."""
        return self._run(engine.reads.now(self.settings))

    def prune(self, older_than_seconds: float, *, payloads_older_than_seconds: float | None = None,
              batch: int = 1000, by: str | None = None, via: str | None = None,
              record_empty: bool = True) -> dict[str, int]:
        """Retention: delete finished tasks, with their evidence, older than the cut-off.

        Completed and cancelled tasks untouched for ``older_than_seconds`` are
        deleted with their events and effects. ``payloads_older_than_seconds``
        (usually shorter) only blanks the payload and result of finished
        tasks, keeping the row and its evidence trail for incident review.
        Dead, blocked and needs_reconciliation tasks are never pruned: they wait
        for a person. Works in batches of ``batch`` tasks, one transaction each;
        each batch that changed something writes its audit entry (``by``, with
        that batch's counts) in its own transaction. A pass that changed
        nothing is audited too, unless ``record_empty`` is false.
        Returns counts: ``tasks``, ``events``, ``effects``, ``payloads``.
        """
        return self._run(engine.schema.prune(self.settings, older_than_seconds,
                                             payloads_older_than_seconds=payloads_older_than_seconds, batch=batch,
                                             by=by, via=via, record_empty=record_empty))


    # -- approval gates and intents ------------------------------------------------

    def approve(self, task_id: int, digest: str, note: str | None = None, *, by: str | None = None,
                via: str | None = None) -> Task:
        """Approve a task waiting in ``awaiting_approval``: it becomes ``queued``.

        ``digest`` is the task's approval digest as the approver was shown it
        (:attr:`Approval.digest`, :func:`leaseq.approval_digest`); any other is
        refused with :class:`ApprovalMismatch` and nothing is decided. The
        decision, ``by`` (the approver) and ``note`` are recorded in the
        approval request, the evidence trail and the audit log, in one transaction.
        """
        return self._run(engine.approvals.approve(self.settings, task_id, digest, note, by=by, via=via))

    def deny(self, task_id: int, reason: str, *, by: str | None = None, via: str | None = None) -> Task:
        """Deny a task waiting in ``awaiting_approval``: it ends ``denied`` and never runs.
        Recorded like :meth:`approve`, with ``reason``."""
        return self._run(engine.approvals.deny(self.settings, task_id, reason, by=by, via=via))

    def expire_approvals(self) -> int:
        """Deny every approval request whose ``approval_deadline`` passed undecided
        (by ``leaseq:deadline``); returns how many. The service's maintenance
        leader runs it periodically."""
        return self._run(engine.approvals.expire_approvals(self.settings))

    def approvals(self, *, queue: str | None = None, limit: int = 100) -> list[Approval]:
        """The undecided approval requests, oldest first, each with its task."""
        return self._run(engine.approvals.approvals(self.settings, queue=queue, limit=limit))

    def approval(self, task_id: int) -> Approval:
        """One task's approval request and decision (NotFound if it has none)."""
        return self._run(engine.approvals.approval(self.settings, task_id))

    def intend(self, worker: Worker | str, claim: Claim, kind: str, payload: Any = None, *, key: str,
               queue: str = "default", effect: str = "side_effect", approval: str | None = None,
               approval_deadline: float | None = None, priority: int = 0, max_attempts: int = 5,
               lease_seconds: float = checks.DEFAULT_LEASE_SECONDS,
               actions: Iterable[str] | None = None) -> Task:
        """Record, under ``claim``'s lease, the intent ``key`` as a child task of ``kind``
        for an executor (``ctx.intend`` in a handler); returns the child.

        One transaction writes the child (optionally approval-gated) and the
        effect ``intend:<kind>`` of the claimed task with its response: an
        attempt that intends the same ``key`` again gets the same child, never
        a second one. Raises :class:`LeaseLost` without the lease.
        """
        return self._run(engine.intents.intend(self.settings, worker, claim, kind, payload, key=key, queue=queue,
                                               effect=effect, approval=approval,
                                               approval_deadline=approval_deadline, priority=priority,
                                               max_attempts=max_attempts, lease_seconds=lease_seconds,
                                               actions=actions))

    def list(self, *, status: str | None = None, queue: str | None = None, limit: int = 100) -> list[Task]:
        """Deprecated name of :meth:`list_tasks` (it shadowed the builtin inside the class)."""
        warnings.warn("Queue.list() is deprecated; use Queue.list_tasks()", DeprecationWarning, stacklevel=2)
        return self.list_tasks(status=status, queue=queue, limit=limit)

    # -- several operations as one transaction ------------------------------------

    @contextlib.contextmanager
    def joined(self) -> Iterator[tuple[Queue, Tx]]:
        """One transaction, and a view of this queue whose operations all run in it.

        ``with q.joined() as (view, tx):`` whatever runs on ``tx`` and every
        call on ``view`` (the usual operations, guards and queries) commit
        together when the block ends, or roll back together if it raises. The
        service checks a worker's token and serves its request this way: one
        transaction per request. A call refused by a guard (:class:`LeaseLost`)
        wrote nothing, so the block may catch it and go on.
        """
        from .store.joined import JoinedStore

        with self.store.transaction() as tx:
            view = copy.copy(self)
            view.store = JoinedStore(self.store, tx)  # type: ignore[assignment]
            yield view, tx


def connect(dsn: str | None = None, **options: Any) -> Queue:
    """Open a queue. ``dsn``: ``postgresql://…`` or ``sqlite:///path.db``; by
    default ``$LEASEQ_DSN``, else ``sqlite:///leaseq.db`` in the current folder.

    ``signer`` (an :class:`leaseq.fencing.ActionSigner`) makes every effect
    carry a signed action token; by default one is built from
    ``$LEASEQ_ACTION_KEYS`` when that is set. ``evidence="compact"`` keeps the
    routine events' detail out of the trail (see :class:`Queue`). ``max_snoozes``
    (default 100) bounds the retries on request (:class:`leaseq.Retry`) of
    one task; ``max_same_error`` the same error in a row. Other options
    go to the backend (e.g. ``max_size`` of the PostgreSQL pool)."""
    settings = {name: options.pop(name) for name in ("max_same_error", "max_snoozes", "signer", "action_token_ttl",
                                                   "evidence")
                if name in options}
    if "signer" not in settings and os.environ.get("LEASEQ_ACTION_KEYS"):
        # Imported here: the fencing kit pulls in the ASGI stack, which most
        # queue users (and every CLI call) do not need.
        from .fencing.tokens import ActionSigner

        settings["signer"] = ActionSigner.from_env()
    return Queue(open_store(dsn, **options), **settings)
