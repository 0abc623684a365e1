"""Recording outcomes and stopping cleanly: the completer, the claim loop's refusals, the start-up check.

Real queues on both backends. Where a completion must be held in flight at
a chosen moment, the batched completion waits at a gate in front of the real
queue (as the chaos proxy's black hole holds a connection).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import leaseq
from leaseq.worker import WorkerRuntime
from leaseq.worker.transport import worker_port

from .conftest import RunningWorker, wait_for


class GatedCompletions:
    """A real queue whose batched completions wait while the gate is closed."""

    def __init__(self, queue: leaseq.Queue):
        self._queue = worker_port(queue)
        self.gate = threading.Event()
        self.batches: list[list[int]] = []

    def __getattr__(self, name):
        return getattr(self._queue, name)

    async def complete_many(self, worker, done):
        self.batches.append([c.task_id for c, _ in done])
        await asyncio.to_thread(self.gate.wait, 30)
        return await self._queue.complete_many(worker, done)


def test_a_handler_cancelled_while_its_completion_is_in_flight_does_not_stop_the_batch(app: leaseq.App) -> None:
    go = threading.Event()

    @app.task("job", max_attempts=1, lease_seconds=30)
    async def job(ctx) -> dict:
        await asyncio.to_thread(go.wait, 10)
        return {"generation": ctx.generation}

    q = app.queue
    tasks = [job.enqueue() for _ in range(3)]
    transport = GatedCompletions(q)
    running = RunningWorker(app.worker(transport=transport, concurrency=3, poll_interval=0.05))
    runtime = running.runtime
    try:
        wait_for(lambda: runtime.stats.claimed == 3)
        go.set()
        wait_for(lambda: transport.batches)  # a completion batch is in flight, held at the gate
        # The first task of the batch in flight: cancel its handler's task, as a
        # reclaim, a lost lease or shutdown would.
        victim = transport.batches[0][0]
        key = next(k for k in runtime._tasks if k[0] == victim)
        runtime._loop.call_soon_threadsafe(runtime._tasks[key].cancel)
        wait_for(lambda: key not in runtime._tasks)
        transport.gate.set()
        wait_for(lambda: all(q.get(t.id).status == "completed" for t in tasks))
        wait_for(lambda: runtime.stats.completed == 3 and not runtime.held)
        # The flusher lives on: a later task completes through it too.
        later = job.enqueue()
        wait_for(lambda: q.get(later.id).status == "completed")
    finally:
        go.set()
        transport.gate.set()
        running.stop()
    assert runtime.stats.completed == 4 and runtime.stats.failed == 0 and runtime.stats.lost == 0
    assert all(q.get(t.id).attempts == 1 for t in tasks)


def test_a_revoked_worker_stops_claiming_and_shuts_down_gracefully(app: leaseq.App) -> None:
    """The claim loop's UnknownWorker: stop claiming, give running tasks the grace
    period, then end (raising the refusal), instead of ending run() on the spot."""
    started, go, finished = threading.Event(), threading.Event(), threading.Event()

    @app.task("job", max_attempts=3, lease_seconds=30)
    def job(ctx) -> str:
        started.set()
        go.wait(20)
        finished.set()
        return "done"

    q = app.queue
    task = job.enqueue()
    runtime = app.worker(concurrency=2, poll_interval=0.05, grace=30)
    outcome: list[BaseException | None] = []

    def main() -> None:
        try:
            asyncio.run(runtime.run())
            outcome.append(None)
        except BaseException as exc:  # what run() ended with
            outcome.append(exc)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    try:
        assert started.wait(10)
        q.revoke_worker(runtime.worker)
        wait_for(lambda: runtime._stopping)  # the claim loop saw the refusal
        time.sleep(0.5)
        assert thread.is_alive() and not outcome, "run() must wait for the running task within the grace period"
        go.set()
        thread.join(15)
        assert not thread.is_alive()
    finally:
        go.set()
        runtime.stop()
        thread.join(15)
    assert finished.is_set()
    assert len(outcome) == 1 and isinstance(outcome[0], leaseq.UnknownWorker)
    # The revocation ended the lease: the late result was refused, not published.
    assert runtime.stats.completed == 0 and runtime.stats.lost == 1
    assert q.get(task.id).result is None


def test_an_app_without_handlers_refuses_to_start(dsn: str) -> None:
    app = leaseq.App(dsn, name="billing")
    try:
        task = app.queue.enqueue("anything", {})
        with pytest.raises(leaseq.InvalidInput) as raised:
            app.run_worker(until_idle=True, install_signals=False)
        assert raised.value.field == "app"
        assert "'billing'" in str(raised.value) and "no task handlers" in str(raised.value)
        with pytest.raises(leaseq.InvalidInput, match="billing"):
            asyncio.run(WorkerRuntime(app).run(until_idle=True))
        # Nothing was claimed, registered or failed.
        untouched = app.queue.get(task.id)
        assert (untouched.status, untouched.attempts) == ("queued", 0)
        assert app.queue.workers() == []
    finally:
        app.queue.close()


def test_an_app_is_named_after_its_module_by_default() -> None:
    assert leaseq.App().name == __name__
    with pytest.raises(leaseq.InvalidInput, match=__name__):
        leaseq.App().check_runnable()


def test_a_transport_must_declare_its_capabilities(app: leaseq.App) -> None:
    class Bare:
        def register_worker(self, name):  # pragma: no cover - never reached
            raise AssertionError

    @app.task("job")
    def job(ctx) -> None:
        return None

    with pytest.raises(leaseq.InvalidInput, match="capabilities"):
        WorkerRuntime(app, Bare())
