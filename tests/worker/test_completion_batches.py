"""Batched completions: one batch on its way at a time, each no larger than the service takes.

Real queues on both backends; the batched completion waits at a gate in front
of the real queue where a batch must be held in flight (see test_outcomes).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time

import leaseq

from .conftest import RunningWorker, wait_for
from .test_outcomes import GatedCompletions


def test_completions_beyond_a_batch_wait_for_the_next_one_in_flight(app: leaseq.App) -> None:
    # A batch carries at most batch_limit completions (the service refuses a larger
    # request); the rest wait behind it, one batch on its way at a time.
    first, rest = threading.Event(), threading.Event()
    limit, extra = 8, 20

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
        runtime.completer.batch_limit = limit
        first.set()
        wait_for(lambda: len(transport.batches) == 1)  # the first task's completion, alone, held in flight
        rest.set()
        wait_for(lambda: len(runtime.completer._pending) == extra)
        time.sleep(0.2)
        assert len(transport.batches) == 1  # nothing more goes out while that batch is on its way
        transport.gate.set()
        wait_for(lambda: runtime.stats.completed == 1 + extra)
    finally:
        first.set()
        rest.set()
        transport.gate.set()
        running.stop()
    assert [len(b) for b in transport.batches] == [1, limit, limit, extra - 2 * limit]
    sent = [task_id for batch in transport.batches for task_id in batch]
    assert len(sent) == len(set(sent)) == 1 + extra  # each completion sent once
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


def test_a_batch_is_never_larger_than_the_service_takes() -> None:
    from leaseq.service.worker_batch import MAX_BATCH
    from leaseq.worker.completer import BATCH_LIMIT

    assert BATCH_LIMIT <= MAX_BATCH
