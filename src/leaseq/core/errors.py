"""Every error leaseq raises on purpose, and the one registry of their codes.

Each class is defined here once, with what every transport needs to carry it:

* ``code``: the stable name on the wire (``{"error": {"code", "message", ...}}``)
  and in logs; unique per class (see :data:`ERRORS`);
* ``http_status``: the status the service answers with;
* ``cli_field`` and ``cli_exit_code``: what ``leaseq`` prints
  (``error: <field>: <problem>``) and exits with;
* ``transient``: whether the error says only that the queue is out of reach
  for now, so the same call is worth making again (:func:`is_transient`, the
  one answer to "retry?" for the worker's claims, its start-up and its
  writes); every other error is an answer;
* :meth:`LeaseqError.wire_fields` / :meth:`LeaseqError.from_wire`: the extra
  fields a class sends and how the HTTP client rebuilds the same class from
  them, so :class:`leaseq.client.RemoteQueue` raises what :class:`leaseq.Queue`
  raised; :meth:`LeaseqError.http_headers` for headers a status needs.

The service (``leaseq.service.app``), the HTTP client (``leaseq.client``) and
the CLI (``leaseq.cli.session``) look errors up here; none keeps a table of
its own. :func:`error_class` maps a code back to its class.
"""

from __future__ import annotations

import math
from typing import Any


def install_line(extra: str) -> str:
    """How to install leaseq's ``extra``, in words that work from a package index and from a
    checkout of the leaseq repository (where ``'leaseq[...]'`` would look leaseq up on an index)."""
    return f"pip install 'leaseq[{extra}]' (from a checkout of leaseq: pip install '.[{extra}]')"


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` says only that the queue is out of reach for now, so the call is
    worth making again: a leaseq error whose class is ``transient``, or an operating
    system's network error. A leaseq error of any other class is an answer; any other
    exception is a bug, never a reason to try again."""
    if isinstance(exc, LeaseqError):
        return exc.transient
    return isinstance(exc, OSError)


class LeaseqError(Exception):
    """Base class for every error leaseq raises on purpose."""

    code = "error"
    #: HTTP status of the service's answer. 409 for errors that say "not
    #: in the state you assumed"; classes override it.
    http_status = 409
    #: The field the CLI names when the exception carries no ``field`` of its
    #: own (None: the code is named).
    cli_field: str | None = None
    #: The CLI's exit status: 2 for refused input or state, 1 for trouble
    #: reaching the database.
    cli_exit_code = 2
    #: The queue is out of reach for now (unreachable, restarting, rate
    #: limited): the same call may succeed later. False: an answer, final.
    transient = False

    def wire_fields(self) -> dict[str, Any]:
        """Fields sent beside ``code`` and ``message`` in the JSON error."""
        return {}

    def http_headers(self) -> dict[str, str]:
        """Headers the service adds to the error response."""
        return {}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> LeaseqError:
        """The exception an HTTP client raises for a JSON error of this class's code."""
        return cls(message)


class LeaseLost(LeaseqError):
    """The caller no longer holds the lease it names.

    Raised by every guarded write (heartbeat, complete, fail, release,
    begin/finish effect) when the task is not ``running`` under this worker
    and this claim generation with a live lease. Nothing was changed.
    """

    code = "lease_lost"
    http_status = 409
    cli_field = "lease"

    def __init__(self, task_id: int, generation: int, reason: str = "lease lost"):
        self.task_id = task_id
        self.generation = generation
        self.reason = reason
        super().__init__(f"task {task_id} generation {generation}: {reason}")

    def wire_fields(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "generation": self.generation, "reason": self.reason}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> LeaseLost:
        return cls(fields.get("task_id", 0), fields.get("generation", 0), fields.get("reason", message))


class InvalidInput(LeaseqError, ValueError):
    """A value given to leaseq is not acceptable. ``field`` names it."""

    code = "invalid"
    http_status = 422

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")

    def wire_fields(self) -> dict[str, Any]:
        return {"field": self.field, "problem": self.problem}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> InvalidInput:
        return cls(fields.get("field", "body"), fields.get("problem", message))


class BodyTooLarge(InvalidInput):
    """The request body is larger than the service accepts (an :class:`InvalidInput` of ``body``)."""

    code = "too_large"
    http_status = 413

    def __init__(self, problem: str):
        super().__init__("body", problem)

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> BodyTooLarge:
        return cls(fields.get("problem", message))


class NotFound(LeaseqError, LookupError):
    """The task (or other record) named does not exist."""

    code = "not_found"
    http_status = 404
    cli_field = "task"


class UnknownWorker(LeaseqError):
    """The worker was never registered with this queue, or was revoked."""

    code = "unknown_worker"
    http_status = 409
    cli_field: str | None = "worker"


class InvalidTransition(LeaseqError):
    """The operation does not apply to the task in its current status."""

    code = "invalid_transition"
    http_status = 409
    cli_field = "status"


class QueuePaused(LeaseqError):
    """The queue's off-switch is on: no new actions may start."""

    code = "paused"
    http_status = 409
    cli_field = "queue"


class ConfigError(LeaseqError):
    """The DSN or another setting cannot be used."""

    code = "config"
    http_status = 409


class BackendUnavailable(LeaseqError):
    """The database could not be reached (or dropped the connection): infrastructure trouble, worth a retry."""

    code = "unavailable"
    http_status = 503
    transient = True
    cli_field = "database"
    cli_exit_code = 1


class StaleToken(LeaseqError):
    """A downstream write carried a fencing token older than one already accepted."""

    code = "stale_token"
    http_status = 409
    cli_field = "fencing_token"

    # Set by whoever raises it, where known: the fenced store names the
    # resource and both tokens, the lease check the task and generation.
    resource_key: str | None = None
    token: str | None = None
    newest_token: str | None = None
    task_id: int | None = None
    generation: int | None = None


class Permanent(LeaseqError):
    """Raise from a task handler to fail the attempt with no retry: the task goes to ``dead``."""

    code = "permanent"
    http_status = 409


class CredentialMissing(LeaseqError):
    """Raise from a task handler when a credential is missing or revoked: the task
    goes to ``blocked`` until an operator unblocks it (a new worker would not help)."""

    code = "credential_missing"
    http_status = 409


class AccessDenied(LeaseqError):
    """The credential is valid but its role or scope does not allow the request."""

    code = "forbidden"
    http_status = 403


class Unauthorized(AccessDenied, UnknownWorker):
    """No valid credential: missing, malformed, unknown, forged, expired or revoked.

    It is also an :class:`UnknownWorker`: for a worker, a refused credential
    means the same as being revoked.
    """

    code = "unauthorized"
    http_status = 401
    cli_field = None  # not UnknownWorker's "worker": the CLI names the code

    def __init__(self, message: str, *, token_id: str | None = None):
        super().__init__(message)
        #: The id of the existing token that failed (wrong secret, revoked,
        #: expired); None when no token was presented or its id is unknown.
        self.token_id = token_id

    def http_headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="leaseq"'}


class RateLimited(LeaseqError):
    """Too many requests for this token (or, for failed logins, this address)."""

    code = "rate_limited"
    http_status = 429
    transient = True

    def __init__(self, message: str, retry_after: float = 1.0):
        super().__init__(message)
        self.retry_after = retry_after

    def wire_fields(self) -> dict[str, Any]:
        return {"retry_after": round(self.retry_after, 3)}

    def http_headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> RateLimited:
        return cls(message, float(fields.get("retry_after", 1.0)))


class IdempotencyKeyReused(LeaseqError):
    """An idempotency key already belongs to another resource key, or to another task.

    A key names one logical action of one task on one resource; replaying
    the outcome of a write to ``bound_resource`` as if it were a write to
    ``resource_key`` would hide a caller's bug, and handing task
    ``bound_task``'s stored outcome to another task (or to a caller with no
    fencing token) would hand out a response to someone who never had the
    authority to cause it. The apply is refused and nothing changes.
    """

    code = "idempotency_key_reused"
    http_status = 422

    def __init__(self, idempotency_key: str, bound_resource: str, resource_key: str, *,
                 bound_task: int | None = None, task_id: int | None = None):
        self.idempotency_key = idempotency_key
        self.bound_resource = bound_resource
        self.resource_key = resource_key
        self.bound_task = bound_task
        self.task_id = task_id
        if bound_task is None:
            message = (f"idempotency key {idempotency_key!r} was used for resource {bound_resource!r}; "
                       f"it cannot be reused for resource {resource_key!r}")
        else:
            caller = "a caller without a fencing token" if task_id is None else f"task {task_id}"
            message = (f"idempotency key {idempotency_key!r} belongs to task {bound_task}; its outcome "
                       f"is not replayed to {caller}")
        super().__init__(message)

    def wire_fields(self) -> dict[str, Any]:
        return {"idempotency_key": self.idempotency_key, "bound_resource": self.bound_resource,
                "resource_key": self.resource_key}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> IdempotencyKeyReused:
        exc = cls(str(fields.get("idempotency_key", "")), str(fields.get("bound_resource", "")),
                  str(fields.get("resource_key", "")))
        exc.args = (message,)  # the service's own words
        return exc


class IdempotencyKeyConflict(LeaseqError):
    """An enqueue named an idempotency key that already names a task enqueued with other options.

    The same key in the same queue with the same kind, payload and options
    returns the existing task; any difference is refused, since returning
    that task would hand the caller a task it did not ask for. ``fields``
    names what differs (``kind``, ``payload``, ``effect``, ``priority``, ...),
    ``differences`` says how where it can (values, never the payload) and
    ``task_id`` is the existing task. Nothing is written.
    """

    code = "idempotency_key_conflict"
    http_status = 422
    cli_field = "key"

    def __init__(self, idempotency_key: str, queue: str, task_id: int, differences: dict[str, str]):
        self.idempotency_key = idempotency_key
        self.queue = queue
        self.task_id = task_id
        #: what differs, ``{field: how}`` (``how`` is empty where the values are not shown)
        self.differences = dict(differences)
        #: the fields that differ, in the order of the enqueue's parameters
        self.fields = tuple(self.differences)
        names = list(self.fields)
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        how = "; ".join(text for text in self.differences.values() if text)
        super().__init__(f"idempotency key {idempotency_key!r} is already used by task {task_id} in queue "
                         f"{queue!r}, enqueued with a different {listed}" + (f" ({how})" if how else "")
                         + "; nothing was written: use another key, or repeat the enqueue as it was made")

    def wire_fields(self) -> dict[str, Any]:
        return {"idempotency_key": self.idempotency_key, "queue": self.queue, "task_id": self.task_id,
                "fields": list(self.fields), "differences": self.differences}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> IdempotencyKeyConflict:
        differences = fields.get("differences")
        if not isinstance(differences, dict):
            differences = {str(name): "" for name in fields.get("fields") or ()}
        exc = cls(str(fields.get("idempotency_key", "")), str(fields.get("queue", "")),
                  int(fields.get("task_id", 0)), {str(k): str(v) for k, v in differences.items()})
        exc.args = (message,)  # the service's own words
        return exc


class ApprovalMismatch(LeaseqError):
    """An approval named a digest other than the task's: what the approver was
    shown is not what would run. Nothing was decided.

    ``given`` is the digest the approver passed. The task's own digest (of its
    kind, payload, queue and every option it runs with, see
    :func:`leaseq.approval_digest`) is not said: it would hand whoever guesses
    a digest the right one, and with it a way to test guesses at the payload.
    """

    code = "approval_mismatch"
    http_status = 409
    cli_field = "digest"

    def __init__(self, task_id: int, given: str):
        self.task_id = task_id
        self.given = given
        super().__init__(f"task {task_id}: the digest given is not the task's; look at the task again "
                         "(its payload and digest as shown to a reader of payloads) before deciding")

    def wire_fields(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "given": self.given}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> ApprovalMismatch:
        return cls(int(fields.get("task_id", 0)), str(fields.get("given", "")))


class ApprovalExpired(InvalidTransition):
    """A decision (approve or deny) came after the approval request's deadline, by the
    database clock: refused. The request was denied by the deadline instead
    (``decided_by`` ``leaseq:deadline``, ``decided_via`` ``deadline``), in the
    refused call's transaction, exactly as the deadline job would have denied it:
    the task ends ``denied`` and never runs.

    ``deadline_at`` is the request's deadline (ISO 8601), ``decision`` what was
    refused (``"approve"`` or ``"deny"``).
    """

    code = "approval_expired"
    http_status = 409
    cli_field = "task"

    def __init__(self, task_id: int, deadline_at: Any, decision: str):
        self.task_id = task_id
        self.deadline_at = deadline_at.isoformat() if hasattr(deadline_at, "isoformat") else str(deadline_at)
        self.decision = decision
        super().__init__(f"task {task_id}: its approval deadline ({self.deadline_at}) passed before this "
                         f"{decision}; refused, and the request is denied by the deadline")

    def wire_fields(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "deadline_at": self.deadline_at, "decision": self.decision}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> ApprovalExpired:
        exc = cls(int(fields.get("task_id", 0)), str(fields.get("deadline_at", "")), str(fields.get("decision", "")))
        exc.args = (message,)
        return exc


class InvalidActionToken(AccessDenied):
    """A signed action token was refused. ``reason`` says why, as a short code.

    Reasons: ``missing``, ``malformed``, ``unknown_key``, ``forged``,
    ``expired``, ``wrong_action``, ``wrong_idempotency_key``,
    ``wrong_generation``, ``wrong_task``, ``wrong_resource``,
    ``unbound_resource`` (the middleware requires tokens that name their
    resource); for reference tokens checked online, ``unknown_token`` (no
    such token, or a wrong secret), ``superseded`` and ``lease_ended`` (the
    attempt no longer holds its lease).

    A refinement of :class:`AccessDenied` with no code of its own: it travels
    as ``forbidden`` (403) with its ``reason`` beside it.
    """

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(f"action token refused ({reason}): {message}")

    def wire_fields(self) -> dict[str, Any]:
        return {"reason": self.reason}


class ToolCallDiverged(LeaseqError):
    """A retried handler no longer matches the run its ledger recorded.

    Tool calls (``ctx.tool``), waits, spawns and consumes are ledger entries
    keyed by the task's attempt-stable key and the entry's position (or the
    framework's tool-call id); a tool call's entry holds a digest of the
    arguments it was made with. A retry that reaches a recorded entry asking
    for something else (other arguments, another action, a wait where a call
    was recorded: the handler's code changed) is no longer the recorded run:
    replaying the recorded response, or acting anew, would both be wrong, and
    every retry would diverge again. Nothing of the diverging call is
    written; the attempt ends there, under its lease, and the task goes to
    ``needs_reconciliation`` naming the entry (its ``diverged`` event holds
    what was recorded and what the code asked for), for a person to
    reconcile or requeue. ``idempotency_key`` names the first diverging
    entry; ``recorded`` and ``requested`` say what differs (None when not
    known).
    """

    code = "tool_call_diverged"
    http_status = 409
    cli_field = "tool_call"

    def __init__(self, idempotency_key: str, message: str | None = None, *, recorded: Any = None,
                 requested: Any = None):
        self.idempotency_key = idempotency_key
        self.recorded = recorded
        self.requested = requested
        super().__init__(message or f"tool call {idempotency_key!r} was recorded with other arguments")

    def wire_fields(self) -> dict[str, Any]:
        return {"idempotency_key": self.idempotency_key, "recorded": self.recorded, "requested": self.requested}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> ToolCallDiverged:
        return cls(str(fields.get("idempotency_key", "")), message, recorded=fields.get("recorded"),
                   requested=fields.get("requested"))


class BudgetSpent(LeaseLost):
    """A budget covering the task is spent: the attempt stopped at the ledger step it was
    about to begin (a tool call, a wait, a spawn, an intent), and the task waits for a person.

    Budgets cover the tree (schema 34): a budget on a task covers everything it spawns and
    intends, so a sibling's, a child's or the task's own consumption may take it past. The
    step is not begun; the operation that found it ended the attempt under its lease (the
    task is ``awaiting_approval``, its request's reason ``"budget"`` with the figures) and
    committed that. A handler sees it as its attempt suspended; an approval (``raise_budget=``
    raises the budget that ran out, ``owner``'s) resumes it from its ledger. A refinement of
    :class:`LeaseLost`: the caller's lease is gone.
    """

    code = "budget_spent"
    http_status = 409
    cli_field = "budget"

    def __init__(self, task_id: int, generation: int, figures: dict[str, Any] | None = None,
                 reason: str | None = None):
        self.figures = dict(figures or {})
        key, spent, budget = self.figures.get("key"), self.figures.get("spent"), self.figures.get("budget")
        owner = self.figures.get("owner")
        whose = "its budget" if owner is None else f"the budget of task {owner}"
        super().__init__(task_id, generation, reason or f"{whose} of {key} is spent ({spent} of {budget}): "
                                                        "the task waits for an approval")

    def wire_fields(self) -> dict[str, Any]:
        return {**super().wire_fields(), "figures": self.figures}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> BudgetSpent:
        figures = fields.get("figures")
        return cls(fields.get("task_id", 0), fields.get("generation", 0),
                   figures if isinstance(figures, dict) else None, fields.get("reason", message))


#: Every error class that owns a code, once. A subclass that declares no
#: ``code`` of its own (:class:`InvalidActionToken`) is a refinement that
#: travels as its parent.
class WaitTimedOut(LeaseqError):
    """A handler's ``ctx.wait_for_signal(name, timeout=...)`` met its timeout with no signal.

    Raised in the handler (not given ``default=``); the timeout is recorded in
    the task's ledger, so a retried attempt raises it again at the same place
    instead of waiting anew. Uncaught, it fails the attempt like any error.
    """

    code = "wait_timed_out"
    http_status = 409
    cli_field = "signal"

    def __init__(self, name: str, message: str | None = None):
        self.name = name
        super().__init__(message or f"no signal {name!r} came before the wait's timeout")

    def wire_fields(self) -> dict[str, Any]:
        return {"name": self.name}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> WaitTimedOut:
        return cls(str(fields.get("name", "")), message)


class ChildFailed(LeaseqError):
    """A child task a handler waits for (``ctx.wait_for``, ``ctx.wait_for_all``) ended without
    success: ``status`` is ``dead``, ``cancelled``, ``denied`` or ``expired``, ``error`` its
    last error (None: none recorded).

    Raised in the handler at the wait, where it may be caught. The outcome is
    recorded in the task's ledger, so a retried attempt raises it again at the
    same place. Uncaught, it fails the attempt like any error.
    """

    code = "child_failed"
    http_status = 409
    cli_field = "child"

    def __init__(self, child_id: int, status: str, error: str | None = None, message: str | None = None):
        self.child_id = child_id
        self.status = status
        self.error = error
        super().__init__(message or f"child task {child_id} ended {status}" + (f": {error}" if error else ""))

    def wire_fields(self) -> dict[str, Any]:
        return {"child_id": self.child_id, "child_status": self.status, "child_error": self.error}

    @classmethod
    def from_wire(cls, message: str, fields: dict[str, Any]) -> ChildFailed:
        child_id = fields.get("child_id")
        error = fields.get("child_error")
        return cls(child_id if isinstance(child_id, int) and not isinstance(child_id, bool) else 0,
                   str(fields.get("child_status", "")), None if error is None else str(error), message)


class Suspended(BaseException):
    """The attempt ended in a durable wait (``ctx.sleep``, ``ctx.wait_for_signal``, ``ctx.wait_for``): raised
    through the handler, which stops there, and caught by the worker runtime.

    A BaseException, like :class:`asyncio.CancelledError`: a handler's ``except
    Exception`` does not swallow it. The lease was released by the guarded write
    that began the wait; the next attempt runs the handler from the top and
    replays what the ledger recorded.
    """

    def __init__(self, task_id: int, generation: int, until: float | None, waiting_for: str):
        self.task_id = task_id
        self.generation = generation
        self.until = until
        self.waiting_for = waiting_for
        super().__init__(f"task {task_id} generation {generation} suspended: waits for {waiting_for}")


ERRORS: tuple[type[LeaseqError], ...] = (
    LeaseqError, LeaseLost, InvalidInput, BodyTooLarge, NotFound, UnknownWorker, InvalidTransition, QueuePaused,
    ConfigError, BackendUnavailable, StaleToken, Permanent, CredentialMissing, AccessDenied, Unauthorized,
    RateLimited, IdempotencyKeyReused, IdempotencyKeyConflict, ApprovalMismatch, ApprovalExpired, ToolCallDiverged,
    WaitTimedOut, ChildFailed, BudgetSpent,
)


def _by_code() -> dict[str, type[LeaseqError]]:
    table: dict[str, type[LeaseqError]] = {}
    for cls in ERRORS:
        if "code" not in vars(cls):
            raise TypeError(f"{cls.__name__} is registered but declares no code of its own")
        if cls.code in table:
            raise TypeError(f"error code {cls.code!r} is declared by {table[cls.code].__name__} "
                            f"and {cls.__name__}")
        table[cls.code] = cls
    return table


_BY_CODE = _by_code()


def error_class(code: str) -> type[LeaseqError] | None:
    """The class whose ``code`` is ``code``, or None for a code leaseq does not define."""
    return _BY_CODE.get(code)


def registered_class(exc_or_cls: LeaseqError | type[LeaseqError]) -> type[LeaseqError]:
    """The registered class an error travels as (itself, or the parent a refinement travels as)."""
    cls = exc_or_cls if isinstance(exc_or_cls, type) else type(exc_or_cls)
    return _BY_CODE[cls.code]
