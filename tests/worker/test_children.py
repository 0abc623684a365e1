"""Child tasks under the worker runtime, on both backends: a parent spawns children and waits
for them holding no lease and no slot, the worker claims other work meanwhile, and the
parent completes with its children's results; a child's failure is caught by its parent."""

from __future__ import annotations

import threading
from typing import Any

import leaseq
from leaseq_chaos.traces import validate_queue

from .conftest import wait_for


def running_leases(q: leaseq.Queue) -> int:
    return sum(r["count"] for r in q.stats() if r["status"] == "running")


def test_a_parent_fans_out_and_in_holding_nothing_while_it_waits(app: leaseq.App, start_worker: Any) -> None:
    gate = threading.Event()
    ran: list[int] = []

    @app.task("report", max_attempts=1)
    def report(ctx: leaseq.TaskContext, sections: list[str]) -> dict[str, Any]:
        handles = [ctx.spawn("section", {"name": s}, key=s) for s in sections]
        return {"sections": ctx.wait_for_all(handles)}

    @app.task("section")
    def section(ctx: leaseq.TaskContext, name: str) -> str:
        assert gate.wait(30), "the gate never opened"
        ran.append(ctx.task_id)
        return name.upper()

    @app.task("other")
    def other(ctx: leaseq.TaskContext, n: int) -> int:
        return n

    parent = report.enqueue(sections=["a", "b", "c"])
    running = start_worker(concurrency=4)  # three slots for the sections, one left for other work
    wait_for(lambda: app.queue.get(parent.id).status == "waiting")
    q = app.queue
    waiting = q.get(parent.id)
    assert waiting.lease_owner is None and waiting.lease_expires_at is None and len(waiting.wait_children or []) == 3
    wait_for(lambda: running_leases(q) == 3)  # the three children, none for the parent
    others = q.enqueue_many("other", [{"n": n} for n in range(10)])
    wait_for(lambda: all(q.get(i).status == "completed" for i in others))  # claimed while the parent waits
    assert q.get(parent.id).status == "waiting" and q.get(parent.id).lease_owner is None
    gate.set()
    wait_for(lambda: q.get(parent.id).status == "completed")
    running.stop()
    assert q.get(parent.id).result == {"sections": ["A", "B", "C"]}
    assert len(ran) == 3 and len([t for t in q.list_tasks(limit=100) if t.kind == "section"]) == 3
    assert running.runtime.stats.suspended == 1 and q.get(parent.id).claim_generation == 2
    assert validate_queue(q) == []


def test_an_async_parent_spawns_without_await_and_awaits_the_result(app: leaseq.App, start_worker: Any) -> None:
    @app.task("lead")
    async def lead(ctx: leaseq.TaskContext, n: int) -> list[Any]:
        handle = ctx.spawn("double", {"n": n}, key="double")  # the handle at once
        again = await ctx.spawn("double", {"n": n + 1})       # awaiting a handle gives it back
        third = await ctx.aspawn("double", {"n": n + 2})      # off the event loop
        return [await ctx.wait_for(handle), *(await ctx.wait_for_all([again, third]))]

    @app.task("double", queue="doubles")  # its declared queue and options: what ctx.spawn uses
    async def double(ctx: leaseq.TaskContext, n: int) -> int:
        return n * 2

    parent = lead.enqueue(n=5)
    running = start_worker(concurrency=2)
    wait_for(lambda: app.queue.get(parent.id).status == "completed")
    running.stop()
    assert app.queue.get(parent.id).result == [10, 12, 14]
    kids = [t for t in app.queue.list_tasks(limit=100) if t.kind == "double"]
    assert len(kids) == 3 and {t.queue for t in kids} == {"doubles"} and {t.parent_id for t in kids} == {parent.id}
    assert validate_queue(app.queue) == []


def test_a_childs_failure_is_caught_by_its_parent(app: leaseq.App, start_worker: Any) -> None:
    @app.task("careful", max_attempts=1)
    def careful(ctx: leaseq.TaskContext) -> dict[str, Any]:
        try:
            return {"value": ctx.wait_for(ctx.spawn("flaky", {}))}
        except leaseq.ChildFailed as failed:
            return {"child": failed.child_id, "status": failed.status, "error": failed.error}

    @app.task("flaky", max_attempts=1)
    def flaky(ctx: leaseq.TaskContext) -> None:
        raise leaseq.Permanent("the upstream API refused it")

    parent = careful.enqueue()
    running = start_worker(concurrency=2)
    wait_for(lambda: app.queue.get(parent.id).status == "completed")
    running.stop()
    [child] = [t for t in app.queue.list_tasks(limit=100) if t.kind == "flaky"]
    result = app.queue.get(parent.id).result
    assert result["child"] == child.id and result["status"] == "dead"
    assert "the upstream API refused it" in result["error"]
    assert validate_queue(app.queue) == []
