"""The OpenAI Agents SDK on leaseq: model responses memoised, function tools ledgered (``leaseq[openai-agents]``).

::

    from agents import Agent, Runner
    from leaseq.integrations.openai_agents import LeaseqModel, ledgered_tools

    agent = Agent(name="support", model=LeaseqModel(OpenAIResponsesModel(...)),
                  tools=ledgered_tools([lookup, refund], effects={"lookup": "read_only"}))

    @app.task("support.reply", effect="side_effect")
    async def reply(ctx, ticket: str) -> str:
        return (await Runner.run(agent, ticket)).final_output

Inside a leaseq handler each model response is a ``read_only`` ledger entry
(``llm.response`` at its position) and each function tool call an entry
keyed by its ``call_id``, of the class ``effects`` gives it (default
``side_effect``). On a retry the recorded ones are replayed; a replayed
response reports zero usage (its tokens were counted when it was made).
With ``usage_limit="openai-tokens"``, each response's token usage is charged
to that limit after the call (``ctx.consume``, an entry of the ledger: a
replayed run charges nothing twice).
A function tool with ``needs_approval`` interrupts the run; :func:`run` (in
place of ``Runner.run``) turns each interruption into a durable wait for the
signal ``approval:<call id>``: the attempt ends, holding no lease and no slot,
until a person sends the decision (``q.signal(task_id, "approval:call_7",
{"approved": true})``); the next attempt replays the run from the ledger,
approves or rejects the call (``{"approved": false, "message": "why"}``: what the
model is told) and resumes the run.
Parallel tool calls are made one at a time in the order the model emitted
them. Outside a handler everything passes straight through. Streamed runs
(``Runner.run_streamed``) are not recorded and are refused inside a handler.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pydantic
import pydantic_core
from agents import FunctionTool, Runner
from agents.items import ModelResponse, TResponseOutputItem
from agents.models.interface import Model
from agents.usage import Usage

from ..core.checks import check_name
from ..core.errors import InvalidInput
from ..worker.tools import Tool
from ._common import ToolClasses, UsageSeen, await_decision, running_context, stable_view

if TYPE_CHECKING:  # pragma: no cover
    from ..worker.context import TaskContext

__all__ = ["LeaseqModel", "ledgered_tools", "run"]

_ITEM: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(TResponseOutputItem)
_USAGE = pydantic.TypeAdapter(Usage)
#: one lock per handler attempt: its tool calls take turns, in the order they were started
_TURNS: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()


def _encode(response: ModelResponse) -> dict[str, Any]:
    return {"output": [item.model_dump(mode="json") for item in response.output],
            "usage": _USAGE.dump_python(response.usage, mode="json"), "response_id": response.response_id}


def _decode(recorded: dict[str, Any]) -> ModelResponse:
    return ModelResponse(output=[_ITEM.validate_python(i) for i in recorded["output"]],
                         usage=_USAGE.validate_python(recorded["usage"]), response_id=recorded["response_id"])


def _zeroed(response: ModelResponse) -> ModelResponse:
    return dataclasses.replace(response, usage=Usage())


class LeaseqModel(Model):
    """An Agents SDK model whose responses are ``read_only`` entries of the running task's ledger."""

    def __init__(self, wrapped: Model, *, ctx: TaskContext | None = None, action: str = "llm.response",
                 usage_limit: str | None = None):
        self.wrapped = wrapped
        self._ctx = ctx
        self.action = action
        #: the limit each response's token usage is charged to (ctx.consume); None: not charged
        self.usage_limit = None if usage_limit is None else check_name("usage_limit", usage_limit)

    async def get_response(self, system_instructions: str | None, input: Any, model_settings: Any, tools: Any,
                           output_schema: Any, handoffs: Any, tracing: Any, *, previous_response_id: str | None,
                           conversation_id: str | None, prompt: Any) -> ModelResponse:
        ctx = running_context(self._ctx)

        async def call(view: Any = None) -> ModelResponse:
            return await self.wrapped.get_response(
                system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
                previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt)

        if ctx is None:
            return await call()
        view = stable_view(pydantic_core.to_jsonable_python(
            {"instructions": system_instructions, "input": input, "tools": [t.name for t in tools]},
            fallback=repr))
        used = UsageSeen(lambda r: r.usage.total_tokens)
        response: ModelResponse = await Tool(ctx, call, action=self.action, effect="read_only", encode=_encode,
                                             decode=used.of(_decode),
                                             decode_replayed=used.of(_decode, then=_zeroed))(view)
        if self.usage_limit is not None:
            await ctx.aconsume(self.usage_limit, used.units)
        return response

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        if running_context(self._ctx) is not None:
            raise InvalidInput("stream", "streamed responses are not recorded in the ledger; use Runner.run() "
                                         "inside a leaseq handler")
        return self.wrapped.stream_response(*args, **kwargs)

    async def close(self) -> None:
        await self.wrapped.close()


def ledgered_tools(tools: Iterable[FunctionTool], *, effects: Mapping[str, str] | None = None,
                   default: str = "side_effect", ctx: TaskContext | None = None) -> list[FunctionTool]:
    """Copies of ``tools`` whose calls are entries of the running task's ledger, keyed by ``call_id``.

    ``effects`` maps tool names to their class; unlisted tools are
    ``default`` (``side_effect``). The action of a call is the tool's name.
    """
    classes = ToolClasses(effects, default)
    wrapped = []
    for tool in tools:
        if not isinstance(tool, FunctionTool):
            raise InvalidInput("tools", f"must be function tools (got {tool!r})")
        wrapped.append(dataclasses.replace(tool, on_invoke_tool=_ledgered(tool, classes(tool.name), ctx)))
    return wrapped


def _ledgered(tool: FunctionTool, effect: str, given: TaskContext | None) -> Any:
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(tool_ctx: Any, input_json: str) -> Any:
        ctx = running_context(given)
        if ctx is None:
            return await invoke(tool_ctx, input_json)

        async def call(arguments: str) -> Any:
            return await invoke(tool_ctx, arguments)

        ledgered = Tool(ctx, call, action=tool.name, effect=effect, encode=pydantic_core.to_jsonable_python)
        turn = _TURNS.setdefault(ctx, asyncio.Lock())
        async with turn:  # FIFO: the calls the SDK started together are recorded in the model's order
            if tool_ctx.tool_call_id:
                return await ledgered.keyed(tool_ctx.tool_call_id)(input_json)
            return await ledgered(input_json)

    return on_invoke_tool


def _call_id(item: Any) -> str:
    """The call id of an interruption's tool call (the key of its approval's signal)."""
    raw = item.raw_item
    found = raw.get("call_id") or raw.get("id") if isinstance(raw, dict) else \
        getattr(raw, "call_id", None) or getattr(raw, "id", None)
    if not isinstance(found, str) or not found:
        raise InvalidInput("interruption", f"a tool call awaiting approval carries no call id ({raw!r})")
    return found


async def run(agent: Any, input: Any, *, ctx: TaskContext | None = None, timeout: float | None = None,
              **options: Any) -> Any:
    """``Runner.run(agent, input, **options)``, with each tool approval a durable wait for a person.

    When the run stops on interruptions (tools with ``needs_approval``), each is
    waited for as the signal ``approval:<call id>`` (in the order the SDK lists them),
    approved or rejected as its payload says (``true``, ``false``, ``{"approved": ...,
    "message": ...}``), and the run resumed from its state, until it ends without one.
    Until a decision comes the attempt ends, holding no lease and no slot; the next
    attempt replays the run from the ledger. With ``timeout`` (seconds) a call no
    decision reached in time is rejected. Outside a handler: ``Runner.run``, whose
    result carries the interruptions.
    """
    result = await Runner.run(agent, input, **options)
    task_ctx = running_context(ctx)
    resume = {k: v for k, v in options.items() if k != "context"}  # the state carries the context
    while task_ctx is not None and result.interruptions:
        state = result.to_state()
        for item in result.interruptions:
            decision = await await_decision(task_ctx, _call_id(item), timeout)
            if decision.approved:
                state.approve(item)
            else:
                state.reject(item, rejection_message=decision.message)
        result = await Runner.run(agent, state, **resume)
    return result
