"""``leaseq mcp``: the queue as a Model Context Protocol server, for operators and agents.

An MCP client (an agent, an IDE, Claude Desktop) starts ``leaseq mcp`` and talks
to it over stdio. The server acts for exactly one queue-issued token, given when
it starts: it offers the queue's read views (queue overview, tasks, one task with
its evidence trail and action ledger, the reconciliation inbox, workers) and the
operator actions of :data:`leaseq.access.ACTIONS` as tools. The token is verified
again at every tool call (:func:`run_stdio`): once it is revoked or expired, the
call is refused and the server stops. Every call is decided by
:func:`leaseq.access.authorize` for that token, exactly as the HTTP API decides it:
a viewer token reads (payloads and results hidden unless the token may read them)
and is refused every operator action; an operator action goes through
:func:`leaseq.access.perform`, which records the token's name in the evidence trail
and writes the audit entry (``via`` "mcp") in the action's own transaction.

Errors come back as tool errors with the field and the problem, never a traceback.
"""


import inspect
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import Field as PydanticField

from . import access
from .access import Principal
from .core.errors import LeaseqError
from .queue import Queue
from .service.views import (present_approval, present_effect, present_event, present_task, readable_approvals,
                            readable_overview, readable_tasks, task_timeline)
from .service.wire import to_json

INSTRUCTIONS = (
    "leaseq is a task queue in which a claim is a lease with a fencing token. Read the queue with "
    "queue_overview, list_tasks, get_task and reconciliation_inbox. Tasks in needs_reconciliation "
    "wait for a person: check the outside world (did the action happen?) before calling reconcile. "
    "Tasks in awaiting_approval wait for an operator's decision: read approvals_inbox (payload, digest, who "
    "asked), then approve with the digest shown (the approval is bound to it) or deny with a reason. "
    "Operator actions need an operator token and are audited under this token's name."
)

#: the MCP tool parameter for each kind of operator action target
_TARGETS: dict[str, tuple[str, Any, str]] = {
    "task": ("task_id", int, "The task's id."),
    "queue": ("queue", str, "The queue's name."),
    "worker": ("worker_id", str, "The worker's id (from list_workers)."),
}




#: Seconds a server whose token was refused lets the refusal's answer reach the client before it stops.
STOP_GRACE_SECONDS = 0.2


def _guard(fn: Callable[..., Any], tools: "QueueTools") -> Callable[..., Any]:
    """Verify the server's token again (:meth:`QueueTools.reverify`), then call ``fn``; turn
    leaseq's errors into one-line tool errors (the MCP server reports them to the client)."""
    from mcp.server.mcpserver.exceptions import ToolError

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            tools.reverify()
            return fn(*args, **kwargs)
        except LeaseqError as exc:
            field = getattr(exc, "field", None) or exc.code
            raise ToolError(f"{type(exc).__name__}: {field}: {exc}") from None

    call.__name__ = fn.__name__
    call.__doc__ = fn.__doc__
    call.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return call


class QueueTools:
    """The tools of one server: reads and operator actions for ``principal`` on ``q``.

    With ``token``, each call first verifies it again (:meth:`reverify`): a revoked
    or expired token is refused at its next call, and ``on_refused`` is told why
    (:func:`run_stdio` stops the server then)."""

    def __init__(self, q: Queue, principal: Principal, *, token: str | None = None,
                 on_refused: Callable[[str], None] | None = None):
        self.q = q
        self.principal = principal
        self.token = token
        self.on_refused = on_refused

    def reverify(self) -> None:
        """Verify the token again (nothing without one); Unauthorized, and ``on_refused``, when refused."""
        if self.token is None:
            return
        try:
            self.principal = access.verify_token(self.q, self.token)
        except access.Unauthorized as exc:
            if self.on_refused is not None:
                self.on_refused(str(exc))
            raise

    # -- reads -----------------------------------------------------------------------
    def whoami(self) -> dict[str, Any]:
        """The token this server acts for: its name, role and the queues it may use."""
        p = self.principal
        return {"token_id": p.token_id, "name": p.name, "role": p.role,
                "queues": sorted(p.queues) if p.queues is not None else None,
                "may": sorted(a.name for a in access.operator_actions() if p.can(a.name))}

    def queue_overview(self) -> dict[str, Any]:
        """Each queue: counts by status, the oldest queued task's age, paused or running."""
        return {"queues": to_json(readable_overview(self.q, self.principal))}

    def list_tasks(self, status: Annotated[str | None, PydanticField(
                       description="queued, running, completed, dead, cancelled, blocked, needs_reconciliation, "
                                   "awaiting_approval or denied")] = None,
                   queue: str | None = None,
                   limit: Annotated[int, PydanticField(ge=1, le=500)] = 50) -> dict[str, Any]:
        """Tasks, newest first, optionally by status and queue."""
        return {"tasks": [present_task(t, self.principal)
                          for t in readable_tasks(self.q, self.principal, status=status, queue=queue, limit=limit)]}

    def get_task(self, task_id: int) -> dict[str, Any]:
        """One task with its evidence trail by claim generation and its action ledger."""
        access.authorize(self.principal, "read_trail", task=task_id, facts=access.QueueFacts(self.q))
        task = self.q.get(task_id)
        return {"task": present_task(task, self.principal),
                "events": [present_event(e, self.principal) for e in self.q.events(task_id)],
                "effects": [present_effect(fx, self.principal) for fx in self.q.effects(task_id)],
                "timeline": task_timeline(task, self.q.events(task_id), self.q.effects(task_id), self.principal)}

    def reconciliation_inbox(self, limit: Annotated[int, PydanticField(ge=1, le=500)] = 50) -> dict[str, Any]:
        """Tasks waiting for a person: an expired lease left a side effect whose outcome is unknown."""
        tasks = readable_tasks(self.q, self.principal, status="needs_reconciliation", limit=limit)
        return {"tasks": [{**present_task(t, self.principal),
                           "open_effects": [present_effect(fx, self.principal) for fx in self.q.effects(t.id)
                                            if fx.status == "pending"]} for t in tasks]}

    def approvals_inbox(self, queue: str | None = None,
                        limit: Annotated[int, PydanticField(ge=1, le=500)] = 50) -> dict[str, Any]:
        """Tasks awaiting approval, oldest first: each with its payload, its digest (pass it to approve)
        and who asked for it."""
        return {"approvals": [present_approval(a, self.principal)
                              for a in readable_approvals(self.q, self.principal, queue=queue, limit=limit)]}

    def list_workers(self) -> dict[str, Any]:
        """Registered workers, revoked or not, and the leases they hold."""
        access.authorize(self.principal, "read")
        return {"workers": to_json(self.q.workers())}

    READS = ("whoami", "queue_overview", "list_tasks", "get_task", "reconciliation_inbox", "approvals_inbox",
             "list_workers")

    # -- operator actions ------------------------------------------------------------
    def action_tool(self, action: access.Action) -> Callable[..., Any]:
        """A tool for one operator action: its target and fields as parameters."""
        target_name, target_type, target_help = _TARGETS[action.target or "task"]
        params = [inspect.Parameter(target_name, inspect.Parameter.KEYWORD_ONLY,
                                    annotation=Annotated[target_type, PydanticField(description=target_help)])]
        for f in action.fields:
            kind: Any = Any if f.json else bool if f.flag else str
            optional = not f.required and not f.flag  # a flag left out is its default, never None
            annotation: Any = Annotated[kind | None if optional else kind, PydanticField(description=f.help)]
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                            **({} if f.required else {"default": f.default})))

        def run(**arguments: Any) -> dict[str, Any]:
            target = arguments.pop(target_name)
            outcome = access.perform(self.q, self.principal, action.name, target, via="mcp", **arguments)
            return {"done": access.done_message(action.name, target, **arguments), "outcome": to_json(outcome)}

        run.__name__ = action.name
        run.__doc__ = "\n\n".join(p for p in (action.title, action.help,
                                              f"Needs the '{action.right}' right; audited.") if p)
        run.__signature__ = inspect.Signature(params, return_annotation=dict[str, Any])  # type: ignore[attr-defined]
        return run


def build_server(q: Queue, principal: Principal, *, token: str | None = None,
                 on_refused: Callable[[str], None] | None = None) -> Any:
    """The MCP server (an ``mcp`` ``MCPServer``) acting for ``principal`` on ``q``; with ``token``,
    verified again at every tool call (see :class:`QueueTools`)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    tools = QueueTools(q, principal, token=token, on_refused=on_refused)
    server = MCPServer("leaseq", instructions=INSTRUCTIONS)
    for name in QueueTools.READS:
        server.add_tool(_guard(getattr(tools, name), tools), name=name,
                        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    for action in access.operator_actions():
        server.add_tool(_guard(tools.action_tool(action), tools), name=action.name, title=action.title,
                        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=action.danger,
                                                    idempotent_hint=False, open_world_hint=False))
    return server


def run_stdio(q: Queue, token: str) -> None:
    """Serve the MCP client on stdin and stdout for ``token`` until it disconnects, or until
    the token is refused at a tool call (revoked or expired): that call is answered with
    the refusal, and the process then ends with status 1 and one line on stderr. Raises
    Unauthorized when the token is refused at the start."""
    import anyio
    import anyio.from_thread

    principal = access.verify_token(q, token)

    async def main() -> None:
        stop = anyio.Event()
        refused: list[str] = []

        def on_refused(reason: str) -> None:  # in the tool's worker thread
            refused.append(reason)
            anyio.from_thread.run_sync(stop.set)

        async def stopper() -> None:
            await stop.wait()
            await anyio.sleep(STOP_GRACE_SECONDS)  # the refusal's own answer goes out first
            # The transport reads stdin in a thread that no cancellation reaches: end the process.
            sys.stderr.write(f"error: token: refused ({refused[0]}): the server stopped\n")
            sys.stderr.flush()
            q.close()
            os._exit(1)

        server = build_server(q, principal, token=token, on_refused=on_refused)
        async with anyio.create_task_group() as group:
            group.start_soon(stopper)
            await server.run_stdio_async()
            group.cancel_scope.cancel()

    anyio.run(main)
