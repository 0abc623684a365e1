"""Streams under the worker runtime, on both backends: sync and async handlers emit while a
reader follows, and a durable sleep (a new attempt) shows as a reset in the stream, the
durable items standing and the others emitted again by the handler run from the top."""

from __future__ import annotations

import threading
from typing import Any

import leaseq
from leaseq_chaos.traces import validate_queue

from .conftest import wait_for


def test_handlers_stream_to_a_reader_across_a_durable_sleep(app: leaseq.App, start_worker: Any) -> None:
    @app.task("sync_report", max_attempts=1)
    def sync_report(ctx: leaseq.TaskContext, n: int) -> int:
        ctx.emit({"plan": n}, durable=True)
        ctx.emit("working")
        ctx.sleep(0.2)  # the attempt ends here; the next runs the handler from the top
        return int(ctx.emit({"done": n}))

    @app.task("async_report", max_attempts=1)
    async def async_report(ctx: leaseq.TaskContext, n: int) -> int:
        await ctx.emit({"plan": n}, durable=True)
        await ctx.emit("working")
        await ctx.sleep(0.2)
        return int(await ctx.emit({"done": n}))

    tasks = [sync_report.enqueue(n=1), async_report.enqueue(n=2)]
    seen: dict[int, list[leaseq.StreamItem]] = {t.id: [] for t in tasks}

    def follow(task_id: int) -> None:
        seen[task_id].extend(app.queue.stream(task_id, timeout=60))

    readers = [threading.Thread(target=follow, args=(t.id,)) for t in tasks]
    for r in readers:
        r.start()
    running = start_worker(concurrency=2)
    wait_for(lambda: all(app.queue.get(t.id).status == "completed" for t in tasks), timeout=30)
    for r in readers:
        r.join(30)
        assert not r.is_alive()
    running.stop()
    for t, n in zip(tasks, (1, 2)):
        assert [(e.generation, e.type, e.item, e.durable) for e in seen[t.id]] == [
            (1, "reset", None, False), (1, "item", {"plan": n}, True), (1, "item", "working", False),
            (2, "reset", None, False), (2, "item", "working", False), (2, "item", {"done": n}, False)]
        assert app.queue.get(t.id).result == 6  # the cursor of its last item
    assert validate_queue(app.queue) == []
