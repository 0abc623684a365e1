"""Records leaseq hands to callers. Plain frozen dataclasses; no I/O."""

from __future__ import annotations

import enum
from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal


class Status(str, enum.Enum):
    """Where a task is in its lifecycle (never who holds it: see ``lease_owner``)."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    DEAD = "dead"
    NEEDS_RECONCILIATION = "needs_reconciliation"
    BLOCKED = "blocked"
    WAITING = "waiting"  # for the tasks it depends on
    AWAITING_APPROVAL = "awaiting_approval"  # for an operator's decision
    DENIED = "denied"  # an operator refused it
    EXPIRED = "expired"  # its deadline passed before it started

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value


class EffectKind(str, enum.Enum):
    """What a task does to the world, which decides how an expired lease is routed."""

    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    SIDE_EFFECT = "side_effect"

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value


TERMINAL = frozenset({Status.COMPLETED, Status.CANCELLED})


class WorkerState(str, enum.Enum):
    """Whether a worker process is there, judged from its heartbeats (:func:`worker_state`)."""

    ALIVE = "alive"  # a heartbeat within its renewal interval
    LATE = "late"  # its heartbeat is overdue, but for less than a lease length
    LOST = "lost"  # no heartbeat for a lease length: killed, hung or cut off
    STOPPED = "stopped"  # it exited cleanly, and said why (stop_reason)
    REVOKED = "revoked"  # an operator revoked it
    UNKNOWN = "unknown"  # registered without a heartbeat interval (by hand, or before version 17)

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value


@dataclass(frozen=True)
class Worker:
    """A worker identity issued by the queue. ``id`` is never chosen by the worker.

    :meth:`leaseq.Queue.workers` fills the rest: its :class:`WorkerState`
    (``state``), its last heartbeat, when and why it stopped, the leases it
    holds and the kinds it serves."""

    id: str
    name: str
    registered_at: datetime | None = None
    revoked_at: datetime | None = None
    #: alive, late, lost, stopped, revoked or unknown (see :class:`WorkerState`)
    state: str | None = None
    last_heartbeat_at: datetime | None = None
    #: seconds between two heartbeats at most, when alive (its renewal interval)
    heartbeat_seconds: float | None = None
    #: seconds without a heartbeat after which it is lost (its lease length)
    lease_seconds: float | None = None
    stopped_at: datetime | None = None
    stop_reason: str | None = None
    #: how many live leases it holds
    leases: int | None = None
    #: the kinds it serves, as it declared them at registration
    kinds: list[str] | None = None
    #: the version of the code it runs (``App(version=...)``; None: none declared)
    code_version: str | None = None
    #: the versions whose started tasks it claims (None: any)
    compatible_versions: list[str] | None = None


def worker_state(revoked_at: datetime | None, stopped_at: datetime | None, last_heartbeat_at: datetime | None,
                 heartbeat_seconds: float | None, lease_seconds: float | None, now: datetime) -> WorkerState:
    """A worker's state at ``now`` (the database's clock), from its row: the one place the
    rule is written. Computed when read, so a worker killed with SIGKILL shows as lost a
    lease length after its last heartbeat, with no sweep needed."""
    if revoked_at is not None:
        return WorkerState.REVOKED
    if stopped_at is not None:
        return WorkerState.STOPPED
    if last_heartbeat_at is None or heartbeat_seconds is None or lease_seconds is None:
        return WorkerState.UNKNOWN
    silent = (now - last_heartbeat_at).total_seconds()
    if silent <= heartbeat_seconds:
        return WorkerState.ALIVE
    return WorkerState.LATE if silent < lease_seconds else WorkerState.LOST


def worker_from_row(row: dict[str, Any]) -> Worker:
    """A :class:`Worker` from a ``list_workers`` row, its state computed by :func:`worker_state`."""
    state = worker_state(row["revoked_at"], row["stopped_at"], row["last_heartbeat_at"], row["heartbeat_seconds"],
                         row["lease_seconds"], row["now"])
    return Worker(id=row["id"], name=row["name"], registered_at=row["registered_at"], revoked_at=row["revoked_at"],
                  state=state.value, last_heartbeat_at=row["last_heartbeat_at"],
                  heartbeat_seconds=row["heartbeat_seconds"], lease_seconds=row["lease_seconds"],
                  stopped_at=row["stopped_at"], stop_reason=row["stop_reason"], leases=int(row["leases"]),
                  kinds=list(row["kinds"] or []))


@dataclass(frozen=True)
class Task:
    """One row of the task table, as read."""

    id: int
    queue: str
    kind: str
    payload: Any
    effect: str
    status: str
    priority: int
    available_at: datetime
    created_at: datetime
    lease_owner: str | None
    lease_expires_at: datetime | None
    lease_seconds: float
    claim_generation: int
    idempotency_key: str
    attempts: int
    max_attempts: int
    last_error: str | None
    result: Any
    open_effects: int = 0
    claimed_at: datetime | None = None
    heartbeat_count: int = 0
    last_heartbeat_at: datetime | None = None
    longest_heartbeat_gap: float = 0.0
    error_fingerprint: str | None = None
    error_streak: int = 0
    updated_at: datetime | None = None
    #: the actions the task declared it may take (None: undeclared; see Queue.begin_effect)
    actions: list[str] | None = None
    #: the resources the task's effects may name (None: declared none; an effect names none)
    resources: list[str] | None = None
    #: how long one attempt may run, in seconds (None: as long as its lease is renewed)
    timeout_seconds: float | None = None
    #: the latest time the task may start (None: no deadline); past it, it ends ``expired``
    deadline_at: datetime | None = None
    #: how many times a handler asked to run it later (:class:`leaseq.Retry`)
    snoozes: int = 0
    #: the W3C traceparent of the span that enqueued the task (None: the caller was not tracing);
    #: the worker's spans for the task join that trace
    trace_context: str | None = None
    #: the limit keys the task counts against (None: none; see Queue.set_limit)
    limits: list[str] | None = None
    #: the task's weight in limits that count units
    units: int = 1
    #: the task whose handler recorded this one as an intent (``ctx.intend``); None for any other task
    parent_task_id: int | None = None
    #: when that parent was cancelled while this intent had already started (or was parked for a
    #: person): the executor's signal; an intent that had not started is cancelled with its parent
    parent_cancelled_at: datetime | None = None
    #: at most one unfinished task per singleton key in a queue (``enqueue(..., singleton_key=...)``)
    singleton_key: str | None = None
    #: the key whose debounced enqueues collapse into this task (``enqueue(..., debounce=..., key=...)``)
    debounce_key: str | None = None
    #: set only on what an enqueue returns: ``created`` (this enqueue wrote the task),
    #: ``existing`` (its idempotency key named it), ``skipped`` (a singleton enqueue found it
    #: holding the key and wrote nothing) or ``collapsed`` (a debounced enqueue folded into it)
    #: (not compared: the same row read back is the same task)
    enqueue_outcome: str | None = field(default=None, compare=False)
    #: a waiting task's wake time (a durable sleep's end, a signal wait's timeout), by the
    #: database's clock; None: no time (or not in a durable wait)
    wake_at: datetime | None = None
    #: the name of the signal a waiting task waits for (ctx.wait_for_signal); None: none
    wait_signal: str | None = None
    #: what the task may consume, by key, over all its attempts (``enqueue(..., budget=...)``);
    #: a ``ctx.consume`` past it pauses the task for an approval (None: no budget)
    budget: dict[str, int] | None = None
    #: what its attempts consumed (``ctx.consume``), by key (None: nothing yet)
    spent: dict[str, int] | None = None
    #: the task whose handler spawned this one (``ctx.spawn``); None for any other task
    parent_id: int | None = None
    #: the child tasks a waiting task waits for (``ctx.wait_for``); None: none
    wait_children: list[int] | None = None
    #: the version of the code the task started under (``App(version=...)``): its first claim's
    #: worker's; None until it starts, or when that worker declared no version
    code_version: str | None = None
    #: the tenant (or any group) the task is served for: within one priority the claim serves
    #: the keys in weighted round robin (``enqueue(..., fairness_key=...)``); None: no key
    fairness_key: str | None = None
    #: the key's share against other keys' for this task (1 by default); None without a key
    fairness_weight: float | None = None


@dataclass(frozen=True)
class ChildHandle:
    """A child task a handler spawned (``ctx.spawn``): what ``ctx.wait_for`` takes.

    ``id`` is the child's task id, ``key`` its name within the parent (the
    ``key=`` given to ``ctx.spawn``, or one made from its kind and position).
    Awaiting it (``await ctx.spawn(...)``) gives the handle itself, so async
    handlers may write either form.
    """

    id: int
    kind: str
    queue: str
    key: str

    def __await__(self) -> Generator[Any, None, ChildHandle]:
        return self
        yield  # pragma: no cover - makes this a generator: awaiting returns at once


@dataclass(frozen=True)
class AttemptRef:
    """One attempt at a task, as a lease-guarded write names it: the task, the
    acquisition of its lease (``generation``) and the worker that holds it.

    It is all a guarded operation reads: the lease guard in SQL checks the
    three against the row, so an attempt can be named without its
    :class:`Claim` (the service rebuilds one from a request's path and
    body). :attr:`Claim.attempt` is the claim's own.
    """

    task_id: int
    generation: int
    worker_id: str


@dataclass(frozen=True)
class Claim:
    """A lease on one task: who holds it, which acquisition, until when.

    ``generation`` grows with every claim of the task, and every guarded
    write carries it. ``epoch`` names the database history the claim was
    made in (see :attr:`fencing_token`).
    """

    task_id: int
    generation: int
    worker_id: str
    expires_at: datetime
    task: Task
    #: the lease length this claim was given (each renewal extends it by this much)
    lease_seconds: float = 0.0
    #: the lease epoch of the claim: on PostgreSQL it changes whenever the database's history
    #: may have been cut (a standby promoted, a point-in-time restore); 0 on SQLite
    epoch: int = 0

    @property
    def attempt(self) -> AttemptRef:
        """The attempt this claim holds: what a lease-guarded operation names."""
        return AttemptRef(self.task_id, self.generation, self.worker_id)

    @property
    def fencing_token(self) -> str:
        """The attempt's fencing token: ``"<task_id>.<epoch>.<generation>"``, or
        ``"<task_id>.<generation>"`` when the epoch is 0. A fence compares the epoch
        before the generation, so an attempt made before a failover orders below
        every attempt made after it."""
        return format_fencing_token(self.task_id, self.generation, self.epoch)


#: What a lease-guarded operation takes: a :class:`Claim`, or the :class:`AttemptRef` it holds.
Held = Claim | AttemptRef


Outcome = Literal["complete", "fail", "retry", "release"]
#: The ways an attempt may end.
OUTCOMES: tuple[Outcome, ...] = ("complete", "fail", "retry", "release")


@dataclass(frozen=True)
class Ending:
    """One attempt's end: ``outcome`` and its fields (a field of another outcome is refused).

    * ``complete``: ``result`` (JSON);
    * ``fail``: ``error`` (required), ``retry``, ``block``, ``delay`` (None: the queue's
      backoff, computed by the guarded statement from the task's attempts);
    * ``retry``: ``after`` seconds, ``reason`` (required);
    * ``release``: ``reason`` (required), ``started``.
    """

    attempt: Held
    outcome: Outcome
    result: Any = None
    error: str | None = None
    retry: bool = True
    block: bool = False
    delay: float | None = None
    after: float = 0.0
    reason: str | None = None
    started: bool = True


@dataclass(frozen=True)
class Ended:
    """The answer for one :class:`Ending` the guard let through: the task as the attempt
    left it (None for a completion, whose answer is that it completed)."""

    task_id: int
    generation: int
    outcome: Outcome
    task: Task | None


def format_fencing_token(task_id: int, generation: int, epoch: int = 0) -> str:
    """The fencing token of an attempt (see :attr:`Claim.fencing_token`)."""
    return f"{task_id}.{epoch}.{generation}" if epoch else f"{task_id}.{generation}"


class Claims(list):  # type: ignore[type-arg]  # a list of Claim
    """What one claim call took: a list of :class:`Claim`, and a hint.

    ``limit_wait``: when a rate limit's bucket is empty, the seconds until it
    holds a token again (None: no bucket is empty). A worker that came back
    short waits at most that long before it claims again, instead of polling
    blindly.
    """

    limit_wait: float | None = None


@dataclass(frozen=True)
class Effect:
    """An entry in the action ledger: the intent of one tool call and its response."""

    id: int
    task_id: int
    generation: int
    action: str
    idempotency_key: str
    status: str  # pending | done | reconciled
    worker_id: str | None
    intent_at: datetime
    response: Any = None
    response_at: datetime | None = None
    replayed: bool = False
    #: signed action token for downstream services (when the queue holds a signing key)
    token: str | None = None
    #: what this one call does to the world (ctx.tool's ``effect=``; an entry begun
    #: with ctx.effect takes its task's): only an open side_effect entry is ambiguous
    effect: str = "side_effect"
    #: SHA-256 of a tool call's arguments (None: not a tool call), checked on replay
    args_digest: str | None = None
    #: the resource the entry named, one its task declared; its action token is bound to it
    resource: str | None = None

    @property
    def fencing_token(self) -> int:
        """The claim generation the intent was recorded under."""
        return self.generation

    @property
    def downstream_key(self) -> str:
        """The idempotency key a downstream service sees: ``"<task_id>:<idempotency_key>"``.

        Namespaced by the task, so no task can pick a key another task will
        use (and squat it: the other task would be told ``idempotency_key_reused``
        forever). Stable across attempts; the action token carries it.
        """
        return downstream_key(self.task_id, self.idempotency_key)


def downstream_key(task_id: int, idempotency_key: str) -> str:
    """The downstream idempotency key of a ledger key: ``"<task_id>:<idempotency_key>"`` (see Effect)."""
    return f"{task_id}:{idempotency_key}"


@dataclass(frozen=True)
class Approval:
    """The approval request of a task enqueued with ``approval="required"``, and its decision.

    ``digest`` is what the approver is shown and must pass back (see
    :func:`leaseq.approval_digest`); ``decision`` is None while undecided,
    else ``"approved"`` or ``"denied"`` (also by the deadline: ``decided_via``
    ``"deadline"``). ``requested_by`` is the requester as shown to approvers;
    ``requested_worker`` and ``requested_token`` are the identities a decision
    is checked against (the requester may not decide its own request).
    ``task`` is the task as read with it, where the read includes it
    (:meth:`leaseq.Queue.approvals`).
    """

    task_id: int
    digest: str
    requested_by: str
    requested_at: datetime
    deadline_at: datetime | None = None
    decision: str | None = None
    decided_by: str | None = None
    decided_via: str | None = None
    note: str | None = None
    decided_at: datetime | None = None
    task: Task | None = None
    #: the worker that held the recording task's lease, for an intent (None: not asked by a worker)
    requested_worker: str | None = None
    #: the service token that enqueued the task, or whose worker recorded the intent (None: none)
    requested_token: str | None = None
    #: why a person is asked: None for an approval gate, ``"budget"`` for a task whose
    #: ``ctx.consume`` went past its budget (then ``detail`` holds the figures: ``key``,
    #: ``budget``, ``spent``, ``units``); approving it may raise the budget (``raise_budget=``)
    reason: str | None = None
    detail: dict[str, Any] | None = None


@dataclass(frozen=True)
class Event:
    """One entry of a task's evidence trail."""

    id: int
    task_id: int
    type: str
    generation: int | None
    worker_id: str | None
    at: datetime
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamItem:
    """One entry of a task's stream (``ctx.emit``), as :meth:`leaseq.Queue.stream` reads it.

    ``seq`` is its place in the task's stream (1, 2, ...): the cursor to resume
    after (``q.stream(task_id, after=seq)``, SSE's ``Last-Event-ID``).
    ``type`` is ``"item"`` (``item`` holds what the handler emitted) or
    ``"reset"``: attempt ``generation`` begins, and the items of earlier
    attempts that are not ``durable`` are void (that attempt's handler runs
    from the top and emits them again). A durable item (``ctx.emit(item,
    durable=True)``) stands across attempts and is in the stream once.
    """

    task_id: int
    seq: int
    generation: int
    type: str
    item: Any = None
    durable: bool = False
    at: datetime | None = None

    @property
    def reset(self) -> bool:
        """Whether this entry begins an attempt (``type == "reset"``)."""
        return self.type == "reset"
