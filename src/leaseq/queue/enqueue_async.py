"""Adding tasks: one or many, in the queue's own transaction or the caller's (the outbox pattern)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from .. import engine
from ..core import checks
from ..core.model import Task
from ..observability.tracing import atraced_enqueue, atraced_enqueue_many
from .base_async import AsyncQueueBase, replayable


class AsyncEnqueueOps(AsyncQueueBase):
    """The producer side of :class:`leaseq.AsyncQueue`."""

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
        """Add a task. A second enqueue with the same ``idempotency_key`` in the
        same queue returns the existing task instead of a duplicate, if it asks
        for the same kind, payload and options; with any difference it is
        refused with :class:`leaseq.IdempotencyKeyConflict`, which names the
        fields that differ and the existing task, and nothing is written.
        Compared: kind, payload (as JSON values), effect, priority,
        fairness_key and fairness_weight, max_attempts, lease_seconds, actions, resources, timeout, deadline (a timedelta by
        its length), limits, units, ``approval`` and ``approval_deadline``,
        ``after`` and ``on_dependency_failure``, a default alike whether passed
        or not; not ``delay``, ``trace_context`` or ``by``.

        ``actions`` lists the actions the task may begin (:meth:`begin_effect`
        refuses any other); None leaves them undeclared: any action for an
        idempotent or side_effect task, none for a read_only one.

        ``resources`` lists the resource keys the task's effects may name
        (``begin_effect(..., resource=...)``, to which an action token is
        bound); an effect naming any other is refused, and a task that
        declares none may name none. Part of the approval digest.

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
        ``token_id``: the service token that asks (the service passes its
        caller's), recorded as the request's requester: that token may not
        decide it.

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
        ``psycopg.Connection`` on PostgreSQL, a ``psycopg.AsyncConnection`` for the
        awaited call; a ``sqlite3.Connection`` to the queue's file on SQLite). The task is
        written in the caller's transaction and exists only if the caller commits (the
        outbox pattern).

        ``limits`` names the limits the task counts against (see
        :meth:`set_limit`): no claim hands it out while one of them has no
        room. ``units`` is its weight in limits that count units (a token
        budget, say); 1 by default.

        ``singleton_key``: at most one unfinished task per key in the queue.
        When a task holds the key, ``on_conflict`` decides: ``"skip"`` (the
        default) writes nothing and returns that task; ``"cancel_running"``
        cancels it (as :meth:`cancel` does: its lease is cleared, so its
        holder's next guarded write is refused) and enqueues this one;
        ``"queue"`` enqueues this one to wait behind a running one (at most
        one queued and one running; with one already waiting, returns it).
        The claim never runs two tasks of one key at once.

        ``debounce`` (seconds) with ``key``: enqueues of the key inside the
        window collapse into one task. ``debounce_mode="trailing"`` (the
        default): the task runs ``debounce`` seconds after the last enqueue,
        with the last payload, and never later than ``max_delay`` seconds
        after the first; ``"leading"``: the first enqueue runs at once and the
        others within ``debounce`` seconds of it are dropped.

        The returned task's ``enqueue_outcome`` says what happened:
        ``"created"``, ``"existing"`` (the idempotency key named it),
        ``"skipped"`` (a singleton's key was held: this is the holder) or
        ``"collapsed"`` (debounced into this task). See the how-to page
        *Flow control*.

        ``budget`` (``{"tokens": 200_000}``): what the task may consume, by key, over all
        its attempts, as its handler reports it (``ctx.consume(key, units)``). A consume
        that takes it past the budget ends the attempt cleanly and the task waits in
        ``awaiting_approval`` with the figures; :meth:`approve` with ``raise_budget=``
        resumes it, repeating nothing its ledger recorded. Not part of the approval digest
        nor compared with a repeat's (an approval may raise it). See the how-to page
        *Share a provider's quota*, "Budgets settled after the call".

        ``fairness_key``: the tenant (or any group) the task is served for.
        Within one priority, claims serve the keys that have tasks ready in
        weighted round robin, each key's share in proportion to
        ``fairness_weight`` (a positive number, 1 by default), first in first
        out within a key; the tasks without a key share one more key. A queue
        in which no task names a key is claimed as it always was. See the
        how-to page *Flow control*, "Fair share across tenants".
        """
        # iterators read once: the operation may be made again (leaseq.engine.shared)
        actions, after = replayable(actions), replayable(after)
        limits, resources = replayable(limits), replayable(resources)
        make = functools.partial(
            engine.enqueue.enqueue, self.settings, kind, payload, effect=effect, queue=queue,
            idempotency_key=idempotency_key, priority=priority, delay=delay, max_attempts=max_attempts,
            lease_seconds=lease_seconds, actions=actions, timeout=timeout, deadline=deadline, approval=approval,
            approval_deadline=approval_deadline, by=by, trace_context=trace_context, after=after,
            on_dependency_failure=on_dependency_failure, limits=limits, units=units, token_id=token_id,
            resources=resources, singleton_key=singleton_key, on_conflict=on_conflict, debounce=debounce, key=key,
            debounce_mode=debounce_mode, max_delay=max_delay, budget=budget, fairness_key=fairness_key,
            fairness_weight=fairness_weight)
        # awaited, concurrent enqueues of one event loop share a transaction, its commit and its NOTIFY
        return await (self._ashared(make) if connection is None else self._arun_in(connection, make()))

    @atraced_enqueue_many
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
        """Add many tasks of one ``kind`` at once; returns their ids, in order.

        The options are those of :meth:`enqueue`, shared by every task (with
        ``after``, every task waits for the same tasks; with ``connection``,
        all are written in the caller's transaction).
        ``idempotency_keys`` (one per payload, None for a fresh key) dedupe as
        in :meth:`enqueue`: a key already present gives the existing task's id
        if that task is what this call asks for, else
        :class:`leaseq.IdempotencyKeyConflict` and nothing is written; a key
        given twice with different payloads is an InvalidInput.
        ``budget``: each task written gets its own, as :meth:`enqueue` gives one (a task
        its key already names keeps its own); it covers the task and its tree.
        ``trace_context``: a W3C traceparent stored with every task written, as
        :meth:`enqueue` stores one; by default, with OpenTelemetry tracing on, that of
        this call's own span (``leaseq.enqueue_many {kind}``, one for the batch).
        Rows are written by multi-row statements in one transaction, so
        either every task is added or none is.
        """
        op = engine.enqueue.enqueue_many(self.settings, kind, payloads, effect=effect, queue=queue,
                                         idempotency_keys=idempotency_keys, priority=priority, delay=delay,
                                         max_attempts=max_attempts, lease_seconds=lease_seconds, actions=actions,
                                         timeout=timeout, deadline=deadline, after=after,
                                         on_dependency_failure=on_dependency_failure, limits=limits, units=units,
                                         resources=resources, fairness_key=fairness_key,
                                         fairness_weight=fairness_weight, budget=budget,
                                         trace_context=trace_context)
        return await (self._arun(op) if connection is None else self._arun_in(connection, op))
