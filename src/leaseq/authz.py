"""Who may do what: the table of actions and the one function that decides.

:data:`ACTIONS` lists every action a token may be allowed: the right it
needs (roles are fixed sets of rights, :data:`leaseq.auth.RIGHTS`), whether
the request names a queue the token must be allowed to use, a worker the
token must have registered, or a task a worker token's workers must have
held; and, for operator actions, the :class:`leaseq.Queue` method that
performs it and its fields. :func:`authorize` is the only place access is
decided. The service's operator routes and dashboard forms and the CLI's
operator commands are built from the table, and every operator action goes
through :func:`perform`, whose Queue method writes the audit entry in the
action's own transaction (so an action never happens without its entry).
"""

from __future__ import annotations

import getpass
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .auth import RIGHTS, ROLES, AccessDenied, Principal, token_held_task, worker_token
from .core.errors import InvalidInput, LeaseqError

if TYPE_CHECKING:  # pragma: no cover
    from .queue import Queue


@dataclass(frozen=True)
class Field:
    """One parameter of an action: an API body field, a dashboard form input, a CLI option."""

    name: str
    help: str
    required: bool = True
    #: the value when the field is left out (only for fields that are not required)
    default: Any = None
    #: the values the dashboard offers, with their labels (the Queue method checks the value)
    choices: tuple[tuple[str, str], ...] = ()
    #: a JSON document (the CLI reads JSON text, ``-`` or ``@file``; the dashboard a text area)
    json: bool = False
    #: a yes/no switch (a JSON boolean in the API, a ``--NAME`` flag on the CLI); not offered on the dashboard
    flag: bool = False
    placeholder: str = ""


@dataclass(frozen=True)
class Action:
    """Something a token may be allowed to do, and how the service and the CLI offer it."""

    name: str
    #: the right it needs (see :data:`RIGHTS`); None: any valid token
    right: str | None
    #: what it does, as a phrase after "the viewer role cannot ..."
    summary: str
    #: what an operator action acts on: "task", "queue" or "worker" (its route and CLI argument)
    target: str | None = None
    #: the request names a queue, which a queue-limited token must be allowed to use
    queue_scope: bool = False
    #: the request names a task, whose queue a queue-limited token must be allowed to use
    #: (a task on another queue is refused exactly as one that does not exist)
    task_scope: bool = False
    #: it reads or changes what spans every queue (the overview, limits, workers): refused to a
    #: queue-limited token
    every_queue: bool = False
    #: the request names a worker, which the calling token must have registered
    own_worker: bool = False
    #: a worker token may also take it for a task its own workers hold or have held a lease on
    lease_holders: bool = False
    #: the :class:`leaseq.Queue` method an operator action calls (with ``by=`` and ``via=``)
    method: str | None = None
    fields: tuple[Field, ...] = ()
    #: the API summary; the first line of the CLI help
    title: str = ""
    #: more help for the CLI
    help: str = ""
    #: what happened, for the dashboard and the CLI: formatted with ``target`` and the fields
    done: str = ""
    #: the path segment after the target (default: the name)
    verb: str = ""
    #: task statuses the dashboard offers the action for (queue actions: see ``paused``)
    statuses: tuple[str, ...] = ()
    #: queue actions: offered on the dashboard when the queue's off-switch is in this state
    paused: bool | None = None
    label: str = ""
    #: what the dashboard's button does, shown beside it (where two buttons could be mistaken for each other)
    hint: str = ""
    danger: bool = False
    #: offered as a dashboard form / a CLI command (every operator action has an API route)
    dashboard: bool = False
    cli: bool = False
    #: may be taken on many targets at once with one set of fields (see :func:`perform_many`)
    bulk: bool = False
    #: an approval decision: its Queue method also takes the caller's token (``token_id=``),
    #: which may not decide a request it made
    decision: bool = False
    #: it binds the caller to a payload, so it needs a token that may read payloads
    #: (an approver approves what it has seen)
    sees_payload: bool = False

    @property
    def roles(self) -> frozenset[str]:
        """The roles that may take it (within their scope)."""
        return frozenset(role for role in ROLES if self.right is None or self.right in RIGHTS[role])

    @property
    def operator(self) -> bool:
        """An action on the data that goes through :func:`perform` and is audited."""
        return self.method is not None

    @property
    def route(self) -> str:
        """Its path, under ``/v1`` in the API and at the root on the dashboard."""
        base = {"task": "/tasks/{task_id}", "queue": "/queues/{name}", "worker": "/workers/{worker_id}"}
        return f"{base[self.target or '']}/{self.verb or self.name}"

    @property
    def command(self) -> str:
        """Its CLI command name."""
        return self.name.replace("_", "-")


_UNFINISHED = ("queued", "running", "dead", "blocked", "needs_reconciliation", "awaiting_approval")
_NOTE = "Recorded in the evidence trail."
_CREATE = Field("create", "Switch a queue that has never had a task (refused otherwise, as a mistyped name).",
                required=False, default=False, flag=True)

#: Every action, by name.
ACTIONS: dict[str, Action] = {a.name: a for a in (
    # the worker API
    Action("register_worker", "work", "register workers"),
    Action("claim", "work", "claim tasks", own_worker=True, queue_scope=True),
    Action("renew", "work", "renew leases", own_worker=True),
    Action("complete", "work", "complete tasks", own_worker=True),
    Action("fail", "work", "fail tasks", own_worker=True),
    Action("release", "work", "release leases", own_worker=True),
    Action("begin_effect", "work", "record effect intents", own_worker=True),
    Action("finish_effect", "work", "record effect responses", own_worker=True),
    Action("report_loss", "work", "report lease losses", own_worker=True),
    Action("intend", "work", "record intents", own_worker=True),
    Action("wait", "work", "end attempts in durable waits (sleeps, signal waits, waits for child tasks)",
           own_worker=True),
    Action("spawn", "work", "spawn child tasks", own_worker=True),
    Action("emit", "work", "append to tasks' streams", own_worker=True),
    Action("consume", "work", "charge the usage their calls report to limits and budgets", own_worker=True),
    Action("enqueue", "enqueue", "enqueue tasks", queue_scope=True),
    # reads
    Action("whoami", None, "say who it is"),
    Action("read", "read", "read workers, limits and metrics", every_queue=True),
    Action("read_queues", "read", "list tasks and approvals"),  # filtered by readable_queues
    Action("read_task", "read", "read tasks", lease_holders=True, task_scope=True),
    Action("read_trail", "read", "read tasks' evidence trails", task_scope=True),
    # operator actions: each an API route, most a dashboard form and a CLI command
    Action("cancel", "operate", "cancel tasks", target="task", task_scope=True, method="cancel", title="Cancel a task",
           help="A running holder loses its lease at its next guarded call. The children it spawned that have "
                "not ended are cancelled too, and theirs; with tree, the answer is the cancel tree's report: "
                "each child, intent and open effect with its disposition (completed, unknown, not_started).",
           fields=(Field("reason", "Why; recorded in the evidence trail.", placeholder="reason (required)"),
                   Field("tree", "Answer with the cancel tree: each child, intent and open effect of the task "
                                 "and its disposition (also kept in the evidence trail).",
                         required=False, default=False, flag=True)),
           done="task {target} cancelled", statuses=_UNFINISHED, label="Cancel task", danger=True,
           hint="Stops the task for good, whatever it waits for: it ends cancelled, and a running holder "
                "loses its lease.",
           dashboard=True, cli=True, bulk=True),
    Action("reconcile", "operate", "reconcile tasks", target="task", task_scope=True, method="reconcile",
           title="Resolve a needs_reconciliation task",
           help="Check the outside world first (did the action happen?), then record the outcome and a note; "
                "open intents are marked reconciled.",
           fields=(Field("outcome", "completed: the action did happen; requeue: it did not, run again with the "
                                    "same keys; cancel: give up.",
                         choices=(("completed", "the action happened: completed"),
                                  ("requeue", "it did not happen: run again"), ("cancel", "cancel the task"))),
                   Field("note", "What you checked; recorded in the evidence trail.",
                         placeholder="what you checked (required)"),
                   Field("result", "The task's result, with outcome completed.", required=False, json=True,
                         placeholder='result as JSON (optional), e.g. {"id": 42}')),
           done="task {target} reconciled: {outcome}", statuses=("needs_reconciliation",), label="Reconcile",
           dashboard=True, cli=True),
    Action("unblock", "operate", "unblock tasks", target="task", task_scope=True, method="unblock",
           title="Return a blocked task to the queue",
           help="Use it once the missing or revoked credential is repaired.",
           fields=(Field("note", "What was repaired; recorded in the evidence trail.",
                         placeholder="how the credential was repaired (required)"),),
           done="task {target} unblocked", statuses=("blocked",), label="Unblock", dashboard=True, cli=True),
    Action("requeue", "operate", "requeue tasks", target="task", task_scope=True, method="requeue",
           title="Return a dead task to the queue", help="It gets a fresh attempt budget.",
           fields=(Field("note", _NOTE, required=False, default="requeued by operator",
                         placeholder="why it should run again (required)"),),
           done="task {target} requeued", statuses=("dead",), label="Requeue", dashboard=True, cli=True,
           bulk=True),
    Action("approve", "operate", "approve tasks", target="task", task_scope=True, method="approve",
           title="Approve a task that awaits approval",
           help="Pass the digest you were shown (leaseq approvals, the dashboard's approvals inbox, GET "
                "/v1/approvals): the approval is bound to exactly that kind, payload, queue and every option "
                "the task runs with, and refused for any other. The task is queued; you are recorded as its "
                "approver. Refused for the request's own requester, and after its deadline (which then "
                "denies it).",
           fields=(Field("digest", "The task's approval digest as you were shown it (v2:sha256:...).",
                         placeholder="v2:sha256:... (the digest shown)"),
                   Field("note", _NOTE, required=False, placeholder="note (optional)"),
                   Field("raise_budget", "Units to add to the task's budget, by key, as JSON "
                                         "({\"tokens\": 100000}): for a task paused on its budget.",
                         required=False, json=True, placeholder='{"tokens": 100000} (optional)')),
           done="task {target} approved", statuses=("awaiting_approval",), label="Approve", dashboard=True,
           hint="Answers the approval request yes, for exactly the digest shown: the task is queued, with you "
                "recorded as its approver.",
           cli=True, decision=True, sees_payload=True),
    Action("deny", "operate", "deny tasks", target="task", task_scope=True, method="deny",
           title="Deny a task that awaits approval",
           help="The task ends denied and never runs; the reason is recorded in the evidence trail.",
           fields=(Field("reason", "Why; recorded in the evidence trail.", placeholder="reason (required)"),),
           done="task {target} denied", statuses=("awaiting_approval",), label="Deny", danger=True,
           hint="Answers the approval request no: the task ends denied and never runs, and, unlike Cancel "
                "task, you and your reason are recorded as its approval decision.",
           dashboard=True, cli=True, decision=True),
    Action("pause", "operate", "pause queues", target="queue", queue_scope=True, method="pause",
           title="Pause a queue (turn its off-switch on)",
           help="A paused queue hands out no claims, and running tasks may start no new effects; actions "
                "already in flight finish and are recorded. A queue that has never had a task is refused "
                "(a mistyped name), unless create is given.",
           fields=(_CREATE,),
           done="queue {target} paused: no new claims or effects; actions in flight may finish", paused=False,
           label="Pause", dashboard=True, cli=True),
    Action("resume", "operate", "resume queues", target="queue", queue_scope=True, method="resume",
           title="Resume a paused queue (turn its off-switch off)",
           help="A queue that has never had a task and has no off-switch is refused, unless create is given.",
           fields=(_CREATE,), done="queue {target} resumed", paused=True, label="Resume",
           dashboard=True, cli=True),
    Action("revoke_worker", "operate", "revoke workers", target="worker", verb="revoke", method="revoke_worker",
           every_queue=True,
           title="Revoke one worker",
           help="It claims nothing more and the leases it holds end now. The token that registered it stays "
                "valid (it may register a new worker): revoke the token to stop both.",
           done="worker {target} revoked", label="Revoke", danger=True, dashboard=True, cli=True),
    # signals for tasks' durable waits: sent by operators, within their queues
    Action("signal", "operate", "signal tasks", task_scope=True),
    Action("read_signals", "read", "read tasks' signals", task_scope=True),
    # a person's answer to a task's question (ctx.ask): an operator who may read what was asked
    Action("answer", "operate", "answer tasks' questions", task_scope=True, sees_payload=True),
    # limits shared by every worker: changed by operators (audited by the Queue method), read by viewers
    # bulk actions by filter (Queue.redrive, Queue.cancel_where): a queue-limited token names a queue
    Action("redrive", "operate", "redrive tasks", queue_scope=True),
    Action("cancel_where", "operate", "cancel tasks by filter", queue_scope=True),
    Action("set_limit", "operate", "set limits", every_queue=True),
    Action("delete_limit", "operate", "delete limits", every_queue=True),
    # admin
    Action("list_tokens", "admin", "manage tokens"),
    Action("create_token", "admin", "manage tokens"),
    Action("revoke_token", "admin", "manage tokens"),
    Action("prune", "admin", "apply retention"),
    Action("read_audit", "admin", "read the audit log"),
)}


class Facts(Protocol):
    """What :func:`authorize` may need to look up (the service caches these)."""

    def worker_token(self, worker_id: str) -> str | None:
        """The id of the token that registered ``worker_id`` (None: none did, or no such worker)."""

    def token_held_task(self, token_id: str, task_id: int) -> bool:
        """Whether a worker of ``token_id`` holds or has held a lease on ``task_id``."""

    def task_queue(self, task_id: int) -> str | None:
        """The queue of task ``task_id`` (None: no such task)."""


class QueueFacts:
    """:class:`Facts` read straight from the queue's database."""

    def __init__(self, q: Queue):
        self.q = q

    def worker_token(self, worker_id: str) -> str | None:
        return worker_token(self.q, worker_id)

    def token_held_task(self, token_id: str, task_id: int) -> bool:
        return token_held_task(self.q, token_id, task_id)

    def task_queue(self, task_id: int) -> str | None:
        return task_queue(self.q, task_id)


def task_queue(q: Queue, task_id: int) -> str | None:
    """The queue of task ``task_id``, or None if there is no such task."""
    from .core.errors import NotFound

    try:
        return q.get(task_id).queue
    except NotFound:
        return None


def _action(name: str) -> Action:
    spec = ACTIONS.get(name)
    if spec is None:
        raise ValueError(f"unknown action {name!r}")
    return spec


def _role_allows(principal: Principal, spec: Action) -> bool:
    return ((spec.right is None or spec.right in RIGHTS.get(principal.role, frozenset()))
            and (not spec.sees_payload or principal.read_payloads))


def _offered(principal: Principal, spec: Action) -> bool:
    """Whether ``principal`` may take ``spec`` at all: its role, and its scope for what spans every queue."""
    return _role_allows(principal, spec) and not (spec.every_queue and principal.queues is not None)


def _limited(principal: Principal) -> str:
    return f"this token is limited to queues {', '.join(sorted(principal.queues or ()))}"


def authorize_role(principal: Principal, action: str) -> Action:
    """The part of :func:`authorize` a request's target does not change (its role, and a
    queue-limited token's refusal of what spans every queue), for a check made before the
    targets are known (a bulk action, a dashboard form); each target is then authorized in
    full. Raises :class:`AccessDenied`."""
    spec = _action(action)
    if spec.sees_payload and not principal.read_payloads:
        raise AccessDenied(f"this token may not read payloads, so it cannot {spec.summary}: a decision is bound "
                           "to a payload its maker has seen")
    if spec.every_queue and principal.queues is not None:
        raise AccessDenied(f"{_limited(principal)}, so it cannot {spec.summary} (that spans every queue)")
    if not _role_allows(principal, spec) and not (spec.lease_holders and "work" in RIGHTS.get(principal.role, ())):
        raise AccessDenied(f"the {principal.role} role cannot {spec.summary}")
    return spec


def authorize(principal: Principal, action: str, *, queue: str | None = None, worker_id: str | None = None,
              task: int | None = None, facts: Facts | None = None) -> Action:
    """Allow ``principal`` to take ``action`` on what the request names, or raise :class:`AccessDenied`.

    ``queue``: the queue the request names (actions with ``queue_scope``);
    ``worker_id``: the worker it acts as (``own_worker``); ``task``: the task
    it reads or acts on (``lease_holders``, ``task_scope``: needed for a
    worker or queue-limited token); ``facts`` looks up worker and lease
    links and a task's queue.
    The only place access is decided. Returns the action's table entry.
    """
    spec = authorize_role(principal, action)
    if not _role_allows(principal, spec):  # a worker token reading a task (authorize_role let it through)
        if task is None or facts is None:
            raise TypeError(f"authorize({action!r}) for a worker token needs task= and facts=")
        # A worker token reads the tasks its own workers hold or have held, and no others
        # (whether another task exists is not its business either).
        if principal.local or not facts.token_held_task(principal.token_id, task):
            raise AccessDenied(f"a worker token may read only the tasks its own workers have held a lease on "
                               f"(not task {task})")
    elif spec.task_scope and principal.queues is not None:
        if task is None or facts is None:
            raise TypeError(f"authorize({action!r}) for a queue-limited token needs task= and facts=")
        # A task on another queue is refused exactly as one that does not exist: whether it
        # exists is not this token's business.
        queue_of = facts.task_queue(task)
        if queue_of is None or not principal.may_use_queue(queue_of):
            raise AccessDenied(f"{_limited(principal)}, and task {task} is not on them (or does not exist)")
    if spec.queue_scope:
        if queue is None:
            raise TypeError(f"authorize({action!r}) needs queue=")
        if not principal.may_use_queue(queue):
            raise AccessDenied(f"this token may not use queue {queue!r} ({_limited(principal)})")
    if spec.own_worker:
        if worker_id is None or facts is None:
            raise TypeError(f"authorize({action!r}) needs worker_id= and facts=")
        owner = facts.worker_token(worker_id)
        if owner is None or principal.local or not hmac.compare_digest(owner, principal.token_id):
            raise AccessDenied(f"worker {worker_id!r} was not registered with this token")
    return spec


def authorize_intent(principal: Principal, queue: str, approval: str | None) -> None:
    """Allow ``principal`` (already allowed ``intend`` for its worker) to record an intent on ``queue``.

    The intent/executor split: an intent is written for an executor pool,
    and the token that proposes it must not be the one that performs it. An
    intent gated by ``approval="required"`` may go to any queue: a person
    decides before anything runs. An ungated one runs as soon as a worker
    claims it, so it is refused on a queue the token may not use (that would
    be an enqueue outside its queues) and on a queue it may claim from
    itself (it would execute its own proposal), unless the token was created
    with ``own_intents=True``. In short, without that opt-in every intent of
    a token waits for a person.
    """
    if approval == "required":
        return
    if not principal.may_use_queue(queue):
        raise AccessDenied(f"this token may record an intent on queue {queue!r}, outside its queues, only with "
                           "approval='required'")
    if not principal.own_intents:
        raise AccessDenied(f"this token may claim from queue {queue!r} itself, so an intent it records there needs "
                           "approval='required' (the intent/executor split; a token created with own_intents "
                           "may execute its own intents)")


def authorize_spawn(principal: Principal, queue: str) -> None:
    """Allow ``principal`` (already allowed ``spawn`` for its worker) to spawn a child task on
    ``queue``: a child is an enqueue, so only on a queue the token may use (a child on the
    spawning task's own queue, the default, is always within it)."""
    if not principal.may_use_queue(queue):
        raise AccessDenied(f"this token may not spawn a child task on queue {queue!r}, outside its queues")


def authorize_upstreams(principal: Principal, after: list[int], queues: Mapping[int, str]) -> None:
    """Allow ``principal`` to make a task wait for the tasks of ``after`` (checked ids, in order),
    ``queues`` naming the queue of each that exists; raise otherwise.

    A token limited to some queues may name only tasks on those queues: waiting for
    a task is reading its result (:func:`readable_upstreams`). Any other is refused
    exactly as a task that does not exist would be, so the refusal tells it nothing
    (:func:`leaseq.engine.dependencies.no_such_upstream`)."""
    from .engine.dependencies import no_such_upstream

    for upstream in after:
        queue = queues.get(upstream)
        if queue is None:
            return  # the enqueue itself refuses the first task that does not exist
        if not principal.may_use_queue(queue):
            raise no_such_upstream(upstream)


def readable_queues(principal: Principal, queue: str | None) -> list[str] | None:
    """The queues a listing for ``principal`` may show: None for every queue (an unlimited
    token asking for none), else the queues to read, ``[queue]`` when one was asked for.
    A queue-limited token asking for another queue is refused (:class:`AccessDenied`)."""
    authorize(principal, "read_queues")
    if principal.queues is None:
        return None if queue is None else [queue]
    if queue is None:
        return sorted(principal.queues)
    if not principal.may_use_queue(queue):
        raise AccessDenied(f"this token may not use queue {queue!r} ({_limited(principal)})")
    return [queue]


def readable_upstreams(principal: Principal, queues: Mapping[int, str]) -> set[int]:
    """Of the upstream tasks in ``queues`` (id: its queue), those whose results ``principal`` may
    read through a task that waits for them: a token limited to some queues, those on its queues."""
    return {upstream for upstream, queue in queues.items() if principal.may_use_queue(queue)}


def perform(q: Queue, principal: Principal, action: str, target: Any, *, via: str | None = None,
            **params: Any) -> Any:
    """Authorize and take an operator action; returns what its Queue method returns.

    ``target`` is the task id, queue name or worker id the action acts on;
    ``params`` are its fields (a field left out takes its default). The
    Queue method records ``principal.actor`` in the evidence trail and writes
    the audit row (with ``via``: "api", "dashboard", "cli") in the action's
    own transaction, so an action is never without its audit entry.
    """
    spec = _action(action)
    if not spec.operator:
        raise ValueError(f"{action!r} is not an operator action")
    authorize(principal, action, queue=target if spec.target == "queue" else None,
              task=target if spec.target == "task" else None, facts=QueueFacts(q))
    known = {f.name for f in spec.fields}
    for name in params:
        if name not in known:
            raise InvalidInput(name, "unknown field")
    for f in spec.fields:
        if f.name not in params:
            if f.required:
                raise InvalidInput(f.name, "required field is missing")
            params[f.name] = f.default
    if spec.decision:  # the token that asked for an approval may not decide it
        params["token_id"] = None if principal.local else principal.token_id
    return getattr(q, spec.method or "")(target, **params, by=principal.actor, via=via)


@dataclass(frozen=True)
class Outcome:
    """What one target of :func:`perform_many` came to: the method's return value, or the refusal."""

    target: Any
    result: Any = None
    error: LeaseqError | None = None


def perform_many(q: Queue, principal: Principal, action: str, targets: list[Any], *, via: str | None = None,
                 **params: Any) -> list[Outcome]:
    """Take a bulk action (``bulk=True`` in the table) on each target with the same fields.

    Each target goes through :func:`perform` on its own: authorized, acted on
    and audited in its own transaction, so one refusal (a task in the wrong
    status, say) is reported for that target and the others still happen.
    A principal whose role may not take the action at all is refused before
    any target is touched.
    """
    spec = _action(action)
    if not spec.bulk:
        raise ValueError(f"{action!r} is not a bulk action")
    authorize_role(principal, action)
    outcomes = []
    for target in targets:
        try:
            outcomes.append(Outcome(target, perform(q, principal, action, target, via=via, **dict(params))))
        except LeaseqError as exc:
            outcomes.append(Outcome(target, error=exc))
    return outcomes


def done_message(action: str, target: Any, **params: Any) -> str:
    """What happened, in the words of the action's table entry."""
    return _action(action).done.format_map(_Blank(target=target, **params))


class _Blank(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> str:
        return ""


def operator_actions(surface: str | None = None) -> list[Action]:
    """The operator actions in table order; ``surface`` "dashboard" or "cli" keeps those offered there."""
    return [a for a in ACTIONS.values() if a.operator and (surface is None or getattr(a, surface))]


def local_principal() -> Principal:
    """The principal of the local command line: database access means every right; acts as ``cli:<user>``."""
    try:
        user = getpass.getuser()
    except Exception:  # pragma: no cover - no user database in some containers
        user = "unknown"
    return Principal(token_id="", name=f"cli:{user}", role="admin", queues=None, read_payloads=True, local=True)
