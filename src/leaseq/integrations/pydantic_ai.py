"""pydantic-ai on leaseq: model requests memoised, tool calls ledgered (``leaseq[pydantic-ai]``).

::

    from pydantic_ai import Agent
    from leaseq.integrations.pydantic_ai import LeaseqModel, LeaseqToolset

    agent = Agent(LeaseqModel("openai:gpt-5"),
                  toolsets=[LeaseqToolset(tools, effects={"lookup": "read_only", "refund": "side_effect"})])

    @app.task("support.reply", effect="side_effect")
    async def reply(ctx, ticket: str) -> str:
        return (await agent.run(ticket)).output

Inside a leaseq handler each model request is a ``read_only`` ledger entry
(``llm.request`` at its position) and each tool call an entry keyed by the
tool-call id, of the class ``effects`` gives it (default ``side_effect``).
On a retry the recorded ones are replayed, so the resumed run sees the same
history without paying for its model requests again; a replayed response
reports zero token usage (its tokens were counted when it was made).
With ``usage_limit="openai-tokens"``, each response's token usage is charged
to that limit after the request (``ctx.consume``: its entry follows the
request's in the ledger, so a replayed run charges nothing twice, and a
response recorded by an attempt that died before charging it is charged by
the next).
Outside a handler both wrappers pass every call straight through.

A tool that needs approval (``requires_approval=True``, or one raising
``ApprovalRequired``) ends in pydantic-ai's deferred tool requests; with
:class:`LeaseqApprovals` among the agent's capabilities, each such call becomes a
durable wait for the signal ``approval:<tool call id>`` instead: the attempt ends,
holding no lease and no slot, and the task waits until a person sends the decision
(``q.signal(task_id, "approval:call_7", {"approved": true})``, ``leaseq signal``,
the dashboard); the next attempt replays the run from the ledger and the approved
call is made, or the denial is told to the model (``{"approved": false,
"message": "why"}``).

Tool calls run one after another in the order the model emitted them, so
the ledger records them in that order on every attempt. A tool's result is
recorded in its JSON form (``pydantic_core.to_jsonable_python``) and the
model sees that form, first run and replay alike. Streaming requests
(``run_stream``) are not recorded and are refused inside a handler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pydantic
import pydantic_core
from pydantic_ai.capabilities import AbstractCapability, CapabilityOrdering
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.usage import RequestUsage

from ..core.checks import check_name
from ..core.errors import InvalidInput
from ..worker.tools import Tool
from ._common import ToolClasses, UsageSeen, await_decision, running_context, stable_view

if TYPE_CHECKING:  # pragma: no cover
    from ..worker.context import TaskContext

__all__ = ["LeaseqApprovals", "LeaseqModel", "LeaseqToolset"]

_RESPONSE = pydantic.TypeAdapter(ModelResponse)


def _zeroed(response: ModelResponse) -> ModelResponse:
    return dataclasses.replace(response, usage=RequestUsage())


class LeaseqModel(WrapperModel):
    """A pydantic-ai model whose requests are ``read_only`` entries of the running task's ledger."""

    def __init__(self, wrapped: Model | str, *, ctx: TaskContext | None = None, action: str = "llm.request",
                 usage_limit: str | None = None):
        super().__init__(wrapped)
        self._ctx = ctx
        self.action = action
        #: the limit each response's token usage is charged to (ctx.consume); None: not charged
        self.usage_limit = None if usage_limit is None else check_name("usage_limit", usage_limit)

    async def request(self, messages: list[ModelMessage], model_settings: Any,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        ctx = running_context(self._ctx)
        if ctx is None:
            return await super().request(messages, model_settings, model_request_parameters)

        async def call(view: Any) -> ModelResponse:
            return await self.wrapped.request(messages, model_settings, model_request_parameters)

        used = UsageSeen(lambda r: r.usage.total_tokens)  # replayed or not: what the request used
        tool = Tool(ctx, call, action=self.action, effect="read_only",
                    encode=lambda r: _RESPONSE.dump_python(r, mode="json"),
                    decode=used.of(_RESPONSE.validate_python), decode_replayed=used.of(_RESPONSE.validate_python,
                                                                                      then=_zeroed))
        view = stable_view(ModelMessagesTypeAdapter.dump_python(messages, mode="json"))
        response: ModelResponse = await tool(view)
        if self.usage_limit is not None:
            await ctx.aconsume(self.usage_limit, used.units)
        return response

    @asynccontextmanager
    async def request_stream(self, messages: list[ModelMessage], model_settings: Any,
                             model_request_parameters: ModelRequestParameters,
                             run_context: Any = None) -> AsyncIterator[Any]:
        if running_context(self._ctx) is not None:
            raise InvalidInput("stream", "streamed model requests are not recorded in the ledger; "
                                         "use agent.run() inside a leaseq handler")
        async with super().request_stream(messages, model_settings, model_request_parameters,
                                          run_context) as stream:
            yield stream


@dataclasses.dataclass
class LeaseqToolset(WrapperToolset[Any]):
    """A pydantic-ai toolset whose calls are entries of the running task's ledger, keyed by tool-call id.

    ``effects`` maps tool names to their class (read_only, idempotent,
    side_effect); unlisted tools are ``side_effect`` (``default=``). The
    action of a call is the tool's name (declare those in ``actions=``).
    """

    effects: Mapping[str, str] | None = None
    default: str = "side_effect"
    ctx: Any = None

    def __post_init__(self) -> None:
        self._classes = ToolClasses(self.effects, self.default)

    async def get_tools(self, ctx: Any) -> dict[str, Any]:
        tools = await super().get_tools(ctx)
        if running_context(self.ctx) is None:
            return tools
        # one call at a time, in the order the model emitted them: the same ledger order every attempt
        return {name: dataclasses.replace(t, tool_def=dataclasses.replace(t.tool_def, sequential=True))
                for name, t in tools.items()}

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        task_ctx = running_context(self.ctx)
        if task_ctx is None:
            return await super().call_tool(name, tool_args, ctx, tool)

        async def call(args: dict[str, Any]) -> Any:
            return await self.wrapped.call_tool(name, args, ctx, tool)

        ledgered = Tool(task_ctx, call, action=name, effect=self._classes(name),
                        encode=pydantic_core.to_jsonable_python)
        if ctx.tool_call_id:
            return await ledgered.keyed(ctx.tool_call_id)(tool_args)
        return await ledgered(tool_args)

    def visit_and_replace(self, visitor: Any) -> AbstractToolset[Any]:
        return dataclasses.replace(self, wrapped=self.wrapped.visit_and_replace(visitor))


@dataclasses.dataclass
class LeaseqApprovals(AbstractCapability[Any]):
    """A pydantic-ai capability that turns each tool call needing approval into a durable wait.

    ``Agent(..., capabilities=[LeaseqApprovals(timeout=3600)])``: in a leaseq
    handler, each call in the run's deferred approvals waits for the signal
    ``approval:<tool call id>`` (:meth:`leaseq.TaskContext.wait_for_signal`), one
    after another in the model's order. The payload is the person's decision:
    ``true``, ``false`` or ``{"approved": ..., "message": ...}``. Until it comes the
    attempt ends, with no lease and no slot; the next attempt replays the run from
    the ledger and gets the recorded decision. With ``timeout`` (seconds) a call
    no decision reached in time is denied. Outside a handler it answers nothing
    (the run ends with ``DeferredToolRequests`` as without it).
    """

    timeout: float | None = None
    ctx: Any = None

    def get_ordering(self) -> CapabilityOrdering | None:
        """Answers last: every handler that can resolve a call without waiting goes first."""
        return CapabilityOrdering(position="innermost")

    @classmethod
    def get_serialization_name(cls) -> str | None:
        """Not part of agent specs."""
        return None

    async def handle_deferred_tool_calls(self, ctx: Any, *,
                                         requests: DeferredToolRequests) -> DeferredToolResults | None:
        """Each pending approval, waited for durably; external calls are left to others."""
        task_ctx = running_context(self.ctx)
        if task_ctx is None or not requests.approvals:
            return None
        approvals: dict[str, ToolApproved | ToolDenied] = {}
        for call in requests.approvals:  # in the model's order: the same waits on every attempt
            decision = await await_decision(task_ctx, call.tool_call_id, self.timeout)
            approvals[call.tool_call_id] = ToolApproved() if decision.approved else \
                ToolDenied(decision.message) if decision.message else ToolDenied()
        return requests.build_results(approvals=approvals)
