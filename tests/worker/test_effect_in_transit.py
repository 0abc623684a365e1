"""A ledger write that fails in transit is tried again while the lease may be live, never charged to the task.

The queue's trouble (the database unreachable, failing over to a standby,
the service restarting) must not read as the handler's failure: before,
a BackendUnavailable from ``begin_effect`` or ``fx.record`` propagated out
of the handler, and a side-effect task went to ``needs_reconciliation``, an
idempotent one was retried. The transports here are the real queue, failing
some calls in transit: before they reach it, or after it committed (the
answer lost, as when the connection drops at COMMIT).
"""

from __future__ import annotations

import asyncio

import pytest

import leaseq
from leaseq.worker import WorkerRuntime
from leaseq.worker.transport import worker_port


class InTransit:
    """The real queue; ``failures[op]`` calls of begin_effect / finish_effect fail in transit,
    half of them after the queue committed the write (its answer lost on the way back)."""

    def __init__(self, queue: leaseq.Queue, failures: dict[str, int]):
        self._queue = worker_port(queue)
        self.failures = dict(failures)
        self.calls: dict[str, int] = {"begin_effect": 0, "finish_effect": 0}

    def __getattr__(self, name: str):
        return getattr(self._queue, name)

    def _fails(self, op: str) -> str | None:
        """"before" or "after" when this call fails in transit, else None."""
        self.calls[op] += 1
        if self.failures.get(op, 0) <= 0:
            return None
        self.failures[op] -= 1
        return "after" if self.failures[op] % 2 else "before"

    def _lost(self, op: str) -> leaseq.BackendUnavailable:
        return leaseq.BackendUnavailable(f"{op}: the connection dropped (test)")

    async def begin_effect(self, *args, **kwargs):
        when = self._fails("begin_effect")
        if when == "before":
            raise self._lost("begin_effect")
        effect = await self._queue.begin_effect(*args, **kwargs)
        if when == "after":
            raise self._lost("begin_effect")
        return effect

    async def finish_effect(self, *args, **kwargs):
        when = self._fails("finish_effect")
        if when == "before":
            raise self._lost("finish_effect")
        effect = await self._queue.finish_effect(*args, **kwargs)
        if when == "after":
            raise self._lost("finish_effect")
        return effect


def run(app: leaseq.App, transport: InTransit) -> leaseq.worker.WorkerStats:
    runtime = WorkerRuntime(app, transport, concurrency=1, poll_interval=0.05)
    return asyncio.run(runtime.run(until_idle=True))


@pytest.mark.parametrize("style", ["sync", "async"])
def test_ledger_writes_failing_in_transit_are_retried_and_the_task_completes_once(app: leaseq.App, style) -> None:
    if style == "sync":
        @app.task("charge", effect="side_effect", lease_seconds=5)
        def charge(ctx, n: int) -> dict:
            with ctx.effect("bank.charge", key="c") as fx:
                fx.record({"charged": n, "token": fx.fencing_token})
            return {"n": n}
    else:
        @app.task("charge", effect="side_effect", lease_seconds=5)
        async def charge(ctx, n: int) -> dict:
            async with ctx.effect("bank.charge", key="c") as fx:
                await fx.arecord({"charged": n, "token": fx.fencing_token})
            return {"n": n}

    task = charge.enqueue(n=7)
    # two failures each: one before the write, one after it committed
    transport = InTransit(app.queue, {"begin_effect": 2, "finish_effect": 2})
    stats = run(app, transport)
    done = app.queue.get(task.id)
    assert (done.status, done.attempts, done.result) == ("completed", 1, {"n": 7}), done.last_error
    assert stats.failed == 0 and stats.lost == 0 and stats.completed == 1
    assert transport.calls == {"begin_effect": 3, "finish_effect": 3}
    [effect] = app.queue.effects(task.id)
    assert (effect.status, effect.response["charged"]) == ("done", 7)


def test_a_ledger_write_that_cannot_be_made_within_the_lease_ends_the_attempt_as_a_lost_lease(
        app: leaseq.App) -> None:
    @app.task("charge", effect="idempotent", lease_seconds=0.5, max_attempts=1)
    def charge(ctx) -> str:
        with ctx.effect("bank.charge", key="c") as fx:
            fx.record("charged")
        return "done"

    task = charge.enqueue()
    transport = InTransit(app.queue, {"begin_effect": 1000})   # the database never comes back for it
    stats = run(app, transport)
    # Not the handler's failure: no failure recorded, the attempt ended as a lost lease, and the
    # recovery policy routed the expired lease (one attempt allowed: dead, "lease expired").
    assert stats.failed == 0 and stats.lost == 1
    assert transport.calls["begin_effect"] > 2
    assert [e.type for e in app.queue.events(task.id) if e.type == "failed"] == []
    ended = app.queue.get(task.id)
    assert "BackendUnavailable" not in (ended.last_error or ""), ended.last_error
