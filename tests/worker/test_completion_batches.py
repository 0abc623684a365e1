"""Batched completions: a full batch waiting behind one in flight goes out beside it.

Real queues on both backends; the batched completion waits at a gate in front
of the real queue where a batch must be held in flight (see test_outcomes).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time

import leaseq
from leaseq.worker.completer import BATCH_LIMIT, BATCHES_IN_FLIGHT

from .conftest import RunningWorker, wait_for
from .test_outcomes import GatedCompletions


def test_full_batches_go_out_beside_the_one_in_flight_up_to_the_limit(app: leaseq.App) -> None:
    first, rest = threading.Event(), threading.Event()
    extra = (BATCHES_IN_FLIGHT + 1) * BATCH_LIMIT  # one batch's worth more than may be in flight
    # SQLite writes one at a time: a batch beside another would only wait for it there
    in_flight = 1 if app.queue.capabilities.serial_writes else BATCHES_IN_FLIGHT

    @app.task("job", max_attempts=1, lease_seconds=60)
    async def job(ctx, n: int) -> int:
        await asyncio.to_thread((first if n == 0 else rest).wait, 20)
        return n

    app.queue.enqueue_many("job", [{"n": n} for n in range(1 + extra)])
    transport = GatedCompletions(app.queue)
    running = RunningWorker(app.worker(transport=transport, concurrency=1 + extra, poll_interval=0.05))
    runtime = running.runtime
    try:
        wait_for(lambda: runtime.stats.claimed == 1 + extra)
        first.set()
        wait_for(lambda: len(transport.batches) == 1)  # the first task's completion, alone, held in flight
        rest.set()
        # Full batches waiting behind it are sent beside it, never more than the limit at once.
        wait_for(lambda: len(transport.batches) == in_flight and len(runtime.completer._pending) == extra
                 - (in_flight - 1) * BATCH_LIMIT)
        time.sleep(0.2)  # nothing more goes out while the gate holds them
        assert [len(b) for b in transport.batches[1:]] == [BATCH_LIMIT] * (in_flight - 1)
        assert len(transport.batches) == in_flight  # the rest wait for a batch to come back
        transport.gate.set()
        wait_for(lambda: runtime.stats.completed == 1 + extra)
    finally:
        first.set()
        rest.set()
        transport.gate.set()
        running.stop()
    sent = [task_id for batch in transport.batches for task_id in batch]
    assert len(sent) == len(set(sent)) == 1 + extra  # each completion sent once
    assert max(len(b) for b in transport.batches) <= BATCH_LIMIT
    assert all(app.queue.get(task_id).status == "completed" for task_id in sent)


RUNS, TASKS = 10, 200


def test_a_completion_that_comes_as_a_batch_writer_finishes_is_never_stranded(app: leaseq.App) -> None:
    """Handlers end at scattered moments, one batch writer after another finishing; run
    after run, every completion is written (none left waiting with no writer to take it)."""
    rng = random.Random(7)

    @app.task("job", max_attempts=1, lease_seconds=60)
    async def job(ctx, delay: float) -> None:
        await asyncio.sleep(delay)

    for run in range(RUNS):
        tasks = app.queue.enqueue_many("job", [{"delay": rng.uniform(0, 0.02)} for _ in range(TASKS)])
        runtime = app.worker(concurrency=50, poll_interval=0.05)

        async def drain(runtime=runtime) -> None:
            await asyncio.wait_for(runtime.run(until_idle=True), 10)

        asyncio.run(drain())  # a stranded completion keeps its task running: the run times out
        left = [task_id for task_id in tasks if app.queue.get(task_id).status != "completed"]
        assert not left, f"run {run}: {len(left)} tasks never completed"
        assert runtime.stats.completed == TASKS
