"""A small reference model of the lease rules, written from the design note, not from the SQL.

The model knows tasks, leases and intents, and says what every operation
must do: whether it is allowed, and what the task looks like after it. It
never reads a clock: a lease is either live or known to have run out (the
test makes a lease run out by claiming it with a tiny lease and waiting on
the database's clock before going on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from leaseq.core.policy import DEFAULT_MAX_SAME_ERROR, error_fingerprint


@dataclass
class MEffect:
    """One intent in the action ledger."""

    generation: int
    status: str = "pending"  # pending | done | reconciled


@dataclass
class MTask:
    """What the model knows of one task."""

    id: int
    effect: str
    max_attempts: int
    key: str
    status: str = "queued"
    generation: int = 0
    attempts: int = 0
    owner: str | None = None
    live: bool = False            # the lease has not run out
    result: Any = None
    fingerprint: str | None = None
    streak: int = 0
    effects: dict[str, MEffect] = field(default_factory=dict)

    @property
    def open_intents(self) -> int:
        return sum(1 for fx in self.effects.values() if fx.status == "pending")


@dataclass(frozen=True)
class MLease:
    """A claim as a worker holds it: which task, which generation, whose."""

    task_id: int
    generation: int
    worker_id: str


class LeaseModel:
    """The rules. Methods return what must happen; callers check the database agrees."""

    def __init__(self) -> None:
        self.tasks: dict[int, MTask] = {}
        self.paused = False
        #: the queue's off-switch has been set (with or without a task): it is a known queue
        self.switched = False

    def may_switch(self, create: bool) -> bool:
        """Pause and resume take a known queue (one that has had a task, or has a switch),
        and any queue with ``create``; a name never seen is refused, as a typo."""
        return create or self.switched or bool(self.tasks)

    def holds(self, lease: MLease) -> bool:
        """The lease guard: running, same holder, same generation, not run out."""
        t = self.tasks[lease.task_id]
        return (t.status == "running" and t.owner == lease.worker_id and t.generation == lease.generation
                and t.live)

    # -- the recovery policy ---------------------------------------------------------

    @staticmethod
    def route(t: MTask) -> None:
        """An ended lease: a side effect with an open intent waits for a person;
        exhausted attempts are dead; everything else is queued again."""
        if t.effect == "side_effect" and t.open_intents > 0:
            t.status = "needs_reconciliation"
        elif t.attempts >= t.max_attempts:
            t.status = "dead"
        else:
            t.status = "queued"
        t.owner, t.live = None, False

    def expired(self) -> list[MTask]:
        return [t for t in self.tasks.values() if t.status == "running" and not t.live]

    def route_expired(self) -> int:
        expired = self.expired()
        for t in expired:
            self.route(t)
        return len(expired)

    def due(self) -> list[MTask]:
        return [t for t in self.tasks.values() if t.status == "queued"]

    # -- worker calls (each only when holds(lease)) -------------------------------------

    def claimed(self, t: MTask, worker_id: str, generation: int) -> None:
        t.status, t.owner, t.live = "running", worker_id, True
        t.generation, t.attempts = generation, t.attempts + 1

    def complete(self, lease: MLease, result: Any) -> None:
        t = self.tasks[lease.task_id]
        t.status, t.result, t.owner, t.live = "completed", result, None, False

    def fail(self, lease: MLease, error: str, *, retry: bool, block: bool) -> None:
        t = self.tasks[lease.task_id]
        fp = error_fingerprint(error)
        t.streak = t.streak + 1 if fp == t.fingerprint else 1
        t.fingerprint = fp
        if t.effect == "side_effect" and t.open_intents > 0:
            t.status = "needs_reconciliation"
        elif block:
            t.status = "blocked"
        elif not retry or t.attempts >= t.max_attempts or t.streak >= DEFAULT_MAX_SAME_ERROR:
            t.status = "dead"
        else:
            t.status = "queued"
        t.owner, t.live = None, False

    def begin_effect(self, lease: MLease, action: str) -> str:
        """``refused`` (a read_only task may begin no action), ``replayed``, ``same`` (this
        attempt's open intent), ``paused`` or ``new``."""
        t = self.tasks[lease.task_id]
        if t.effect == "read_only":
            return "refused"
        key = f"{t.key}:{action}"
        fx = t.effects.get(key)
        if fx is not None and fx.status == "done":
            return "replayed"
        if fx is not None and fx.status == "pending" and fx.generation == lease.generation:
            return "same"
        if self.paused:
            return "paused"
        t.effects[key] = MEffect(lease.generation)  # new, or a later attempt taking the intent over
        return "new"

    def finish_effect(self, lease: MLease, action: str) -> bool:
        """True when the intent is open under this generation (then it is answered)."""
        fx = self.tasks[lease.task_id].effects.get(f"{self.tasks[lease.task_id].key}:{action}")
        if fx is None or fx.status != "pending" or fx.generation != lease.generation:
            return False
        fx.status = "done"
        return True

    # -- operator calls --------------------------------------------------------------------

    def cancel(self, t: MTask) -> bool:
        if t.status in ("completed", "cancelled"):
            return False
        t.status, t.owner, t.live = "cancelled", None, False
        return True

    def reconcile(self, t: MTask, outcome: str, result: Any) -> bool:
        if t.status != "needs_reconciliation":
            return False
        t.status = {"completed": "completed", "requeue": "queued", "cancel": "cancelled"}[outcome]
        if outcome == "completed":
            t.result = result
        for fx in t.effects.values():
            if fx.status == "pending":
                fx.status = "reconciled"
        return True

    def resume(self, t: MTask, from_status: str, *, reset_attempts: bool) -> bool:
        if t.status != from_status:
            return False
        t.status = "queued"
        if reset_attempts:
            t.attempts, t.streak = 0, 0
        return True
