# Generated from reads_async.py by `python -m leaseq.queue.generate`: do not edit.
"""Reads: tasks, their evidence, queues, workers, limits, approvals, the database clock, and waiting for an end.

Nothing here writes (``wait`` only listens and looks again).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from .. import engine
from ..core import checks
from ..core.model import Approval, Event, StreamItem, Task, Worker
from .base import QueueBase


class ReadOps(QueueBase):
    """The reads of :class:`leaseq.Queue`."""

    def get(self, task_id: int) -> Task:
        """One task; raises :class:`NotFound`."""
        return self._run(engine.reads.get(self.settings, task_id))

    def list_tasks(self, *, status: str | None = None, queue: str | None = None, limit: int = 100) -> list[Task]:
        """Tasks, newest first, optionally filtered by status and queue (formerly ``list``)."""
        return self._run(engine.reads.list_tasks(self.settings, status=status, queue=queue, limit=limit))

    def events(self, task_id: int) -> list[Event]:
        """The evidence trail of a task, in order."""
        return self._run(engine.reads.events(self.settings, task_id))

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
        LISTEN/NOTIFY on the task's own channel, no polling: every wait and
        stream of the queue, from any thread or event loop, shares one LISTEN
        connection (see :mod:`leaseq.store.notifier`); on SQLite it looks again
        every 50 ms.
        """
        task_id = checks.check_task_id(task_id)
        timeout = engine.waits.check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        listener = self._task_listener(task_id)  # listening before the first look: no end slips by
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

    def stream(self, task_id: int, *, after: int = 0, follow: bool = True,
               timeout: float | None = None) -> Iterator[StreamItem]:
        """The entries of a task's stream (what its handler emitted with ``ctx.emit``) after the
        cursor ``after`` (an entry's ``seq``; 0: from the start), oldest first.

        ``follow=True`` (the default) follows the stream as ``tail -f`` does: once the
        entries there are read it waits for the next, woken by the emit itself (PostgreSQL
        LISTEN/NOTIFY, on the queue's one LISTEN connection; SQLite looks every 50 ms), until the task
        has ended or is parked for a person (the statuses :meth:`wait` returns on); then the
        entries left are read and the iteration ends. ``timeout``: stop following after that
        many seconds (None: no limit). ``follow=False`` reads the entries there now and ends.

        Each attempt's entries begin with a ``reset`` entry (:class:`StreamItem`): the items
        of earlier attempts that are not ``durable`` are then void. Raises
        :class:`NotFound` (when iterated) for a task that does not exist.
        Awaited, the iteration is an ``async for``: ``async for entry in aq.stream(task_id):``.
        """
        cursor = engine.streams.Cursor(task_id, after=after, follow=follow, timeout=timeout)
        return self._follow(cursor)

    def _follow(self, cursor: engine.streams.Cursor) -> Iterator[StreamItem]:
        # listening before the first look: no entry, and no end, slips by
        listener = self._task_listener(cursor.task_id, streams=True) if cursor.follow else None
        try:
            page = self._run(cursor.read(self.settings, first=True))
            while True:
                for item in cursor.take(page):
                    yield item
                if cursor.done or cursor.capped:
                    return
                pause = cursor.pause()
                if pause is None:
                    return
                if pause and listener is not None:
                    listener.wait(pause)
                page = self._run(cursor.read(self.settings))
        finally:
            if listener is not None:
                listener.close()

    def stream_stats(self, task_id: int) -> dict[str, Any]:
        """What a task's stream holds: ``items`` (entries of type item), ``durable`` (those
        among them that are durable), ``last_seq`` (its last cursor), and ``attempts``: per
        generation that emitted, its ``items``, ``durable``, ``first_seq``, ``last_seq``,
        ``first_at`` and ``last_at``. ``leaseq show`` prints it."""
        return self._run(engine.streams.stats(self.settings, task_id))

    def stats(self) -> list[dict[str, Any]]:
        """Counts by queue and status, with the oldest due task's age and unrouted expired leases."""
        return self._run(engine.reads.stats(self.settings))

    def queues(self) -> list[dict[str, Any]]:
        """Queues that have had their off-switch set, with its state."""
        return self._run(engine.reads.queues(self.settings))

    def workers(self) -> list[Worker]:
        """Every registered worker, oldest first: its state (alive, late, lost, stopped,
        revoked; unknown for one registered without a heartbeat interval), last heartbeat,
        when and why it stopped, the leases it holds and the kinds it serves. The state
        is judged now, by the database's clock, from the last heartbeat."""
        return self._run(engine.reads.workers(self.settings))

    def kind_declaration(self, kind: str) -> dict[str, Any] | None:
        """What the newest registered worker serving ``kind`` declared for it (``queue``, the
        one it claims the kind from; ``effect``, ``actions``, ``signature``, ``worker_id``), or None if no worker
        has served it. See :func:`leaseq.signature.check_payload`."""
        return self._run(engine.reads.kind_declaration(self.settings, kind))

    def limits(self, key: str | None = None) -> list[dict[str, Any]]:
        """Every limit (or the one named ``key``) with its usage: ``running`` (what
        live leases hold: leases, or units when it counts units), ``leases``,
        ``available`` (room left under ``max_running``) and ``tokens`` (the
        rate bucket now, by the database clock); each window's total
        (``per_minute``, ``per_hour``, ``per_day``) and what it holds now
        (``minute_used``, ``hour_used``, ``day_used``); and ``spent_today``, the
        usage settled today by ``ctx.consume`` (the database's UTC day)."""
        return self._run(engine.limits.limits(self.settings, key))

    def asks(self, *, queue: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The questions put to a person (``ctx.ask``) that wait for an answer, oldest first: each
        ``task_id``, ``queue``, ``kind``, ``question``, ``schema`` (JSON schema), ``key`` (the ask's
        ledger key), ``asked_at`` and ``deadline_at`` (None: no deadline). Answer with :meth:`answer`."""
        return self._run(engine.asks.asks(self.settings, queue=queue, limit=limit))

    def limit_spend(self, key: str | None = None, *, days: int = 7) -> list[dict[str, Any]]:
        """Usage settled by ``ctx.consume``, per key and UTC day, newest first, over the
        last ``days`` days (today included): ``{"key", "day": "YYYY-MM-DD", "units",
        "tenants"}``, ``tenants`` the day's units by the tenant of the task that consumed
        them (its ``fairness_key``; ``""`` for the tasks without one). Keys without a
        limit set are listed too."""
        return self._run(engine.budgets.limit_spend(self.settings, key, days=days))

    def approvals(self, *, queue: str | None = None, limit: int = 100) -> list[Approval]:
        """The undecided approval requests, oldest first, each with its task."""
        return self._run(engine.approvals.approvals(self.settings, queue=queue, limit=limit))

    def approval(self, task_id: int) -> Approval:
        """One task's approval request and decision (NotFound if it has none)."""
        return self._run(engine.approvals.approval(self.settings, task_id))

    def database_authority(self) -> str | None:
        """What PostgreSQL lets this connection do: ``"admin"`` (it owns leaseq's schema or
        is a superuser: nothing in the database holds it to its leases), ``"worker"``,
        ``"operator"`` or ``"viewer"`` (a role made by ``leaseq roles create``). None on
        SQLite, where whoever can open the file has full authority."""
        return self._run(engine.reads.database_authority(self.settings))

    def now(self) -> datetime:
        """The database's clock, the only clock leases are judged by."""
        return self._run(engine.reads.now(self.settings))

    def list(self, *, status: str | None = None, queue: str | None = None, limit: int = 100) -> list[Task]:
        """Deprecated name of :meth:`list_tasks` (it shadowed the builtin inside the class)."""
        warnings.warn("Queue.list() is deprecated; use Queue.list_tasks()", DeprecationWarning,
                      stacklevel=2)
        return self.list_tasks(status=status, queue=queue, limit=limit)
