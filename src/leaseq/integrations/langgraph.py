"""LangGraph on leaseq: a model node memoised and a tool node ledgered (``leaseq[langgraph]``).

::

    from langgraph.graph import StateGraph, MessagesState, START, END
    from leaseq.integrations.langgraph import LeaseqToolNode, model_node, tools_condition

    graph = StateGraph(MessagesState)
    graph.add_node("model", model_node(chat_model.bind_tools(tools)))
    graph.add_node("tools", LeaseqToolNode(tools, effects={"lookup": "read_only"}))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    agent = graph.compile()

    @app.task("support.reply", effect="side_effect")
    def reply(ctx, ticket: str) -> str:
        return agent.invoke({"messages": [("user", ticket)]})["messages"][-1].content

Inside a leaseq handler each model invocation is a ``read_only`` ledger
entry (``llm.invoke`` at its position) and each tool call an entry keyed by
its tool-call id, of the class ``effects`` gives it (default
``side_effect``). On a retry the recorded ones are replayed; a replayed
model message reports no token usage (``usage_metadata`` is dropped: its
tokens were counted when it was made). ``model_node(...,
usage_limit="openai-tokens")`` charges each message's token usage to that
limit after the call (``ctx.consume``, an entry of the ledger: a replayed
run charges nothing twice).

A node that calls LangGraph's ``interrupt(value)`` to ask a person stops the
graph; run the graph with :func:`invoke` (or :func:`ainvoke`) in place of
``graph.invoke`` and each interrupt becomes a durable wait for the signal
``interrupt``: the attempt ends, holding no lease and no slot, until a person
sends it (``q.signal(task_id, "interrupt", payload)``); the next attempt
replays the graph from the ledger and resumes it with the payload, which
``interrupt()`` returns. Call ``interrupt`` in a node of its own (a review
step before the tool node), not inside a ledgered tool. The tool node runs a message's tool
calls one after another in the order the model emitted them. Outside a
handler both nodes call straight through.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pydantic_core
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, message_to_dict, messages_from_dict
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END
from langgraph.types import Command

from ..core.checks import check_name
from ..core.errors import InvalidInput
from ..worker.tools import Tool
from ._common import INTERRUPT_SIGNAL, VOLATILE_KEYS, ToolClasses, UsageSeen, running_context, stable_view

if TYPE_CHECKING:  # pragma: no cover
    from ..worker.context import TaskContext

__all__ = ["LeaseqToolNode", "ainvoke", "invoke", "model_node", "tools_condition"]

#: LangGraph gives each new message a random id: not part of what was asked
_VOLATILE = VOLATILE_KEYS | {"id"}


def _messages(state: Any) -> list[BaseMessage]:
    messages = state.get("messages") if isinstance(state, dict) else getattr(state, "messages", None)
    if not isinstance(messages, list):
        raise InvalidInput("state", "must hold a list of messages under 'messages'")
    return messages


def _decode(recorded: dict[str, Any]) -> BaseMessage:
    return messages_from_dict([recorded])[0]


def _zeroed(message: BaseMessage) -> BaseMessage:
    if isinstance(message, AIMessage):
        message.usage_metadata = None
    return message


def _tokens(message: BaseMessage) -> int:
    usage = getattr(message, "usage_metadata", None) or {}
    return int(usage.get("total_tokens") or 0)


def model_node(model: Any, *, ctx: TaskContext | None = None, action: str = "llm.invoke",
               usage_limit: str | None = None) -> Callable[[Any], Any]:
    """A graph node that invokes ``model`` (a chat model, or any runnable answering a message list
    with a message) on the state's messages, as a ``read_only`` ledger entry; with ``usage_limit``,
    each message's token usage (``usage_metadata``) is charged to that limit (``ctx.consume``)."""
    limit = None if usage_limit is None else check_name("usage_limit", usage_limit)

    def call_model(state: Any) -> dict[str, Any]:
        messages = _messages(state)
        task_ctx = running_context(ctx)
        if task_ctx is None:
            return {"messages": [model.invoke(messages)]}
        view = stable_view([message_to_dict(m) for m in messages], _VOLATILE)
        used = UsageSeen(_tokens)
        answer = Tool(task_ctx, lambda _view: model.invoke(messages), action=action, effect="read_only",
                      encode=message_to_dict, decode=used.of(_decode),
                      decode_replayed=used.of(_decode, then=_zeroed))(view)
        if limit is not None:
            task_ctx.consume_blocking(limit, used.units)
        return {"messages": [answer]}

    return call_model


def tools_condition(state: Any) -> str:
    """``"tools"`` when the last message asks for tool calls, else ``END``."""
    last = _messages(state)[-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


class LeaseqToolNode:
    """A graph node that runs the tool calls of the last AI message, each a ledger entry keyed by its id.

    ``effects`` maps tool names to their class; unlisted tools are
    ``default`` (``side_effect``). The action of a call is the tool's name.
    A tool's result is recorded in its JSON form and becomes the
    ``ToolMessage`` content (a string stays a string).
    """

    def __init__(self, tools: Iterable[BaseTool], *, effects: Mapping[str, str] | None = None,
                 default: str = "side_effect", ctx: TaskContext | None = None):
        self.tools = {t.name: t for t in tools}
        for t in self.tools.values():
            if not isinstance(t, BaseTool):
                raise InvalidInput("tools", f"must be LangChain tools (got {t!r})")
        self.classes = ToolClasses(effects, default)
        self._ctx = ctx

    def __call__(self, state: Any) -> dict[str, Any]:
        last = _messages(state)[-1]
        calls = last.tool_calls if isinstance(last, AIMessage) else []
        task_ctx = running_context(self._ctx)
        out = []
        for call in calls:  # in the model's order: the ledger records them the same way every attempt
            tool = self.tools.get(call["name"])
            if tool is None:
                out.append(ToolMessage(content=f"Error: {call['name']!r} is not a tool here", name=call["name"],
                                       tool_call_id=call["id"], status="error"))
                continue
            if task_ctx is None:
                result = tool.invoke(call["args"])
            else:
                ledgered = Tool(task_ctx, lambda args, _t=tool: _t.invoke(args), action=tool.name,
                                effect=self.classes(tool.name), encode=pydantic_core.to_jsonable_python)
                call_id = call.get("id")
                result = (ledgered.keyed(call_id) if call_id else ledgered)(call["args"])
            content = result if isinstance(result, str) else json.dumps(pydantic_core.to_jsonable_python(result))
            out.append(ToolMessage(content=content, name=tool.name, tool_call_id=call["id"]))
        return {"messages": out}


def _resumable(graph: Any, config: Mapping[str, Any] | None, task_ctx: TaskContext) -> tuple[Any, dict[str, Any]]:
    """The graph with a checkpointer of this attempt's own (interrupts need one to resume; the ledger,
    not a checkpoint, carries a run across attempts) and the config naming its thread."""
    copy = graph.copy(update={"checkpointer": InMemorySaver()})
    given = dict(config or {})
    configurable = {**given.get("configurable", {}), "thread_id": f"leaseq:{task_ctx.task_id}"}
    return copy, {**given, "configurable": configurable}


def _interrupts(graph: Any, config: dict[str, Any]) -> list[Any]:
    return list(graph.get_state(config).interrupts)


def invoke(graph: Any, input: Any, config: Mapping[str, Any] | None = None, *, ctx: TaskContext | None = None,
           timeout: float | None = None, **options: Any) -> Any:
    """``graph.invoke(input, config, **options)``, with each ``interrupt`` a durable wait for a person.

    In a leaseq handler the graph runs with a checkpointer of the attempt's own; when
    it stops on interrupts, each (in the order LangGraph lists them) waits durably for
    the signal ``interrupt`` (:meth:`leaseq.TaskContext.wait_for_signal`), and the graph
    resumes with the payloads (``Command(resume=...)``), until it ends without one.
    Until a signal comes the attempt ends, with no lease and no slot; the next attempt
    replays the graph from the ledger and gets the recorded payloads. With ``timeout``
    (seconds) an interrupt no signal reached in time resumes with None. Outside a
    handler: ``graph.invoke``.
    """
    task_ctx = running_context(ctx)
    if task_ctx is None:
        return graph.invoke(input, config, **options)
    runnable, run_config = _resumable(graph, config, task_ctx)
    result = runnable.invoke(input, run_config, **options)
    while pending := _interrupts(runnable, run_config):
        resume = {i.id: task_ctx.wait_for_signal_blocking(INTERRUPT_SIGNAL, timeout=timeout, default=None)
                  for i in pending}
        result = runnable.invoke(Command(resume=resume), run_config, **options)
    return result


async def ainvoke(graph: Any, input: Any, config: Mapping[str, Any] | None = None, *,
                  ctx: TaskContext | None = None, timeout: float | None = None, **options: Any) -> Any:
    """:func:`invoke` for async code: ``await graph.ainvoke(...)``, each interrupt awaited durably."""
    task_ctx = running_context(ctx)
    if task_ctx is None:
        return await graph.ainvoke(input, config, **options)
    runnable, run_config = _resumable(graph, config, task_ctx)
    result = await runnable.ainvoke(input, run_config, **options)
    while pending := await _ainterrupts(runnable, run_config):
        resume = {i.id: await task_ctx.await_for_signal(INTERRUPT_SIGNAL, timeout=timeout, default=None)
                  for i in pending}
        result = await runnable.ainvoke(Command(resume=resume), run_config, **options)
    return result


async def _ainterrupts(graph: Any, config: dict[str, Any]) -> list[Any]:
    return list((await graph.aget_state(config)).interrupts)
