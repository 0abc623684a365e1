# Generated from operator_async.py by `python -m leaseq.queue.generate`: do not edit.
"""Operator actions: what a person (or the service on their behalf) does to tasks, queues and workers.

None is guarded by a lease; each is audited with ``by`` (who) and ``via``
(the channel: CLI, HTTP, dashboard) in the transaction that acts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, overload

from .. import engine
from ..core.model import Task, Worker
from .base import QueueBase
from .decisions import deciding


class OperatorOps(QueueBase):
    """The operator actions of :class:`leaseq.Queue`."""

    # -- workers ---------------------------------------------------------------

    def register_worker(self, name: str = "worker", *, token_id: str | None = None,
                        kinds: list[dict[str, Any]] | None = None, heartbeat_seconds: float | None = None,
                        lease_seconds: float | None = None, version: str | None = None,
                        compatible_versions: list[str] | None = None) -> Worker:
        """Issue a new worker identity. The queue picks the id; ``name`` is a label.

        ``token_id`` links the worker to the service credential that registered
        it, so revoking that credential revokes the worker too. ``kinds``: the
        kinds it serves with their declared options
        (:meth:`leaseq.worker.registry.Registry.declarations`), which the CLI's
        and the service's enqueue check against. ``heartbeat_seconds`` and
        ``lease_seconds`` (both or neither): the worker promises a
        :meth:`heartbeat_worker` at least every ``heartbeat_seconds``, and
        counts as lost after ``lease_seconds`` without one (the runtime does
        this; a worker registered without them has state ``unknown``).
        ``version``: the version of the code it runs (``App(version=...)``), stamped on each
        task it is the first to claim; ``compatible_versions``: the versions whose started
        tasks it claims (default: only its own; its own always among them). A task started
        under another version is left to a worker that serves it; a task not yet started is
        claimable by any worker, and a worker without a version claims any task.
        """
        return self._run(engine.operator.register_worker(self.settings, name, token_id=token_id, kinds=kinds,
                                                         heartbeat_seconds=heartbeat_seconds,
                                                         lease_seconds=lease_seconds, version=version,
                                                         compatible_versions=compatible_versions))

    def heartbeat_worker(self, worker: Worker | str) -> None:
        """Say the worker process is alive (it renews no lease). A stopped worker stays stopped."""
        self._run(engine.operator.heartbeat_worker(self.settings, worker))

    def stop_worker(self, worker: Worker | str, reason: str = "stopped") -> None:
        """Record that the worker exited cleanly, and why: its state becomes ``stopped``.
        Its leases are not touched (a clean shutdown releases them first)."""
        self._run(engine.operator.stop_worker(self.settings, worker, reason))

    def revoke_worker(self, worker: Worker | str, *, by: str | None = None,
                      via: str | None = None) -> dict[str, Any]:
        """Revoke a worker: it claims nothing more, and the leases it holds end
        now: every guarded write it sends afterwards is refused, and its tasks
        are routed by the recovery policy at the next claim. Audited (``by``)
        in the same transaction. Returns ``{"worker_id": id, "revoked": True}``."""
        return self._run(engine.operator.revoke_worker(self.settings, worker, by=by, via=via))

    # -- tasks -----------------------------------------------------------------

    def signal(self, task_id: int, name: str, payload: Any = None, *, by: str | None = None,
               via: str | None = None) -> dict[str, Any]:
        """Send the signal ``name`` (with a JSON ``payload``) to a task: ``ctx.wait_for_signal(name)``
        returns it.

        A signal sent before the handler waits is kept; each is consumed once, by the attempt
        that waits for it. A task waiting for this name is claimable at once. Recorded with the
        sender (``by``: on PostgreSQL role-separated schemas the login role's name; over HTTP the
        token's principal) in the task's evidence trail (``signal_sent``) and the audit log.
        Refused (:class:`InvalidTransition`) for a task that ended. Returns the signal: ``id``,
        ``task_id``, ``name``, ``sent_by``, ``sent_at`` and ``woke`` (a waiting task was woken).
        """
        return self._run(engine.durable.signal(self.settings, task_id, name, payload, by=by, via=via))

    def signals(self, task_id: int) -> list[dict[str, Any]]:
        """A task's signals, oldest first, consumed or not (``consumed_generation``, ``consumed_at``)."""
        return self._run(engine.durable.signals(self.settings, task_id))

    def answer(self, task_id: int, answer: Any, *, by: str | None = None,
               via: str | None = None) -> dict[str, Any]:
        """Answer the question a task asked (``ctx.ask``): its handler's ``ctx.ask`` returns ``answer``.

        The answer is checked against the question's schema first: one that does not fit is
        refused with :class:`InvalidInput` naming the field (``answer.priority``), and nothing
        changes. A task that waits for no answer (none asked, answered already, its deadline
        passed, ended) refuses it with :class:`InvalidTransition`: an answer is taken once.
        The task is claimable at once; the answer is recorded with ``by`` (on PostgreSQL
        role-separated schemas the login role's name; over HTTP the token's principal) in the
        task's evidence trail (``answered``) and the audit log. Returns ``task_id``, ``key``
        (the ask's ledger key), ``question``, ``answered_by``, ``answered_at``, ``signal_id``
        and ``woke``.
        """
        return self._run(engine.asks.answer(self.settings, task_id, answer, by=by, via=via))

    @overload
    def cancel(self, task_id: int, reason: str = ..., *, by: str | None = ..., via: str | None = ...,
               tree: Literal[False] = ...) -> Task: ...

    @overload
    def cancel(self, task_id: int, reason: str = ..., *, by: str | None = ..., via: str | None = ...,
               tree: Literal[True]) -> dict[str, Any]: ...

    def cancel(self, task_id: int, reason: str = "cancelled", *, by: str | None = None,
               via: str | None = None, tree: bool = False) -> Task | dict[str, Any]:
        """Cancel a task. It stays cancelled; a running holder loses its lease at
        its next guarded call, and expiry never revives it. A durable wait it was
        in (a sleep, a signal wait, a wait for children) ends with it.

        The intents the task recorded (``ctx.intend``) that have not started
        (queued, waiting, awaiting approval) are cancelled in the same
        transaction, each with a ``cancelled`` event naming its parent; an
        intent already running is left to its lease, and it (like one parked
        for a person) gets ``parent_cancelled_at`` and a ``parent_cancelled``
        event, which its executor can read. The children it spawned
        (``ctx.spawn``) that have not ended are cancelled too, running or not,
        and so, level by level, are theirs.

        Returns the task; with ``tree=True`` the cancel tree's report instead:
        ``task_id``, ``status``, ``previous_status``, and lists of ``children``
        (each spawned child of the tree, with ``depth``, ``parent_id``,
        ``previous_status``, ``status``), ``intents``, ``effects`` (the open
        entries of the cancelled tasks' ledgers) and ``waits`` (the durable
        waits cancelled), each child, intent and effect with its
        ``disposition``: ``completed`` (done before the cancel), ``unknown``
        (it had started and may have acted: it held a lease, or a side effect
        was begun with no response recorded) or ``not_started``. The report
        is kept in the evidence trail (a ``tree_cancelled`` event) with
        ``tree=True``, and whenever the task had spawned children.
        """
        return self._run_again(lambda: engine.operator.cancel(self.settings, task_id, reason, by=by, via=via,
                                                              tree=tree))

    def reconcile(self, task_id: int, outcome: str, note: str, *, result: Any = None, by: str | None = None,
                  via: str | None = None) -> Task:
        """Resolve a ``needs_reconciliation`` task after checking the outside world.

        ``outcome``: ``completed`` (the action did happen; ``result`` is stored),
        ``requeue`` (it did not; run again with the same keys) or ``cancel``.
        Open intents are marked ``reconciled``. With ``cancel``, the intents the
        task recorded (``ctx.intend``) are cancelled or marked as by :meth:`cancel`.
        """
        return self._run_again(lambda: engine.operator.reconcile(self.settings, task_id, outcome, note,
                                                                 result=result, by=by, via=via))

    def unblock(self, task_id: int, note: str, *, by: str | None = None, via: str | None = None) -> Task:
        """Return a ``blocked`` task to the queue once its credential is repaired."""
        return self._run(engine.operator.unblock(self.settings, task_id, note, by=by, via=via))

    def requeue(self, task_id: int, note: str = "requeued by operator", *, by: str | None = None,
                via: str | None = None) -> Task:
        """Return a ``dead`` task to the queue with a fresh attempt budget."""
        return self._run(engine.operator.requeue(self.settings, task_id, note, by=by, via=via))

    def redrive(self, *, status: str | list[str] = "dead", queue: str | None = None, kind: str | None = None,
                error: str | None = None, older_than: float | None = None, limit: int = 1000,
                dry_run: bool = False, note: str = "redriven", by: str | None = None,
                via: str | None = None) -> dict[str, Any]:
        """Bulk requeue of dead letters: return every task matching the filter to the queue,
        as :meth:`requeue` (``dead``: a fresh attempt budget) or :meth:`unblock`
        (``blocked``) does, each with its ``requeued`` or ``unblocked`` event and audit
        entry, in one transaction, then one ``redrive`` audit entry naming the filter.

        Filter (each given narrows it): ``status`` ("dead", the default, "blocked" or a
        list of both), ``queue``, ``kind``, ``error`` (text in the last error, case
        aside), ``older_than`` (seconds since the task last changed); at most ``limit``
        tasks (oldest first; 1,000 by default, 10,000 at most: run it again for more).
        ``dry_run=True`` counts and lists them and changes nothing. Returns
        ``{"action", "dry_run", "matched", "task_ids" (moved, or matched in a dry run),
        "skipped" (matched but not moved: retention cleared the payload), "more" (the
        limit was reached)}``.
        """
        return self._run(engine.operator.redrive(self.settings, status=status, queue=queue, kind=kind,
                                                 error=error, older_than=older_than, limit=limit,
                                                 dry_run=dry_run, note=note, by=by, via=via))

    def cancel_where(self, *, status: str | list[str], queue: str | None = None, kind: str | None = None,
                     error: str | None = None, older_than: float | None = None, limit: int = 1000,
                     dry_run: bool = False, reason: str = "cancelled", by: str | None = None,
                     via: str | None = None) -> dict[str, Any]:
        """Bulk cancel: cancel every task matching the filter as :meth:`cancel` does (a
        running holder loses its lease; its intents that have not started end with it),
        each with its ``cancelled`` event and audit entry, in one transaction, then one
        ``cancel_where`` audit entry naming the filter. ``status`` is required (one or a
        list of queued, running, waiting, awaiting_approval, blocked,
        needs_reconciliation, dead); the other filters and the answer are
        :meth:`redrive`'s (``skipped``: ended meanwhile by an earlier cancellation's
        cascade).
        """
        return self._run_again(lambda: engine.operator.cancel_where(
            self.settings, status=status, queue=queue, kind=kind, error=error, older_than=older_than, limit=limit,
            dry_run=dry_run, reason=reason, by=by, via=via))

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
                  burst: float | None = None, counts: str = "tasks", per_minute: int | None = None,
                  per_hour: int | None = None, per_day: int | None = None, by: str | None = None,
                  via: str | None = None) -> dict[str, Any]:
        """Create or change the limit ``key``, shared by every worker.

        ``max_running``: at most this many live leases of tasks naming the
        key at once. ``per_second``: a rate bucket refilled by the database
        clock, holding at most ``burst`` tokens (default: one second's worth,
        at least 1); each claim takes its cost from it. ``counts``: ``"tasks"``
        (each lease costs 1) or ``"units"`` (each costs its task's
        ``units``, e.g. a token budget). A task larger than the limit is
        handed out alone (no other lease of the key, or a full bucket).

        ``per_minute``, ``per_hour``, ``per_day``: totals over fixed windows of
        the database's clock (UTC minutes, hours, days). Each claim counts its
        cost in them, and usage settled after the call (``ctx.consume``) counts
        too; no claim hands out a task whose limit has a window already spent,
        so the last task admitted may take it past its total by one task's cost.

        Claims judge limits inside the claim statement, exactly under
        concurrent claims. Audited (``by``). Returns the limit's usage, as
        :meth:`limits` reports it.
        """
        return self._run(engine.limits.set_limit(self.settings, key, max_running=max_running,
                                                 per_second=per_second, burst=burst, counts=counts,
                                                 per_minute=per_minute, per_hour=per_hour, per_day=per_day,
                                                 by=by, via=via))

    def delete_limit(self, key: str, *, by: str | None = None, via: str | None = None) -> None:
        """Remove the limit ``key``: tasks naming it are no longer limited by it.
        Raises :class:`NotFound` if there is no such limit. Audited (``by``)."""
        return self._run(engine.limits.delete_limit(self.settings, key, by=by, via=via))

    # -- approval gates --------------------------------------------------------

    def approve(self, task_id: int, digest: str, note: str | None = None, *, by: str | None = None,
                via: str | None = None, worker: Worker | str | None = None, token_id: str | None = None,
                raise_budget: Mapping[str, int] | None = None) -> Task:
        """Approve a task waiting in ``awaiting_approval``: it becomes ``queued``.

        ``digest`` is the task's approval digest as the approver was shown it
        (:attr:`Approval.digest`, :func:`leaseq.approval_digest`: it covers the
        kind, payload, queue and every option the task runs with); any other is
        refused with :class:`ApprovalMismatch` and nothing is decided. The
        decision, ``by`` (the approver, as displayed) and ``note`` are recorded in
        the approval request, the evidence trail and the audit log, in one transaction.

        The request's requester may not decide it (:class:`AccessDenied`, nothing
        changed): the deciding party is ``worker`` (a decision made on a worker's
        behalf), ``token_id`` (the service token deciding; the service passes
        its caller's) and, when called from a task handler, that handler's
        worker and task. So a worker, or the agent task, that recorded an intent
        cannot approve it, nor can the token that enqueued a gated task.

        After the request's deadline (by the database clock) the decision is
        refused with :class:`ApprovalExpired`; the request is then denied by
        the deadline, as :meth:`expire_approvals` would deny it.

        ``raise_budget`` (``{"tokens": 100_000}``): units added to the task's budget
        (keys it names), for a task paused because a ``ctx.consume`` went past it
        (:attr:`Approval.reason` ``"budget"``, the figures in :attr:`Approval.detail`).
        Approved without a raise, it resumes and pauses again at its next consume.
        """
        return self._run(engine.approvals.approve(self.settings, task_id, digest, note, by=by, via=via,
                                                  decider=deciding(worker, token_id), raise_budget=raise_budget))

    def deny(self, task_id: int, reason: str, *, by: str | None = None, via: str | None = None,
             worker: Worker | str | None = None, token_id: str | None = None) -> Task:
        """Deny a task waiting in ``awaiting_approval``: it ends ``denied`` and never runs.
        Recorded and refused like :meth:`approve`, with ``reason``."""
        return self._run(engine.approvals.deny(self.settings, task_id, reason, by=by, via=via,
                                               decider=deciding(worker, token_id)))

    def expire_approvals(self) -> int:
        """Deny every approval request whose ``approval_deadline`` passed undecided
        (by ``leaseq:deadline``), and every task approved at or after its deadline
        (no claim takes one; only a decision written by hand, or by an older leaseq,
        can be late); returns how many. The service's maintenance leader runs it
        periodically; a decision after the deadline denies its request at once."""
        return self._run(engine.approvals.expire_approvals(self.settings))
