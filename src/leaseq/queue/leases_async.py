"""Lease operations: what a worker does with the tasks it holds.

Claim, renew, complete, fail, retry, release (one at a time or many,
``end_attempts``), report a loss, record an
intent; each write is guarded by the lease (task, holder, generation, a live
lease), and a refused one raises :class:`leaseq.LeaseLost`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from .. import engine
from ..core import checks
from ..core.model import AttemptRef, Claim, Ended, Ending, Task, Worker
from .base_async import AsyncQueueBase


class AsyncLeaseOps(AsyncQueueBase):
    """The lease operations of :class:`leaseq.AsyncQueue` (guarded by the lease)."""

    # -- claims and leases -----------------------------------------------------

    async def claim(self, worker: Worker | str, *, queue: str = "default", limit: int = 1,
                    lease_seconds: float | None = None, kinds: Iterable[str] | None = None) -> list[Claim]:
        """Lease up to ``limit`` due tasks of ``queue`` to ``worker``.

        Expired leases are routed by the recovery policy first, in the same
        transaction. Each claim carries a new generation (fencing token).
        ``kinds`` limits the claim to tasks of those kinds (the worker runtime
        passes the kinds it has handlers for); None claims any kind.
        Returns an empty list when nothing is due or the queue is paused.
        """
        return await self._arun(engine.leases.claim(self.settings, worker, queue=queue, limit=limit,
                                                    lease_seconds=lease_seconds, kinds=kinds))

    async def heartbeat(self, worker: Worker | str, claim: Claim) -> datetime:
        """Renew one lease; returns the new deadline or raises :class:`LeaseLost`."""
        return await self._arun(engine.leases.heartbeat(self.settings, worker, claim))

    async def renew_leases(self, worker: Worker | str, claims: list[Claim]) -> dict[int, datetime]:
        """Renew many leases in one guarded statement.

        Returns ``{task_id: new_deadline}`` for the leases still held; a claim
        missing from the result has been lost.
        """
        return await self._arun(engine.leases.renew_leases(self.settings, worker, claims))

    async def complete(self, worker: Worker | str, claim: Claim, result: Any = None) -> None:
        """Finish the task with ``result``; raises :class:`LeaseLost` without authority.

        A batch of one: the same guarded statement as :meth:`complete_many`."""
        return await self._arun(engine.endings.complete(self.settings, worker, claim, result))

    async def complete_many(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> set[int]:
        """Finish many tasks of one worker in one guarded statement.

        ``done`` holds ``(claim, result)`` pairs. Returns the ids of the tasks
        completed; a task missing from the answer had lost its lease and was
        left untouched, exactly as :meth:`complete` would have refused it.
        """
        return await self._arun(engine.leases.complete_many(self.settings, worker, done))

    async def fail(self, worker: Worker | str, claim: Claim, error: str, *, retry: bool = True,
                   block: bool = False, delay: float | None = None) -> Task:
        """End the attempt with ``error``.

        The task is retried after an exponential, jittered backoff (or
        ``delay`` seconds), unless ``retry`` is false, attempts are exhausted or
        the same error repeats ``max_same_error`` times in a row, which send it
        to ``dead``. ``block=True`` marks a missing or revoked credential: the
        task waits in ``blocked`` for :meth:`unblock`. A side-effect task with
        an intent still open goes to ``needs_reconciliation`` instead.
        """
        return await self._arun(engine.endings.fail(self.settings, worker, claim, error, retry=retry, block=block,
                                                   delay=delay))

    async def retry(self, worker: Worker | str, claim: Claim, after: float = 0.0,
                    reason: str = "retry requested") -> Task:
        """End the attempt on request: run the task again ``after`` seconds from now (the database's clock).

        Not a failure (what a handler's :class:`leaseq.Retry` sends): the attempt
        is given back, the same-error streak is left alone, and a
        ``retry_requested`` event records ``reason``. Each request counts in
        ``snoozes``; past the queue's ``max_snoozes`` it is recorded as a
        failure instead. A side-effect task with an open intent goes to
        ``needs_reconciliation``. Guarded by the lease: raises
        :class:`LeaseLost` without authority.
        """
        return await self._arun(engine.endings.retry(self.settings, worker, claim, after, reason))

    async def release(self, worker: Worker | str, claim: Claim, reason: str = "released", *,
                      started: bool = True) -> Task:
        """Give a lease back early (worker shutdown).

        The task goes through the recovery policy exactly as if its lease had
        expired: a side-effect task with an open intent is not simply requeued.
        ``started=False`` says the handler never began (a worker that stopped
        before starting a task it was handed): the attempt the claim counted is
        given back too, so a task on its last attempt is queued again, not
        ended ``dead``, and the ``lease_released`` event records ``started: false``.
        """
        return await self._arun(engine.endings.release(self.settings, worker, claim, reason, started=started))

    async def end_attempts(self, worker: Worker | str,
                           endings: Sequence[Ending]) -> tuple[list[Ended], list[AttemptRef]]:
        """End many attempts, each as its :class:`leaseq.Ending` says (complete,
        fail, retry or release, with that outcome's fields): what ``complete``, ``fail``,
        ``retry`` and ``release`` each do for one.

        Every ending is checked before anything is written (bad input raises
        :class:`leaseq.InvalidInput` naming ``endings.<i>.<field>`` and changes nothing);
        the completions run as one statement, then each other ending in order. Returns
        what ended (:class:`leaseq.Ended`, in order; its ``task`` is the task as
        the attempt left it, None for a completion) and the attempts the lease guard
        refused, which nothing changed for.
        """
        return await self._arun(engine.endings.end_attempts(self.settings, worker, endings))

    async def report_loss(self, worker: Worker | str, claim: Claim, reason: str) -> None:
        """Add the worker's own account of losing a lease to the evidence trail.

        Evidence only: the task itself is not touched (the guards already
        refused whatever the worker tried). ``reason`` says how the worker
        found out (heartbeat refused, deadline passed unrenewed, shutdown...).
        One report per generation the worker held; none for a generation it
        ended itself (completed, failed or released): the ``report_loss``
        query enforces both.
        """
        return await self._arun(engine.leases.report_loss(self.settings, worker, claim, reason))

    async def sweep(self, *, max_queues: int | None = None) -> int:
        """One pass of the sweep of every queue: route every expired lease now (a claim routes
        its own queue's), wake the sleepers whose time has come, expire the tasks past their
        deadline and delete the action tokens an hour past theirs, in each queue with work
        among the next ``max_queues`` (None: 1000, ``leaseq.engine.expiry.SWEEP_MAX_QUEUES``).

        A pass examines at most that many queues, in name order, starting after the last one
        this queue object's previous pass examined: a database with more queues is swept over
        several passes, every queue in turn, each pass bounded in time and transactions. Where
        there are no more queues than that, one pass sweeps them all. Returns how many leases
        were routed; :attr:`sweep_resumes_after` says where the next pass starts.
        """
        return await self._arun_again(lambda: engine.expiry.sweep(self.settings, max_queues))

    @property
    def sweep_resumes_after(self) -> str | None:
        """The queue after which the next :meth:`sweep` pass starts (None: at the first queue,
        the previous pass having reached the last one)."""
        return self.settings.sweep_cursor.after

    async def intend(self, worker: Worker | str, claim: Claim, kind: str, payload: Any = None, *, key: str,
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
        return await self._arun(engine.intents.intend(self.settings, worker, claim, kind, payload, key=key, queue=queue,
                                                      effect=effect, approval=approval,
                                                      approval_deadline=approval_deadline, priority=priority,
                                                      max_attempts=max_attempts, lease_seconds=lease_seconds,
                                                      actions=actions))
