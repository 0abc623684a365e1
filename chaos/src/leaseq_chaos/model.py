"""The lease protocol's transition relation, transcribed from ``model/lease.pml``.

Each transition of the Promela model is here under the same name: a guard
(``can_<t>``, the model's ``CAN_<T>``) and an effect (``do_<t>``). One
:class:`TaskModel` is the state of one task (the model's globals), kept as
the evidence trail replays it. Where the Promela model has one action, one
task and generations below a bound, this has any number of intents, keyed
by their effect id, and any generation; the rules are the same.

:mod:`leaseq_chaos.traces` replays a task's recorded events through it;
``tests/model`` runs this and the Promela model on the same random traces
and requires the same verdicts. A change to one is a change to the other.

Beyond the Promela model (see docs/explanation/model.md): the statuses
around the lease (waiting for dependencies, a deadline passed), retries on
request, and evidence-only events (a worker's report of a loss, a tool call
answered from the ledger, an intent recorded for a child task).
"""

from __future__ import annotations

from dataclasses import dataclass, field

QUEUED = "queued"
RUNNING = "running"
COMPLETED = "completed"
CANCELLED = "cancelled"
DEAD = "dead"
RECON = "needs_reconciliation"
BLOCKED = "blocked"
AWAITING = "awaiting_approval"
DENIED = "denied"
WAITING = "waiting"
EXPIRED = "expired"

IDEMPOTENT = "idempotent"
SIDE_EFFECT = "side_effect"
READ_ONLY = "read_only"

#: reconcile outcomes, as the reconciled event names them
R_COMPLETED, R_REQUEUE, R_CANCEL = "completed", "requeue", "cancel"
_RECONCILED_TO = {R_COMPLETED: COMPLETED, R_REQUEUE: QUEUED, R_CANCEL: CANCELLED}


@dataclass
class TaskModel:
    """One task as the model knows it (the globals of ``lease.pml``)."""

    effect: str = IDEMPOTENT
    status: str = QUEUED
    gen: int = 0
    owner: str | None = None
    #: the lease has not ended (the clock may end it at any moment: see :meth:`do_expire`)
    live: bool = False
    attempts: int = 0
    #: the task's max_attempts; None when unknown (either routing is then allowed)
    max_attempts: int | None = None
    #: open intents: effect id -> (generation, effect class)
    intents: dict[object, tuple[int, str]] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)
    # ghosts (the properties' bookkeeping; no guard reads them)
    unended: int = 0
    completed_by: int = 0
    cancelled_ever: bool = False

    # -- the lease guard and the recovery policy -----------------------------

    def holds(self, w: str, g: int) -> bool:
        """THE LEASE GUARD: running, held by ``w``, under generation ``g``, live by the clock."""
        return self.status == RUNNING and self.owner == w and self.gen == g and self.live

    def recon_due(self) -> bool:
        """An open side-effect intent: the attempt may have acted, and no retry may repeat it."""
        return any(cls == SIDE_EFFECT for _, cls in self.intents.values())

    def route_to(self) -> set[str]:
        """Where an ended attempt sends the task (``ROUTE_TO``): a set, for an unknown max_attempts."""
        if self.recon_due():
            return {RECON}
        if self.max_attempts is None:
            return {DEAD, QUEUED}
        return {DEAD} if self.attempts >= self.max_attempts else {QUEUED}

    def end_lease(self) -> None:
        self.live = False
        self.unended = 0

    # -- transitions ------------------------------------------------------------

    def can_claim(self, w: str) -> bool:
        return self.status == QUEUED and w not in self.revoked

    def do_claim(self, w: str) -> None:
        self.status, self.gen, self.owner, self.live = RUNNING, self.gen + 1, w, True
        self.attempts += 1
        self.unended = self.gen

    def can_renew(self, w: str, g: int) -> bool:
        return self.holds(w, g)

    def can_complete(self, w: str, g: int) -> bool:
        return self.holds(w, g)

    def do_complete(self, w: str, g: int) -> None:
        self.completed_by = g
        self.end_lease()
        self.status, self.owner = COMPLETED, None

    def can_fail(self, w: str, g: int, to: str) -> bool:
        if not self.holds(w, g):
            return False
        if self.recon_due():
            return to == RECON
        if to == QUEUED:
            return self.max_attempts is None or self.attempts < self.max_attempts
        return to in (DEAD, BLOCKED)

    def do_fail(self, w: str, g: int, to: str) -> None:
        self.end_lease()
        self.status, self.owner = to, None

    def can_release(self, w: str, g: int) -> bool:
        return self.holds(w, g)

    def do_release(self, w: str, g: int, to: str) -> None:
        self.end_lease()
        self.status, self.owner = to, None

    def can_suspend(self, w: str, g: int) -> bool:
        """A durable wait (ctx.sleep, ctx.wait_for_signal) ends the attempt like a release."""
        return self.holds(w, g)

    def do_suspend(self, w: str, g: int, to: str) -> None:
        """The lease ends and the attempt is given back: the task waits (or, with a
        side-effect intent open, goes to reconciliation)."""
        self.end_lease()
        self.status, self.owner = to, None
        self.attempts = max(self.attempts - 1, 0)

    def can_wake(self) -> bool:
        """A waiting task's wake time came, or the signal it waits for."""
        return self.status == WAITING

    def do_wake(self) -> None:
        self.status = QUEUED

    def can_begin(self, w: str, g: int) -> bool:
        return self.holds(w, g)

    def do_begin(self, w: str, g: int, effect_id: object = 1, cls: str | None = None) -> None:
        self.intents[effect_id] = (g, cls or self.effect)

    def can_finish(self, w: str, g: int, effect_id: object = 1) -> bool:
        return self.holds(w, g) and self.intents.get(effect_id, (None,))[0] == g

    def do_finish(self, w: str, g: int, effect_id: object = 1) -> None:
        self.intents.pop(effect_id, None)

    def can_expire(self) -> bool:
        return self.status == RUNNING and self.live

    def do_expire(self) -> None:
        self.end_lease()

    def can_route(self) -> bool:
        return self.status == RUNNING and not self.live

    def do_route(self, to: str) -> None:
        self.status, self.owner = to, None

    def can_cancel(self) -> bool:
        return self.status not in (COMPLETED, CANCELLED, DENIED)

    def do_cancel(self) -> None:
        if self.status == RUNNING:
            self.end_lease()
        self.status, self.owner, self.cancelled_ever = CANCELLED, None, True

    def can_revoke(self, w: str) -> bool:
        return w not in self.revoked

    def do_revoke(self, w: str) -> bool:
        """The revocation; True when it ended this task's lease (a ``lease_revoked`` event)."""
        self.revoked.add(w)
        if self.status == RUNNING and self.owner == w:
            self.end_lease()
            return True
        return False

    def can_approve(self) -> bool:
        return self.status == AWAITING

    def do_approve(self) -> None:
        self.status = QUEUED

    def can_deny(self) -> bool:
        return self.status == AWAITING

    def do_deny(self) -> None:
        self.status = DENIED

    def can_reconcile(self) -> bool:
        return self.status == RECON

    def do_reconcile(self, outcome: str) -> None:
        self.intents.clear()
        self.status = _RECONCILED_TO[outcome]
        if outcome == R_CANCEL:
            self.cancelled_ever = True

    def can_requeue(self) -> bool:
        return self.status == DEAD

    def do_requeue(self) -> None:
        self.status, self.attempts = QUEUED, 0

    def can_unblock(self) -> bool:
        return self.status == BLOCKED

    def do_unblock(self) -> None:
        self.status = QUEUED


__all__ = ["TaskModel"]
