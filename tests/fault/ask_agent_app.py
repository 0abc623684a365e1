"""A pydantic-ai agent that asks a person before it acts, for tests/fault/test_agent_asks.py.

Run as ``python -m tests.fault.ask_agent_app`` with $LEASEQ_DSN and $FAULT_DIR. The
scripted model makes four turns: it looks the order up (``lookup_order``, read_only),
asks the manager (``ask_manager``: a tool whose body is ``ctx.ask`` with a pydantic model
for the answer, so the run ends there and waits, holding no lease), refunds if the
manager approved (``refund``, a side effect), and answers. Each real model request, tool
run and question appends a line to a file in $FAULT_DIR, so the test counts what really
happened across processes.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import RequestUsage

import leaseq
from leaseq.integrations.pydantic_ai import LeaseqModel, LeaseqToolset
from leaseq.worker import WorkerRuntime
from leaseq.worker.tools import current_context

FAULT_DIR = Path(os.environ.get("FAULT_DIR", "."))
app = leaseq.App()  # $LEASEQ_DSN


def count(name: str, task_id: int) -> None:
    with open(FAULT_DIR / f"{name}-{task_id}.log", "a") as f:
        f.write(f"{os.getpid()}\n")


class Approval(BaseModel):
    approve: bool
    amount: int
    note: str = ""


def lookup_order(order: int) -> dict[str, Any]:
    """Look the order up (read only)."""
    count("lookup_order", current_context.get().task_id)
    return {"order": order, "paid": 5}


async def ask_manager(question: str) -> dict[str, Any]:
    """Ask the manager; the run waits, holding no lease, until a person answers."""
    ctx = current_context.get()
    count("asked", ctx.task_id)
    approval = await ctx.ask(question, schema=Approval)
    count("approval", ctx.task_id)
    return approval.model_dump()


def refund(amount: int) -> dict[str, Any]:
    """Refund the customer (a side effect)."""
    count("refund", current_context.get().task_id)
    return {"refunded": amount}


def respond(messages: list[Any], info: Any) -> ModelResponse:
    """The scripted model: each turn follows from the tool results it has seen."""
    count("model", current_context.get().task_id)
    returns = {p.tool_name: p.content for m in messages for p in getattr(m, "parts", [])
               if isinstance(p, ToolReturnPart)}
    usage = RequestUsage(input_tokens=100, output_tokens=10)
    if "lookup_order" not in returns:
        call = ToolCallPart("lookup_order", {"order": 7}, tool_call_id="call_lookup")
    elif "ask_manager" not in returns:
        call = ToolCallPart("ask_manager", {"question": "Refund the 5 paid on order 7?"}, tool_call_id="call_ask")
    elif "refund" not in returns and returns["ask_manager"]["approve"]:
        call = ToolCallPart("refund", {"amount": returns["ask_manager"]["amount"]}, tool_call_id="call_refund")
    else:
        done = returns.get("refund", {}).get("refunded", 0)
        return ModelResponse(parts=[TextPart(f"refunded {done}: {returns['ask_manager']['note']}")], usage=usage)
    return ModelResponse(parts=[call], usage=usage)


toolset = FunctionToolset()
for _fn in (lookup_order, ask_manager, refund):
    toolset.add_function(_fn, takes_ctx=False)
EFFECTS = {"lookup_order": "read_only", "ask_manager": "read_only", "refund": "side_effect"}
agent = Agent(LeaseqModel(FunctionModel(respond)), toolsets=[LeaseqToolset(toolset, effects=EFFECTS)])


@app.task("support.refund", effect="side_effect", lease_seconds=1.0, max_attempts=3)
async def support_refund(ctx: leaseq.TaskContext) -> str:
    return (await agent.run("refund order 7")).output


if __name__ == "__main__":
    runtime = WorkerRuntime(app, app.queue, concurrency=1, name=f"ask-agent-{os.getpid()}", poll_interval=0.05,
                            grace=1.0)
    asyncio.run(runtime.run())
