"""The framework adapters, offline, on both backends: each framework's own test
model or a hand-written model of its interface, no network.

Each test runs an agent as two attempts of one task (the first attempt's
lease is given up after the run, as if its worker died before completing):
the second attempt replays every model request and tool call, reports no
token usage for replayed requests, and records parallel tool calls in the
order the model emitted them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

import leaseq
from leaseq.worker import tools
from leaseq.worker.context import TaskContext

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})
EFFECTS = {"lookup": "read_only", "save_note": "idempotent", "refund": "side_effect"}
CALLS = [("lookup", {"order": 7}, "call_c"), ("save_note", {"text": "ok"}, "call_a"),
         ("refund", {"amount": 5}, "call_b")]


class World:
    def __init__(self) -> None:
        self.ran: list[str] = []
        self.model_calls = 0

    def lookup(self, order: int) -> dict[str, Any]:
        """Look an order up."""
        self.ran.append("lookup")
        return {"order": order, "total": 5}

    def save_note(self, text: str) -> str:
        """Save a note."""
        self.ran.append("save_note")
        return f"saved {text}"

    def refund(self, amount: int) -> dict[str, Any]:
        """Refund the customer."""
        self.ran.append("refund")
        return {"refunded": amount}


def attempts(q: leaseq.Queue, run: Any, *, n: int = 2) -> tuple[leaseq.Task, list[Any]]:
    """Run ``run(ctx)`` as ``n`` attempts of one task; return the task and each attempt's answer."""
    w = q.register_worker("w")
    task = q.enqueue("agent", {}, effect="side_effect", idempotency_key="agent-1", max_attempts=5)
    answers = []
    for _ in range(n):
        [claim] = q.claim(w)
        ctx = TaskContext(q, w, claim, LOG)
        token = tools.current_context.set(ctx)
        try:
            answers.append(run(ctx))
        finally:
            tools.current_context.reset(token)
        q.fail(w, claim, "worker died before completing", delay=0)
    return task, answers


def check_replayed(q: leaseq.Queue, task: leaseq.Task, world: World, model_action: str) -> None:
    assert world.ran == ["lookup", "save_note", "refund"] and world.model_calls == 2  # nothing ran twice
    entries = q.effects(task.id)
    keyed = [e.idempotency_key.split(":", 2)[2] for e in entries if e.action != model_action]
    assert keyed == ["call_c", "call_a", "call_b"]  # the model's order, not the ids' order
    assert [e.effect for e in entries if e.action != model_action] == ["read_only", "idempotent", "side_effect"]
    replayed = [e for e in q.events(task.id) if e.type == "tool_replayed"]
    assert len(replayed) == len(entries) == 5 and {e.generation for e in replayed} == {2}


def test_pydantic_ai(q: leaseq.Queue) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_ai.usage import RequestUsage

    from leaseq.integrations.pydantic_ai import LeaseqModel, LeaseqToolset

    world = World()

    def respond(messages: list[Any], info: Any) -> ModelResponse:
        world.model_calls += 1
        usage = RequestUsage(input_tokens=100, output_tokens=10)
        if any(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", [])):
            return ModelResponse(parts=[TextPart("refunded")], usage=usage)
        return ModelResponse(parts=[ToolCallPart(n, a, tool_call_id=i) for n, a, i in CALLS], usage=usage)

    toolset = FunctionToolset([world.lookup, world.save_note, world.refund])
    agent = Agent(LeaseqModel(FunctionModel(respond)), toolsets=[LeaseqToolset(toolset, effects=EFFECTS)])
    task, answers = attempts(q, lambda ctx: agent.run_sync("refund order 7"))
    assert [a.output for a in answers] == ["refunded", "refunded"]
    assert answers[0].usage.input_tokens == 200 and answers[1].usage.input_tokens == 0  # reported once
    check_replayed(q, task, world, "llm.request")
    # outside a handler both wrappers call straight through
    assert agent.run_sync("refund order 7").output == "refunded" and world.model_calls == 4


def test_pydantic_ai_with_its_test_model(q: leaseq.Queue) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.toolsets import FunctionToolset

    from leaseq.integrations.pydantic_ai import LeaseqModel, LeaseqToolset

    world = World()
    agent = Agent(LeaseqModel(TestModel()),
                  toolsets=[LeaseqToolset(FunctionToolset([world.lookup, world.save_note]), effects=EFFECTS)])
    task, answers = attempts(q, lambda ctx: agent.run_sync("go").output)
    assert answers[0] == answers[1] and sorted(world.ran) == ["lookup", "save_note"]


def test_openai_agents(q: leaseq.Queue) -> None:
    pytest.importorskip("agents")
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from leaseq.integrations.openai_agents import LeaseqModel, ledgered_tools

    set_tracing_disabled(True)
    world = World()

    class ScriptedModel(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            world.model_calls += 1
            usage = Usage(requests=1, input_tokens=100, output_tokens=10, total_tokens=110)
            if not isinstance(input, str) and any(
                    (i.get("type") if isinstance(i, dict) else i.type) == "function_call_output" for i in input):
                return ModelResponse(output=[ResponseOutputMessage(
                    type="message", id="msg_1", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text="refunded", annotations=[])])],
                    usage=usage, response_id=None)
            return ModelResponse(output=[ResponseFunctionToolCall(
                type="function_call", name=n, arguments=json.dumps(a), call_id=i, id=f"fc_{i}", status="completed")
                for n, a, i in CALLS], usage=usage, response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    agent = Agent(name="refunds", model=LeaseqModel(ScriptedModel()),
                  tools=ledgered_tools([function_tool(world.lookup), function_tool(world.save_note),
                                        function_tool(world.refund)], effects=EFFECTS))
    task, answers = attempts(q, lambda ctx: asyncio.run(Runner.run(agent, "refund order 7")))
    assert [a.final_output for a in answers] == ["refunded", "refunded"]
    assert answers[0].context_wrapper.usage.input_tokens == 200
    assert answers[1].context_wrapper.usage.input_tokens == 0  # replayed: reported once
    check_replayed(q, task, world, "llm.response")


def test_langgraph(q: leaseq.Queue) -> None:
    pytest.importorskip("langgraph")
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph

    from leaseq.integrations.langgraph import LeaseqToolNode, model_node, tools_condition

    world = World()
    script = [AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in CALLS],
                        usage_metadata={"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}),
              AIMessage(content="refunded",
                        usage_metadata={"input_tokens": 100, "output_tokens": 10, "total_tokens": 110})]

    class Counting(GenericFakeChatModel):  # the framework's own fake model, counted
        def invoke(self, *args: Any, **kwargs: Any) -> Any:
            world.model_calls += 1
            return super().invoke(*args, **kwargs)

    model = Counting(messages=iter(script))
    graph = StateGraph(MessagesState)
    graph.add_node("model", model_node(model))
    graph.add_node("tools", LeaseqToolNode([tool(world.lookup), tool(world.save_note), tool(world.refund)],
                                           effects=EFFECTS))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    agent = graph.compile()
    task, answers = attempts(q, lambda ctx: agent.invoke({"messages": [("user", "refund order 7")]}))
    assert [a["messages"][-1].content for a in answers] == ["refunded", "refunded"]
    tokens = [sum((m.usage_metadata or {}).get("input_tokens", 0) for m in a["messages"] if isinstance(m, AIMessage))
              for a in answers]
    assert tokens == [200, 0]  # replayed messages carry no usage: reported once
    check_replayed(q, task, world, "llm.invoke")


def test_tool_classes_are_checked(q: leaseq.Queue) -> None:
    pytest.importorskip("langgraph")
    from langchain_core.tools import tool

    from leaseq.integrations.langgraph import LeaseqToolNode

    world = World()
    with pytest.raises(leaseq.InvalidInput, match="effect"):
        LeaseqToolNode([tool(world.lookup)], effects={"lookup": "harmless"})


# -- token usage charged to a limit (usage_limit=, ctx.consume) ---------------------------

USAGE_LIMIT = "llm-tokens"


def check_charged(q: leaseq.Queue, task: leaseq.Task, world: World) -> None:
    """Two model responses of 110 tokens each were charged once, though two attempts ran them."""
    assert world.model_calls == 2  # the second attempt replayed both
    assert q.get(task.id).spent == {USAGE_LIMIT: 220}
    assert [(r["key"], r["units"]) for r in q.limit_spend(USAGE_LIMIT)] == [(USAGE_LIMIT, 220)]
    [row] = q.limits(USAGE_LIMIT)
    assert row["day_used"] == 220 and row["spent_today"] == 220
    consumed = [e for e in q.effects(task.id) if e.action == "leaseq.consume"]
    assert [e.response for e in consumed] == [{"limit": USAGE_LIMIT, "units": 110}] * 2
    assert {e.generation for e in consumed} == {1}  # written by the first attempt, replayed by the second


def _pydantic_agent(world: World, usage_limit: str | None) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_ai.usage import RequestUsage

    from leaseq.integrations.pydantic_ai import LeaseqModel, LeaseqToolset

    def respond(messages: list[Any], info: Any) -> ModelResponse:
        world.model_calls += 1
        usage = RequestUsage(input_tokens=100, output_tokens=10)
        if any(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", [])):
            return ModelResponse(parts=[TextPart("refunded")], usage=usage)
        return ModelResponse(parts=[ToolCallPart(n, a, tool_call_id=i) for n, a, i in CALLS], usage=usage)

    toolset = FunctionToolset([world.lookup, world.save_note, world.refund])
    return Agent(LeaseqModel(FunctionModel(respond), usage_limit=usage_limit),
                 toolsets=[LeaseqToolset(toolset, effects=EFFECTS)])


def test_pydantic_ai_charges_each_responses_tokens_to_its_limit_once(q: leaseq.Queue) -> None:
    pytest.importorskip("pydantic_ai")
    q.set_limit(USAGE_LIMIT, per_day=100_000, counts="units")
    world = World()
    agent = _pydantic_agent(world, USAGE_LIMIT)
    task, answers = attempts(q, lambda ctx: agent.run_sync("refund order 7").output)
    assert answers == ["refunded", "refunded"]
    check_charged(q, task, world)


def test_pydantic_ai_charges_a_recorded_response_its_attempt_died_before_charging(q: leaseq.Queue) -> None:
    pytest.importorskip("pydantic_ai")
    world = World()
    uncharged, charging = _pydantic_agent(world, None), _pydantic_agent(world, USAGE_LIMIT)
    runs = iter([uncharged, charging])  # the first attempt records the responses and charges nothing
    task, answers = attempts(q, lambda ctx: next(runs).run_sync("refund order 7").output)
    assert answers == ["refunded", "refunded"] and world.model_calls == 2
    consumed = [e for e in q.effects(task.id) if e.action == "leaseq.consume"]
    assert [(e.generation, e.response["units"]) for e in consumed] == [(2, 110), (2, 110)]
    assert q.get(task.id).spent == {USAGE_LIMIT: 220}


def test_openai_agents_charge_each_responses_tokens_to_its_limit_once(q: leaseq.Queue) -> None:
    pytest.importorskip("agents")
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from leaseq.integrations.openai_agents import LeaseqModel, ledgered_tools

    set_tracing_disabled(True)
    q.set_limit(USAGE_LIMIT, per_day=100_000, counts="units")
    world = World()

    class ScriptedModel(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            world.model_calls += 1
            usage = Usage(requests=1, input_tokens=100, output_tokens=10, total_tokens=110)
            if not isinstance(input, str) and any(
                    (i.get("type") if isinstance(i, dict) else i.type) == "function_call_output" for i in input):
                return ModelResponse(output=[ResponseOutputMessage(
                    type="message", id="msg_1", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text="refunded", annotations=[])])],
                    usage=usage, response_id=None)
            return ModelResponse(output=[ResponseFunctionToolCall(
                type="function_call", name=n, arguments=json.dumps(a), call_id=i, id=f"fc_{i}", status="completed")
                for n, a, i in CALLS], usage=usage, response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    agent = Agent(name="refunds", model=LeaseqModel(ScriptedModel(), usage_limit=USAGE_LIMIT),
                  tools=ledgered_tools([function_tool(world.lookup), function_tool(world.save_note),
                                        function_tool(world.refund)], effects=EFFECTS))
    task, answers = attempts(q, lambda ctx: asyncio.run(Runner.run(agent, "refund order 7")).final_output)
    assert answers == ["refunded", "refunded"]
    check_charged(q, task, world)


def test_langgraph_charges_each_messages_tokens_to_its_limit_once(q: leaseq.Queue) -> None:
    pytest.importorskip("langgraph")
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph

    from leaseq.integrations.langgraph import LeaseqToolNode, model_node, tools_condition

    q.set_limit(USAGE_LIMIT, per_day=100_000, counts="units")
    world = World()
    usage = {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}
    script = [AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in CALLS],
                        usage_metadata=usage),
              AIMessage(content="refunded", usage_metadata=usage)]

    class Counting(GenericFakeChatModel):
        def invoke(self, *args: Any, **kwargs: Any) -> Any:
            world.model_calls += 1
            return super().invoke(*args, **kwargs)

    graph = StateGraph(MessagesState)
    graph.add_node("model", model_node(Counting(messages=iter(script)), usage_limit=USAGE_LIMIT))
    graph.add_node("tools", LeaseqToolNode([tool(world.lookup), tool(world.save_note), tool(world.refund)],
                                           effects=EFFECTS))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    agent = graph.compile()
    task, answers = attempts(q, lambda ctx: agent.invoke({"messages": [("user", "refund order 7")]}))
    assert [a["messages"][-1].content for a in answers] == ["refunded", "refunded"]
    check_charged(q, task, world)


def test_a_bad_usage_limit_is_refused_naming_the_field() -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.test import TestModel

    from leaseq.integrations.pydantic_ai import LeaseqModel

    with pytest.raises(leaseq.InvalidInput) as err:
        LeaseqModel(TestModel(), usage_limit="not a key")
    assert err.value.field == "usage_limit"


# -- human in the loop: a framework's approval or interrupt is a durable wait ---------------
#
# Under a real worker on both backends: the task suspends (waiting, no lease), a signal carries
# the person's decision, and the next attempt replays the run from the ledger and goes on.

from worker.conftest import RunningWorker, app, start_worker, wait_for  # noqa: E402,F401


def suspended_without_lease(q: leaseq.Queue, *task_ids: int) -> None:
    """Each task waits for a signal, holding no lease: wait until they all do."""
    for task_id in task_ids:
        wait_for(lambda: q.get(task_id).status == "waiting", timeout=20)
        task = q.get(task_id)
        assert task.lease_owner is None and task.lease_expires_at is None
    assert sum(r["count"] for r in q.stats() if r["status"] == "running") == 0


def decided(q: leaseq.Queue, task_id: int, signal: str, by: str) -> None:
    """The task completed, having consumed ``signal`` once, recorded with its sender."""
    wait_for(lambda: q.get(task_id).status in ("completed", "dead", "failed"), timeout=20)
    assert q.get(task_id).status == "completed", q.get(task_id).last_error
    received = [e for e in q.events(task_id) if e.type == "signal_received"]
    assert [(e.detail["signal"], e.detail["sent_by"]) for e in received] == [(signal, by)]
    [entry] = [e for e in q.effects(task_id) if e.action == "leaseq.signal" and e.response.get("state") == "received"]
    assert entry.response["sent_by"] == by and entry.response["signal"] == signal


@pytest.mark.parametrize("handler", ["async", "sync"])
def test_pydantic_ai_approval_waits_durably_for_a_signal(app: leaseq.App, start_worker: Any, handler: str) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.toolsets import FunctionToolset

    from leaseq.integrations.pydantic_ai import LeaseqApprovals, LeaseqModel, LeaseqToolset

    world = World()

    def respond(messages: list[Any], info: Any) -> ModelResponse:
        world.model_calls += 1
        returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(f"done: {returns[-1].model_response_str()}")])
        return ModelResponse(parts=[ToolCallPart("refund", {"amount": 5}, tool_call_id="call_b")])

    toolset = FunctionToolset([world.refund], requires_approval=True)
    agent = Agent(LeaseqModel(FunctionModel(respond)), toolsets=[LeaseqToolset(toolset, effects=EFFECTS)],
                  capabilities=[LeaseqApprovals()])

    if handler == "async":
        @app.task("support.refund", effect="side_effect", actions=["refund"])
        async def refund(ctx: leaseq.TaskContext, ticket: str) -> str:
            return str((await agent.run(ticket)).output)
    else:  # the capability's async hook on the agent's own loop, in the handler's thread
        @app.task("support.refund", effect="side_effect", actions=["refund"])
        def refund(ctx: leaseq.TaskContext, ticket: str) -> str:
            return str(agent.run_sync(ticket).output)

    yes, no = refund.enqueue(ticket="refund order 7"), refund.enqueue(ticket="refund order 8")
    running = start_worker(concurrency=2)
    suspended_without_lease(app.queue, yes.id, no.id)
    assert world.ran == [] and world.model_calls == 2
    app.queue.signal(yes.id, "approval:call_b", {"approved": True}, by="ann")
    app.queue.signal(no.id, "approval:call_b", {"approved": False, "message": "not this one"}, by="bob")
    decided(app.queue, yes.id, "approval:call_b", "ann")
    decided(app.queue, no.id, "approval:call_b", "bob")
    running.stop()
    assert app.queue.get(yes.id).result == 'done: {"refunded":5}'
    assert app.queue.get(no.id).result == "done: not this one"
    assert world.ran == ["refund"] and world.model_calls == 4  # the first request of each replayed
    assert any(e.type == "tool_replayed" for e in app.queue.events(yes.id))


def test_openai_agents_tool_approval_waits_durably_for_a_signal(app: leaseq.App, start_worker: Any) -> None:
    pytest.importorskip("agents")
    from agents import Agent, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from leaseq.integrations.openai_agents import LeaseqModel, ledgered_tools, run

    set_tracing_disabled(True)
    world = World()

    class ScriptedModel(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            world.model_calls += 1
            outputs = [i for i in input if (i.get("type") if isinstance(i, dict) else i.type)
                       == "function_call_output"] if not isinstance(input, str) else []
            if outputs:
                last = outputs[-1]
                said = last.get("output") if isinstance(last, dict) else last.output
                return ModelResponse(output=[ResponseOutputMessage(
                    type="message", id="msg_1", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text=f"done: {said}", annotations=[])])],
                    usage=Usage(), response_id=None)
            return ModelResponse(output=[ResponseFunctionToolCall(
                type="function_call", name="refund", arguments=json.dumps({"amount": 5}), call_id="call_b",
                id="fc_call_b", status="completed")], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    agent = Agent(name="refunds", model=LeaseqModel(ScriptedModel()),
                  tools=ledgered_tools([function_tool(world.refund, needs_approval=True)], effects=EFFECTS))

    @app.task("support.refund", effect="side_effect", actions=["refund"])
    async def refund(ctx: leaseq.TaskContext, ticket: str) -> str:
        return str((await run(agent, ticket)).final_output)

    yes, no = refund.enqueue(ticket="refund order 7"), refund.enqueue(ticket="refund order 8")
    running = start_worker(concurrency=2)
    suspended_without_lease(app.queue, yes.id, no.id)
    assert world.ran == [] and world.model_calls == 2
    app.queue.signal(yes.id, "approval:call_b", True, by="ann")
    app.queue.signal(no.id, "approval:call_b", {"approved": False, "message": "not this one"}, by="bob")
    decided(app.queue, yes.id, "approval:call_b", "ann")
    decided(app.queue, no.id, "approval:call_b", "bob")
    running.stop()
    assert app.queue.get(yes.id).result == "done: {'refunded': 5}"
    assert app.queue.get(no.id).result == "done: not this one"
    assert world.ran == ["refund"] and world.model_calls == 4  # the first response of each replayed
    assert any(e.type == "tool_replayed" for e in app.queue.events(yes.id))


@pytest.mark.parametrize("handler", ["sync", "async"])
def test_langgraph_interrupt_waits_durably_for_a_signal(app: leaseq.App, start_worker: Any, handler: str) -> None:
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.runnables import RunnableLambda
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.types import interrupt

    from leaseq.integrations.langgraph import LeaseqToolNode, ainvoke, invoke, model_node

    world = World()

    def respond(messages: list[Any]) -> AIMessage:
        world.model_calls += 1
        said = [m.content for m in messages if isinstance(m, ToolMessage)]
        if said:
            return AIMessage(content=f"done: {said[-1]}")
        return AIMessage(content="", tool_calls=[{"name": "refund", "args": {"amount": 5}, "id": "call_b"}])

    def review(state: Any) -> dict[str, Any]:
        decision = interrupt({"tool_calls": state["messages"][-1].tool_calls})  # a person decides
        if decision.get("approved"):
            return {"messages": []}
        return {"messages": [AIMessage(content=f"denied: {decision.get('message')}")]}

    def route(state: Any) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("model", model_node(RunnableLambda(respond)))
    graph.add_node("review", review)
    graph.add_node("tools", LeaseqToolNode([tool(world.refund)], effects=EFFECTS))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, {"tools": "review", END: END})
    graph.add_conditional_edges("review", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    agent = graph.compile()

    if handler == "sync":
        @app.task("support.refund", effect="side_effect", actions=["refund"])
        def refund(ctx: leaseq.TaskContext, ticket: str) -> str:  # the blocking wait
            return str(invoke(agent, {"messages": [("user", ticket)]})["messages"][-1].content)
    else:
        @app.task("support.refund", effect="side_effect", actions=["refund"])
        async def refund(ctx: leaseq.TaskContext, ticket: str) -> str:  # the awaited wait
            return str((await ainvoke(agent, {"messages": [("user", ticket)]}))["messages"][-1].content)

    yes, no = refund.enqueue(ticket="refund order 7"), refund.enqueue(ticket="refund order 8")
    running = start_worker(concurrency=2)
    suspended_without_lease(app.queue, yes.id, no.id)
    assert world.ran == [] and world.model_calls == 2
    app.queue.signal(yes.id, "interrupt", {"approved": True}, by="ann")
    app.queue.signal(no.id, "interrupt", {"approved": False, "message": "not this one"}, by="bob")
    decided(app.queue, yes.id, "interrupt", "ann")
    decided(app.queue, no.id, "interrupt", "bob")
    running.stop()
    assert app.queue.get(yes.id).result == 'done: {"refunded": 5}'
    assert app.queue.get(no.id).result == "denied: not this one"
    assert world.ran == ["refund"] and world.model_calls == 3  # the first request of each replayed
    assert any(e.type == "tool_replayed" for e in app.queue.events(yes.id))


def test_a_decision_is_true_false_or_approved_with_a_message() -> None:
    from leaseq.integrations._common import Decision

    assert Decision.of("approval:c", True).approved and not Decision.of("approval:c", False).approved
    denied = Decision.of("approval:c", {"approved": False, "message": "no"})
    assert (denied.approved, denied.message) == (False, "no")
    assert not Decision.of("approval:c", None).approved  # no decision before the deadline: denied
    for bad in ("yes", 1, {"approved": "yes"}, {"approved": True, "args": {}}, {"approved": True, "message": 3}):
        with pytest.raises(leaseq.InvalidInput) as err:
            Decision.of("approval:c", bad)
        assert err.value.field == "payload" and "approval:c" in str(err.value)
