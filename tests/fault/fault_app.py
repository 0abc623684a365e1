"""Handlers for the process-level fault tests, run by `leaseq worker tests.fault.fault_app:app`.

The test and the worker processes talk through marker files in $FAULT_DIR:
a handler writes ``reached-<generation>`` when it is where the test wants to
freeze or kill it, and the first attempt waits for ``go-<generation>``
before going on. Later attempts never wait.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import leaseq
from leaseq.fencing import FencedStore

app = leaseq.App()  # $LEASEQ_DSN
FAULT_DIR = Path(os.environ.get("FAULT_DIR", "."))
_fence: FencedStore | None = None


def fence() -> FencedStore:
    global _fence
    if _fence is None:
        _fence = FencedStore(os.environ["FENCE_DSN"])
    return _fence


def mark(name: str, text: str = "") -> None:
    tmp = FAULT_DIR / f".{name}.tmp"
    tmp.write_text(text)
    tmp.rename(FAULT_DIR / name)


def hold_first_attempt(ctx: leaseq.TaskContext, label: str) -> None:
    mark(f"reached-{label}-{ctx.generation}", str(os.getpid()))
    if ctx.generation == 1:
        while not (FAULT_DIR / f"go-{label}-1").exists():
            time.sleep(0.02)


@app.task("fenced_write", effect="idempotent", lease_seconds=1.0)
def fenced_write(ctx: leaseq.TaskContext, resource: str, value: str) -> dict:
    """Passes its lease check, records the intent, then (first attempt) waits before the downstream write."""
    gen = ctx.generation
    with ctx.effect("ledger.write") as fx:
        hold_first_attempt(ctx, "fenced")
        try:
            outcome = fence().apply(resource, fx.fencing_token, lambda conn: {"value": value, "generation": gen})
        except leaseq.StaleToken as exc:
            mark(f"stale-{gen}", str(exc))
            raise
        mark(f"applied-{gen}", json.dumps(outcome))
        fx.record(outcome)
    return {"value": value, "generation": gen}


@app.task("send_email", effect="side_effect", lease_seconds=1.0)
def send_email(ctx: leaseq.TaskContext, to: str) -> dict:
    """Records the intent to send, then (first attempt) waits: a crash here is ambiguous."""
    with ctx.effect("email.send") as fx:
        hold_first_attempt(ctx, "email")
        fx.record({"sent_to": to})
    return {"sent_to": to, "generation": ctx.generation}


@app.task("summarize", effect="read_only", lease_seconds=1.0)
def summarize(ctx: leaseq.TaskContext, doc: int) -> dict:
    """Read-only work: safe to run again after a crash."""
    hold_first_attempt(ctx, "summary")
    return {"doc": doc, "generation": ctx.generation}


@app.task("quick", effect="read_only", lease_seconds=5.0)
def quick(ctx: leaseq.TaskContext, seconds: float) -> str:
    """Finishes within a shutdown grace period."""
    mark(f"reached-quick-{ctx.generation}")
    time.sleep(seconds)
    return "finished"
