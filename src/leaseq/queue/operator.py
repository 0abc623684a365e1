"""Operator actions: what a person (or the service on their behalf) does to tasks, queues and workers.

None is guarded by a lease; each is audited with ``by`` (who) and ``via``
(the channel: CLI, HTTP, dashboard) in the transaction that acts.
"""

from __future__ import annotations

from typing import Any

from .. import engine
from ..core.model import Task, Worker
from .base import QueueBase


class OperatorOps(QueueBase):
    """The operator actions of :class:`leaseq.Queue`."""

    # -- workers ---------------------------------------------------------------

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

    # -- tasks -----------------------------------------------------------------

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

    # -- queues and limits -----------------------------------------------------

    def pause(self, queue: str, *, create: bool = False, by: str | None = None,
              via: str | None = None) -> dict[str, Any]:
        """Turn the off-switch on: no claims, and no new effects in running tasks.
        Returns ``{"queue": name, "paused": True}``.

        A queue that has never had a task (and has no off-switch yet) is
        refused with :class:`leaseq.InvalidInput` (field ``queue``, naming the
        known queues), so a mistyped name does not pause nothing and report
        success; ``create=True`` pauses it anyway, before its first task."""
        return self._run(engine.operator.set_paused(self.settings, queue, True, create=create, by=by, via=via))

    def resume(self, queue: str, *, create: bool = False, by: str | None = None,
               via: str | None = None) -> dict[str, Any]:
        """Turn the off-switch off. Returns ``{"queue": name, "paused": False}``.
        An unknown queue is refused unless ``create``, as by :meth:`pause`."""
        return self._run(engine.operator.set_paused(self.settings, queue, False, create=create, by=by, via=via))

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

    # -- approval gates --------------------------------------------------------

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
