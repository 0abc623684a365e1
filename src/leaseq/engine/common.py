"""What every engine operation shares: the queue's settings, row conversions,
evidence and audit entries, and the checks of a worker and a claim."""

from __future__ import annotations

import getpass
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..core import checks
from ..core.errors import InvalidInput, NotFound, UnknownWorker
from ..core.model import AttemptRef, Claim, Effect, Held, Task, Worker
from ..core.retry import DEFAULT_MAX_SNOOZES
from ..store.base import BackendCapabilities
from .steps import BEGIN, COMMIT, Op, one, rows

if TYPE_CHECKING:  # pragma: no cover
    from ..fencing.tokens import ActionSigner

#: Settings of the evidence trail (see :class:`leaseq.Queue`).
EVIDENCE_LEVELS = ("full", "compact")
#: Events whose detail the compact setting drops: the row itself says it all.
ROUTINE_EVENTS = frozenset({"claimed", "completed"})

_TASK_FIELDS = frozenset(Task.__dataclass_fields__)
#: Fields not every read of a task row carries (a claim's does not): the class's defaults stand in.
_TASK_OPTIONAL = ("singleton_key", "debounce_key", "enqueue_outcome", "parent_id", "wait_children",
                  "code_version", "fairness_key", "fairness_weight")
_TASK_ORDER = tuple(k for k in Task.__dataclass_fields__ if k not in _TASK_OPTIONAL)
_EFFECT_FIELDS = frozenset(Effect.__dataclass_fields__)


@dataclass
class SweepCursor:
    """Where the next pass of the sweep of every queue starts: after ``after``, the last queue
    the previous pass examined (None: at the first queue)."""

    after: str | None = None


@dataclass(frozen=True)
class Settings:
    """A queue's settings, as every operation reads them."""

    backend: BackendCapabilities
    evidence: str = "full"
    max_same_error: int = checks.DEFAULT_MAX_SAME_ERROR
    #: retries on request (leaseq.Retry) a task may make before the next one counts as a failure
    max_snoozes: int = DEFAULT_MAX_SNOOZES
    signer: ActionSigner | None = None
    action_token_ttl: float = 300.0
    #: the queues whose last claim found a fairness key queued: their next claim runs
    #: claim_fair at once (a hint, see :mod:`leaseq.engine.fairness`; never part of equality)
    fair_queues: set[str] = field(default_factory=set, compare=False, hash=False, repr=False)
    #: the queues whose lean claim (claim_plain) answered that they need the full one:
    #: their claims run claim_batch at once (a hint, see :mod:`leaseq.engine.fairness`)
    full_queues: set[str] = field(default_factory=set, compare=False, hash=False, repr=False)
    #: the queues whose last fair claim found one fairness key alone queued (and no task
    #: without a key ready): their claims run claim_fair_one (a hint, as fair_queues)
    fair_one_queues: set[str] = field(default_factory=set, compare=False, hash=False, repr=False)
    #: the queues whose lean one-key claim (claim_fair_one_plain) answered that a task of
    #: theirs names a limit or a singleton key: their one-key claims run claim_fair_one
    limited_queues: set[str] = field(default_factory=set, compare=False, hash=False, repr=False)
    #: where this queue object's next pass of the sweep of every queue starts (see
    #: :func:`leaseq.engine.expiry.sweep`; never part of equality)
    sweep_cursor: SweepCursor = field(default_factory=SweepCursor, compare=False, hash=False, repr=False)

    @property
    def compact(self) -> bool:
        """Whether the routine events keep only their columns (``evidence="compact"``)."""
        return self.evidence == "compact"


def to_task(row: dict[str, Any]) -> Task:
    """A task row as a :class:`Task`."""
    try:  # a whole row (the common case, a claim's hot path): fill the frozen record directly
        values = {k: row[k] for k in _TASK_ORDER}
    except KeyError:  # a partial row: the dataclass supplies the defaults
        return Task(**{k: v for k, v in row.items() if k in _TASK_FIELDS})
    for k in _TASK_OPTIONAL:
        if k in row:
            values[k] = row[k]
    task = object.__new__(Task)
    task.__dict__.update(values)
    return task


def to_effect(row: dict[str, Any], *, replayed: bool = False) -> Effect:
    """An effect row as an :class:`Effect`."""
    return Effect(**{k: v for k, v in row.items() if k in _EFFECT_FIELDS}, replayed=replayed)


def worker_id(worker: Worker | str) -> str:
    """The id of a :class:`Worker` (or the id itself), checked."""
    wid = worker.id if isinstance(worker, Worker) else worker
    if not isinstance(wid, str) or not wid:
        raise InvalidInput("worker", f"must be a Worker from register_worker() (got {worker!r})")
    return wid


def check_claim(wid: str, claim: Held) -> AttemptRef:
    """The attempt a lease-guarded operation of worker ``wid`` names: a :class:`Claim`
    claim() returned, or the :class:`AttemptRef` of one; InvalidInput (field ``claim``)
    otherwise. The lease guard in SQL decides whether it is still held."""
    if isinstance(claim, Claim):
        ref = claim.attempt
    elif isinstance(claim, AttemptRef):
        ref = claim
    else:
        raise InvalidInput("claim", f"must be a Claim returned by claim() (got {type(claim).__name__})")
    for name in ("task_id", "generation"):
        value = getattr(ref, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**63 - 1:
            raise InvalidInput("claim", f"{name} must be an integer from 0 to 2**63-1 (got {value!r})")
    if ref.worker_id != wid:
        raise InvalidInput("claim", f"belongs to worker {ref.worker_id!r}, not {wid!r}")
    return ref


def heartbeats(row: dict[str, Any]) -> dict[str, Any]:
    """The compact heartbeat history of one lease, for the event that ends it."""
    last = row.get("last_heartbeat_at")
    return {
        "heartbeats": row.get("heartbeat_count", 0),
        "last_heartbeat_at": last.isoformat() if isinstance(last, datetime) else last,
        "longest_heartbeat_gap": round(float(row.get("longest_heartbeat_gap") or 0.0), 3),
    }


def event_params(s: Settings, task_id: int, type_: str, generation: int | None, wid: str | None,
                 **detail: Any) -> dict[str, Any]:
    """One evidence entry, as the insert_event(s) queries take it."""
    type_ = str(getattr(type_, "value", type_))
    if s.compact and type_ in ROUTINE_EVENTS:
        detail = {}
    return dict(task_id=task_id, type=type_, generation=generation, worker_id=wid, detail=detail)


def event(s: Settings, task_id: int, type_: str, generation: int | None, wid: str | None, **detail: Any) -> Op[None]:
    """Write one evidence entry in the open transaction."""
    yield rows("insert_event", **event_params(s, task_id, type_, generation, wid, **detail))


def default_actor() -> str:
    """Who acts when an operator action names nobody: the OS user."""
    try:
        return getpass.getuser()
    except Exception:  # pragma: no cover - no user database in some containers
        return "operator"


def actor(by: str | None, via: str | None) -> tuple[str, str | None]:
    """``by`` and ``via`` of an operator action, checked; ``by`` defaults to the OS user."""
    return checks.check_text("by", by) or default_actor(), checks.check_text("via", via)


def acting(by: str | None, via: str | None) -> Op[tuple[str, str | None]]:
    """:func:`actor`, as the database knows the caller (in the open transaction).

    A connection that logs in as a role made by ``leaseq roles create`` acts
    under that role's name: its functions refuse any other ``by`` (see
    :mod:`leaseq.store.functions`). A name the caller gave (the command
    line's OS user, say) is kept in ``via`` as what it is, a claim. The
    administrator's login (the schema's owner, and SQLite, where the file is
    full authority) names itself.
    """
    by, via = actor(by, via)
    row = yield one("caller_kind")
    principal = None if row is None else row["principal"]
    if principal is None or by == principal:
        return by, via
    return principal, checks.check_text("via", f"{via or 'direct'} (as {by})")


def audit(by: str, via: str | None, action: str, target: str, **detail: Any) -> Op[None]:
    """The audit entry of an operator or admin action, in the action's own transaction."""
    if via is not None:
        detail["via"] = via
    yield rows("audit_insert", actor=by, action=action, target=target, detail=detail)


def require_task(task_id: int, *, lock: bool = False) -> Op[dict[str, Any]]:
    """The task row (locked for the transaction with ``lock``); NotFound if there is none."""
    row: dict[str, Any] | None = yield one("lock_task" if lock else "get_task", task_id=task_id)
    if row is None:
        raise NotFound(f"task {task_id} does not exist")
    return row


def check_worker(wid: str, *, lock: bool = False) -> Op[None]:
    """UnknownWorker unless ``wid`` is registered and not revoked."""
    row = yield one("lock_worker" if lock else "get_worker", worker_id=wid)
    if row is None:
        raise UnknownWorker(f"worker {wid!r} was never registered with this queue")
    if row["revoked_at"] is not None:
        raise UnknownWorker(f"worker {wid!r} was revoked")


def worker_token(wid: str) -> Op[str | None]:
    """The id of the token that registered worker ``wid`` (None: none did, or no such worker).

    The one read of that link, inside the caller's transaction: the access checks
    (:mod:`leaseq.access`) and an approval's requester check run it. The link never
    changes once written, so callers may cache what it returns."""
    link = yield one("worker_token", worker_id=wid)
    return link["token_id"] if link is not None else None


def rows_of_task(task_id: int, query: str) -> Op[list[dict[str, Any]]]:
    """The rows ``query`` reads for one task (NotFound if there is no such task)."""
    task_id = checks.check_task_id(task_id)
    yield BEGIN
    yield from require_task(task_id)
    found: list[dict[str, Any]] = yield rows(query, task_id=task_id)
    yield COMMIT
    return found
