"""A worker process for tests/fault/test_durable_waits.py: handlers that wait durably.

``HOLD_AFTER_SIGNAL=1``: a handler stops after its signal wait returned (the signal
consumed and recorded) and before its next step, holding its lease, for the test to
SIGKILL the process there; ``HOLD_AFTER_ANSWER=1`` the same after ``ctx.ask`` returned. Each real step appends a line to ``$FAULT_DIR/<step>-<task>.log``.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import leaseq
from leaseq.worker import WorkerRuntime

app = leaseq.App()  # $LEASEQ_DSN
FAULT_DIR = Path(os.environ["FAULT_DIR"])


def count(name: str, task_id: int) -> None:
    with open(FAULT_DIR / f"{name}-{task_id}.log", "a") as out:
        out.write(f"{os.getpid()}\n")


@app.task("approve_refund", effect="side_effect", max_attempts=3)
def approve_refund(ctx: leaseq.TaskContext, amount: int) -> dict[str, Any]:
    count("began", ctx.task_id)
    verdict = ctx.wait_for_signal("verdict")
    count("received", ctx.task_id)
    if os.environ.get("HOLD_AFTER_SIGNAL"):
        (FAULT_DIR / f"held-{ctx.task_id}").write_text(str(os.getpid()))
        time.sleep(3600)  # killed here: the signal is consumed, the next step not begun

    def refund(n: int) -> dict[str, Any]:
        count("refunded", ctx.task_id)
        return {"refunded": n}

    done = ctx.tool(refund, action="payments.refund", effect="side_effect")(amount)
    return {"verdict": verdict, **done}


class Decision(BaseModel):
    approve: bool
    note: str = ""


@app.task("expense", effect="side_effect", max_attempts=3)
def expense(ctx: leaseq.TaskContext, amount: int) -> dict[str, Any]:
    def lookup(n: int) -> dict[str, Any]:
        count("looked_up", ctx.task_id)
        return {"amount": n, "budget": 1000}

    found = ctx.tool(lookup, action="budget.lookup", effect="read_only")(amount)
    count("asking", ctx.task_id)
    decision = ctx.ask(f"Pay an expense of {found['amount']} (budget {found['budget']})?", schema=Decision)
    assert isinstance(decision, Decision)
    count("answered", ctx.task_id)
    if os.environ.get("HOLD_AFTER_ANSWER"):
        (FAULT_DIR / f"held-{ctx.task_id}").write_text(str(os.getpid()))
        time.sleep(3600)  # killed here: the answer is consumed, the payment not begun

    def pay(n: int) -> dict[str, Any]:
        count("paid", ctx.task_id)
        return {"paid": n}

    done = ctx.tool(pay, action="payments.pay", effect="side_effect")(amount) if decision.approve else {"paid": 0}
    return {"approve": decision.approve, "note": decision.note, **done}


@app.task("nap", max_attempts=1)
async def nap(ctx: leaseq.TaskContext, seconds: float) -> str:
    count("began", ctx.task_id)
    await ctx.sleep(seconds)
    count("woke", ctx.task_id)
    return "rested"


if __name__ == "__main__":
    runtime = WorkerRuntime(app, app.queue, concurrency=2, name=f"waits-{os.getpid()}", poll_interval=0.05,
                            grace=1.0)
    asyncio.run(runtime.run())
