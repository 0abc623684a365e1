"""A worker process for tests/fault/test_children.py: a parent that spawns a child and waits for it.

``HOLD_AFTER_SPAWN=1``: the parent stops after its spawn returned (the child and the ledger
entry committed) and before its wait, holding its lease, for the test to SIGKILL the process
there. Each real step appends a line to ``$FAULT_DIR/<step>-<task>.log``.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import leaseq
from leaseq.worker import WorkerRuntime

app = leaseq.App()  # $LEASEQ_DSN
FAULT_DIR = Path(os.environ["FAULT_DIR"])


def count(name: str, task_id: int) -> None:
    with open(FAULT_DIR / f"{name}-{task_id}.log", "a") as out:
        out.write(f"{os.getpid()}\n")


@app.task("orchestrate", max_attempts=3)
def orchestrate(ctx: leaseq.TaskContext, n: int) -> dict[str, Any]:
    count("began", ctx.task_id)
    handle = ctx.spawn("piece", {"n": n}, key="piece")
    count("spawned", ctx.task_id)
    if os.environ.get("HOLD_AFTER_SPAWN"):
        (FAULT_DIR / f"held-{ctx.task_id}").write_text(str(handle.id))
        time.sleep(3600)  # killed here: the child is written, the wait not begun
    return {"piece": ctx.wait_for(handle), "child": handle.id}


@app.task("piece", queue="pieces")
def piece(ctx: leaseq.TaskContext, n: int) -> int:
    count("piece", ctx.task_id)
    return n * 10


if __name__ == "__main__":
    queues = os.environ.get("QUEUES", "default,pieces").split(",")
    runtime = WorkerRuntime(app, app.queue, concurrency=2, name=f"children-{os.getpid()}", poll_interval=0.05,
                            grace=1.0, queues=queues)
    asyncio.run(runtime.run())
