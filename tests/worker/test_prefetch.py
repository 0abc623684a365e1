"""Prefetch: tasks leased ahead of the handler slots, on both backends.

A worker with ``prefetch=N`` holds up to ``concurrency + N`` leases. The tasks
beyond its handler slots wait, leased and renewed, and start in the order they
were claimed as handlers return. Their timeout starts with the handler; a
stopping worker gives them back unstarted, their attempts with them; a lease
lost while waiting is never started.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import leaseq
from leaseq.core.errors import InvalidInput
from leaseq.observability.hooks import WorkerObserver
from leaseq.worker import WorkerRuntime

from .conftest import lease_live, wait_for

LEASE = 0.6  # renewed every 0.2 s


class Gated:
    """``count`` tasks of a handler that records its start and waits for ``gate``."""

    def __init__(self, app: leaseq.App, kind: str, count: int):
        self.started: list[int] = []
        self.gate = threading.Event()

        @app.task(kind, lease_seconds=LEASE)
        def handler(ctx, n: int) -> int:
            self.started.append(n)
            assert self.gate.wait(30), "the test never opened the gate"
            return n

        self.tasks = [handler.enqueue(n=n) for n in range(count)]


def test_tasks_claimed_ahead_are_held_renewed_and_started_in_claim_order(app: leaseq.App, start_worker) -> None:
    work = Gated(app, "ahead", 6)
    started, gate, tasks, q = work.started, work.gate, work.tasks, app.queue
    running = start_worker(concurrency=2, prefetch=2)
    wait_for(lambda: sorted(started) == [0, 1] and all(lease_live(q, t.id) for t in tasks[:4]))
    time.sleep(3 * LEASE)  # three lease lengths: the waiting leases live only if they are renewed
    assert sorted(started) == [0, 1], "a task claimed ahead started while every slot was taken"
    assert all(lease_live(q, t.id) for t in tasks[:4]), [q.get(t.id) for t in tasks[:4]]
    assert [q.get(t.id).status for t in tasks[4:]] == ["queued", "queued"], "more leases than slots + prefetch"
    gate.set()
    wait_for(lambda: all(q.get(t.id).status == "completed" for t in tasks))
    running.stop()
    assert started == list(range(6)), "tasks claimed ahead start in the order they were claimed"
    assert [(q.get(t.id).attempts, q.get(t.id).claim_generation) for t in tasks] == [(1, 1)] * 6
    assert running.runtime.stats.lost == 0 and running.runtime.stats.completed == 6


def test_a_stopping_worker_gives_back_what_it_claimed_ahead_unstarted(app: leaseq.App, start_worker) -> None:
    work = Gated(app, "given-back", 3)
    started, gate, tasks, q = work.started, work.gate, work.tasks, app.queue
    running = start_worker(concurrency=1, prefetch=2, grace=20)
    wait_for(lambda: started == [0] and all(lease_live(q, t.id) for t in tasks))
    running.runtime.stop()
    # given back at once, while the running handler still has its grace period
    wait_for(lambda: [q.get(t.id).status for t in tasks[1:]] == ["queued", "queued"])
    assert started == [0]
    gate.set()
    running.stop()
    assert started == [0], "a task claimed ahead started after the worker began stopping"
    assert q.get(tasks[0].id).status == "completed"
    for t in tasks[1:]:
        task = q.get(t.id)
        assert task.attempts == 0, "giving back a task that never started charged it an attempt"
        released = [e for e in q.events(t.id) if e.type == "lease_released"]
        assert released and released[-1].detail.get("started") is False, released


def test_a_slot_that_frees_as_the_worker_begins_stopping_starts_nothing(app: leaseq.App, start_worker) -> None:
    """The first handler asks the worker to stop and returns at once: its slot frees before
    the shutdown runs, and the task waiting for it is given back instead of started."""
    started: list[int] = []
    holder: list = []

    @app.task("last-one", lease_seconds=LEASE)
    async def last_one(ctx, n: int) -> int:
        started.append(n)
        if n == 0:
            await asyncio.sleep(0.2)  # the other task is waiting for this slot by now
            holder[0].runtime.stop()  # scheduled on this loop: it runs before the waiter resumes
        return n

    running = start_worker(concurrency=1, prefetch=1)
    holder.append(running)
    first, second = app.queue.enqueue_many("last-one", [{"n": 0}, {"n": 1}])  # one claim leases both
    wait_for(lambda: app.queue.get(first).status == "completed" and app.queue.get(second).status == "queued")
    running.stop()
    assert started == [0], "a task claimed ahead started after the worker began stopping"
    assert app.queue.get(second).attempts == 0


def test_the_timeout_of_a_task_claimed_ahead_starts_with_its_handler(app: leaseq.App, start_worker) -> None:
    @app.task("timed", timeout=1.0)
    async def timed(ctx) -> str:
        await asyncio.sleep(0.7)
        return "done"

    tasks = [timed.enqueue() for _ in range(2)]
    running = start_worker(concurrency=1, prefetch=1)
    # the second waits about 0.7 s for the slot, then runs 0.7 s: 1.4 s after its claim
    wait_for(lambda: all(app.queue.get(t.id).status == "completed" for t in tasks))
    running.stop()
    assert running.runtime.stats.timed_out == 0
    assert [app.queue.get(t.id).attempts for t in tasks] == [1, 1]


def test_a_task_claimed_ahead_is_timed_from_its_handlers_start(app: leaseq.App, start_worker) -> None:
    durations: list[float] = []

    class Durations(WorkerObserver):
        def finished(self, ctx) -> None:
            super().finished(ctx)
            durations.append(ctx.duration)

    @app.task("measured")
    async def measured(ctx) -> None:
        await asyncio.sleep(0.3)

    tasks = [measured.enqueue() for _ in range(3)]
    running = start_worker(concurrency=1, prefetch=2, observer=Durations())
    wait_for(lambda: all(app.queue.get(t.id).status == "completed" for t in tasks))
    running.stop()
    # each waited up to 0.6 s for the slot; its duration is its handler's 0.3 s alone
    assert len(durations) == 3 and all(0.25 <= d < 0.5 for d in durations), durations


def test_the_metrics_count_handlers_running_not_tasks_leased_ahead(app: leaseq.App, start_worker) -> None:
    pytest.importorskip("prometheus_client")
    from leaseq.observability.metrics import WorkerMetrics

    metrics = WorkerMetrics()
    work = Gated(app, "metered", 3)
    running = start_worker(concurrency=1, prefetch=2, observer=WorkerObserver(metrics), grace=20)

    def value(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    try:
        wait_for(lambda: work.started == [0] and value("leaseq_worker_tasks_claimed_total", kind="metered") == 3)
        assert value("leaseq_worker_running_tasks") == 1, "tasks leased ahead counted as running handlers"
        running.runtime.stop()  # the two waiting ones go back unstarted
        wait_for(lambda: [app.queue.get(t.id).status for t in work.tasks[1:]] == ["queued", "queued"])
    finally:
        work.gate.set()
    running.stop()
    assert value("leaseq_worker_running_tasks") == 0
    # one handler ran: one duration, none for the tasks that never started
    assert sum(value("leaseq_worker_handler_duration_seconds_count", kind="metered", outcome=o)
               for o in ("completed", "released", "unrecorded", "lost")) == 1


def test_a_task_whose_lease_is_lost_while_it_waits_never_starts(app: leaseq.App, start_worker) -> None:
    work = Gated(app, "cancelled-ahead", 2)
    started, gate, (first, second), q = work.started, work.gate, work.tasks, app.queue
    running = start_worker(concurrency=1, prefetch=1)
    wait_for(lambda: started == [0] and lease_live(q, second.id))
    q.cancel(second.id, "not wanted any more")
    wait_for(lambda: running.runtime.stats.lost >= 1)  # its next renewal was refused
    gate.set()
    wait_for(lambda: q.get(first.id).status == "completed")
    time.sleep(2 * LEASE)
    running.stop()
    assert started == [0], "a task whose lease was lost while it waited was started"
    assert q.get(second.id).status == "cancelled"


@pytest.mark.parametrize("prefetch", [-1, 1001, 1.5, True, "2"])
def test_a_prefetch_that_is_not_a_whole_number_in_range_is_refused(app: leaseq.App, prefetch) -> None:
    with pytest.raises(InvalidInput) as refused:
        WorkerRuntime(app, prefetch=prefetch)
    assert refused.value.field == "prefetch"


def test_more_slots_than_one_claim_may_lease_are_refused_before_the_worker_starts(app: leaseq.App) -> None:
    with pytest.raises(InvalidInput) as refused:
        WorkerRuntime(app, concurrency=9_500, prefetch=501)
    assert refused.value.field == "concurrency" and "at most 10000" in str(refused.value)
    WorkerRuntime(app, concurrency=9_500, prefetch=500)  # exactly one claim's worth is fine
