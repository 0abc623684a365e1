"""A worker process for tests/fault/test_streams.py: a handler that streams its progress.

``HOLD_AT=<n>``: the handler stops after emitting part ``n``, holding its lease, for the test
to SIGKILL the process there (``$FAULT_DIR/held-<task>`` says it got there).
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


@app.task("report", effect="idempotent", max_attempts=3)
def report(ctx: leaseq.TaskContext, parts: int) -> dict[str, Any]:
    ctx.emit({"plan": parts}, durable=True)  # recorded in the ledger: a retried attempt replays it
    for part in range(parts):
        ctx.emit({"part": part})
        if os.environ.get("HOLD_AT") == str(part):
            (FAULT_DIR / f"held-{ctx.task_id}").write_text(str(os.getpid()))
            time.sleep(3600)  # killed here, mid-stream, holding its lease
    return {"parts": parts}


if __name__ == "__main__":
    runtime = WorkerRuntime(app, app.queue, concurrency=1, name=f"streams-{os.getpid()}", poll_interval=0.05,
                            grace=1.0)
    asyncio.run(runtime.run())
