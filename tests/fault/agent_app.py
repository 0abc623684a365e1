"""An agent task for the process-level tool-call tests, written once per framework.

Run as ``python -m tests.fault.agent_app`` with $LEASEQ_DSN, $FENCE_DSN,
$FAULT_DIR and $AGENT (plain, pydantic_ai, openai_agents, langgraph). Every
variant makes the same five calls, in this order:

1. a model request (read_only), answered with three tool calls;
2. ``save_note`` (idempotent);
3. ``charge`` (side effect through a FencedStore);
4. ``send_receipt`` (side effect through a FencedStore);
5. a second model request (read_only), answered with the final text.

Each real model request, tool run and downstream write appends a line to a
file in $FAULT_DIR, so the test counts what really happened across processes.
$HOLD_AFTER / $HOLD_BEFORE name an action: the first attempt stops for good
right after that call's response is recorded, or after the call but before
its response is recorded, and says so in ``held-<task id>`` (the test then
SIGKILLs the process).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import leaseq
from leaseq.fencing import FencedStore
from leaseq.worker import WorkerRuntime
from leaseq.worker.transport import worker_port
from leaseq.worker.tools import current_context

FAULT_DIR = Path(os.environ.get("FAULT_DIR", "."))
AGENT = os.environ.get("AGENT", "plain")
app = leaseq.App()  # $LEASEQ_DSN
_fence: FencedStore | None = None
_fence_lock = threading.Lock()


def count(name: str, task_id: int) -> None:
    """One line per real occurrence, written by whichever process made it."""
    with open(FAULT_DIR / f"{name}-{task_id}.log", "a") as f:
        f.write(f"{os.getpid()}\n")


def fence() -> FencedStore:
    global _fence
    with _fence_lock:
        if _fence is None:
            _fence = FencedStore(os.environ["FENCE_DSN"])
        return _fence


# -- the downstream world ------------------------------------------------------

def save_note(text: str) -> dict[str, Any]:
    """Save a note on the order (idempotent)."""
    ctx = current_context.get()
    count("save_note", ctx.task_id)
    return {"saved": text}


def _fenced(action: str, resource: str, value: dict[str, Any]) -> dict[str, Any]:
    ctx = current_context.get()
    count(action, ctx.task_id)

    def write(conn: Any) -> dict[str, Any]:
        count(f"applied-{action}", ctx.task_id)
        return value

    outcome = fence().apply(f"{resource}:{ctx.task_id}", f"{ctx.task_id}.{ctx.generation}", write,
                            idempotency_key=f"{ctx.task.idempotency_key}:{action}")
    return dict(outcome)


def charge(amount: int) -> dict[str, Any]:
    """Charge the customer (a side effect)."""
    return _fenced("charge", "account", {"charged": amount})


def send_receipt(to: str) -> dict[str, Any]:
    """Send the receipt (a side effect)."""
    return _fenced("send_receipt", "mailbox", {"sent_to": to})


TOOL_CALLS = [("save_note", {"text": "refund approved"}, "call_1"), ("charge", {"amount": 5}, "call_2"),
              ("send_receipt", {"to": "a@example.com"}, "call_3")]
EFFECTS = {"save_note": "idempotent", "charge": "side_effect", "send_receipt": "side_effect"}
FINAL = "refunded 5 and sent the receipt"


def model_turn(task_id: int, answered: bool) -> str | list[tuple[str, dict[str, Any], str]]:
    """The scripted model: three tool calls first, then the final text."""
    count("model", task_id)
    return FINAL if answered else TOOL_CALLS


# -- the agent, once per framework ----------------------------------------------

async def run_plain(ctx: leaseq.TaskContext) -> str:
    model = ctx.tool(lambda answered: model_turn(ctx.task_id, answered), action="llm.request", effect="read_only")
    tools = {name: ctx.tool(fn, action=name, effect=EFFECTS[name])
             for name, fn in (("save_note", save_note), ("charge", charge), ("send_receipt", send_receipt))}
    calls = await asyncio.to_thread(model, False)
    for name, args, call_id in calls:
        await asyncio.to_thread(tools[name].keyed(call_id), **args)
    return await asyncio.to_thread(model, True)


def build_pydantic_ai() -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_ai.usage import RequestUsage

    from leaseq.integrations.pydantic_ai import LeaseqModel, LeaseqToolset

    def respond(messages: list[Any], info: Any) -> ModelResponse:
        answered = any(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", []))
        turn = model_turn(current_context.get().task_id, answered)
        usage = RequestUsage(input_tokens=100, output_tokens=10)
        if isinstance(turn, str):
            return ModelResponse(parts=[TextPart(turn)], usage=usage)
        return ModelResponse(parts=[ToolCallPart(n, a, tool_call_id=i) for n, a, i in turn], usage=usage)

    toolset = FunctionToolset()
    for fn in (save_note, charge, send_receipt):
        toolset.add_function(fn, takes_ctx=False)
    agent = Agent(LeaseqModel(FunctionModel(respond)), toolsets=[LeaseqToolset(toolset, effects=EFFECTS)])

    async def run(ctx: leaseq.TaskContext) -> str:
        result = await agent.run("refund order 7")
        return result.output

    return run


def build_openai_agents() -> Any:
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from leaseq.integrations.openai_agents import LeaseqModel, ledgered_tools

    set_tracing_disabled(True)

    class ScriptedModel(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            answered = not isinstance(input, str) and any(
                (i.get("type") if isinstance(i, dict) else getattr(i, "type", None)) == "function_call_output"
                for i in input)
            turn = model_turn(current_context.get().task_id, answered)
            usage = Usage(requests=1, input_tokens=100, output_tokens=10, total_tokens=110)
            if isinstance(turn, str):
                out: list[Any] = [ResponseOutputMessage(
                    type="message", id="msg_1", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text=turn, annotations=[])])]
            else:
                out = [ResponseFunctionToolCall(type="function_call", name=n, arguments=json.dumps(a), call_id=i,
                                                id=f"fc_{i}", status="completed") for n, a, i in turn]
            return ModelResponse(output=out, usage=usage, response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    tools = ledgered_tools([function_tool(save_note), function_tool(charge), function_tool(send_receipt)],
                           effects=EFFECTS)
    agent = Agent(name="refunds", model=LeaseqModel(ScriptedModel()), tools=tools)

    async def run(ctx: leaseq.TaskContext) -> str:
        return (await Runner.run(agent, "refund order 7")).final_output

    return run


def build_langgraph() -> Any:
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph

    from leaseq.integrations.langgraph import LeaseqToolNode, model_node, tools_condition

    class ScriptedChatModel:
        """A hand-written model with the chat model's invoke(messages) -> AIMessage."""

        def invoke(self, messages: list[Any]) -> AIMessage:
            answered = any(isinstance(m, ToolMessage) for m in messages)
            turn = model_turn(current_context.get().task_id, answered)
            usage = {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}
            if isinstance(turn, str):
                return AIMessage(content=turn, usage_metadata=usage)
            return AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in turn],
                             usage_metadata=usage)

    graph = StateGraph(MessagesState)
    graph.add_node("model", model_node(ScriptedChatModel()))
    graph.add_node("tools", LeaseqToolNode([tool(save_note), tool(charge), tool(send_receipt)], effects=EFFECTS))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    agent = graph.compile()

    def run(ctx: leaseq.TaskContext) -> str:
        return agent.invoke({"messages": [("user", "refund order 7")]})["messages"][-1].content

    return run


RUNNERS = {"plain": lambda: run_plain, "pydantic_ai": build_pydantic_ai, "openai_agents": build_openai_agents,
           "langgraph": build_langgraph}
run_agent = RUNNERS[AGENT]()

if AGENT == "langgraph":
    @app.task("refund", effect="side_effect", lease_seconds=1.0, max_attempts=3)
    def refund(ctx: leaseq.TaskContext) -> str:
        return run_agent(ctx)
else:
    @app.task("refund", effect="side_effect", lease_seconds=1.0, max_attempts=3)
    async def refund(ctx: leaseq.TaskContext) -> str:  # type: ignore[misc]
        return await run_agent(ctx)


class HoldingTransport:
    """The queue, except that the first attempt stops for good at the chosen point."""

    def __init__(self, queue: leaseq.Queue):
        self._queue = worker_port(queue)
        self.capabilities = queue.capabilities

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    def _held(self, claim: leaseq.Claim, action: str, point: str) -> bool:
        if claim.generation == 1 and os.environ.get(point) == action:
            (FAULT_DIR / f"held-{claim.task_id}").write_text(str(os.getpid()))
            return True
        return False

    async def finish_effect(self, worker: Any, claim: leaseq.Claim, effect: Any, response: Any = None) -> Any:
        if self._held(claim, effect.action, "HOLD_BEFORE"):
            await asyncio.Event().wait()  # until SIGKILL
        done = await self._queue.finish_effect(worker, claim, effect, response)
        if self._held(claim, effect.action, "HOLD_AFTER"):
            await asyncio.Event().wait()
        return done


if __name__ == "__main__":
    runtime = WorkerRuntime(app, connect=lambda: HoldingTransport(app.queue), concurrency=1,
                            name=f"agent-{os.getpid()}", poll_interval=0.05, grace=1.0)
    asyncio.run(runtime.run())
