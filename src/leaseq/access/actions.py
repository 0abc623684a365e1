"""The roles and the table of actions: what each role may do, and how each action is offered.

A role is a fixed set of rights (:data:`RIGHTS`). :data:`ACTIONS` lists every
action a token may be allowed: the right it needs, whether the request names
a queue the token must be allowed to use, a worker the token must have
registered, or a task a worker token's workers must have held; and, for
operator actions, the :class:`leaseq.Queue` method that performs it and its
fields. The decision itself is :func:`leaseq.access.authorize`'s; the
service's operator routes and dashboard forms and the CLI's operator
commands are built from this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLES = ("worker", "viewer", "operator", "admin")
#: What each role may do. ``work``: the worker API; ``read``: tasks, events,
#: stats; ``operate``: operator actions; ``admin``: tokens and retention.
RIGHTS: dict[str, frozenset[str]] = {
    "worker": frozenset({"work", "enqueue"}),
    "viewer": frozenset({"read"}),
    "operator": frozenset({"read", "operate", "enqueue"}),
    "admin": frozenset({"read", "operate", "enqueue", "admin"}),
}
#: Whether a role sees payloads, results and errors unless told otherwise.
DEFAULT_READ_PAYLOADS = {"worker": True, "viewer": False, "operator": True, "admin": True}


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
