"""A blocking tool called on the worker's event loop (an async handler calling a sync
``ctx.tool`` or ``@leaseq.tool``) is refused with an error that says what to do, before
anything is called or recorded: run there, it would stall the loop (every other handler,
the lease renewals) and can deadlock it. Off the loop (``asyncio.to_thread``) it runs."""

from __future__ import annotations

import asyncio
from typing import Any

import leaseq

from .conftest import wait_for

ENDED = ("completed", "dead", "failed")


def test_a_sync_tool_called_on_the_loop_is_refused_saying_to_use_the_async_form(app: leaseq.App,
                                                                               start_worker: Any) -> None:
    made: list[str] = []

    def lookup(city: str) -> dict[str, Any]:
        made.append(city)
        return {"city": city}

    @leaseq.tool(action="geo.decorated", effect="read_only")
    def decorated(city: str) -> dict[str, Any]:
        made.append(city)
        return {"city": city}

    @app.task("on-loop", max_attempts=3)
    async def on_loop(ctx: leaseq.TaskContext, city: str) -> Any:
        return ctx.tool(lookup, action="geo.lookup", effect="read_only")(city)

    @app.task("decorated-on-loop", max_attempts=3)
    async def decorated_on_loop(ctx: leaseq.TaskContext, city: str) -> Any:
        return decorated(city)

    @app.task("off-loop")
    async def off_loop(ctx: leaseq.TaskContext, city: str) -> Any:
        search = ctx.tool(lookup, action="geo.lookup", effect="read_only")
        return await asyncio.to_thread(search, city)

    tasks = [on_loop.enqueue(city="Oslo"), decorated_on_loop.enqueue(city="Bergen"), off_loop.enqueue(city="Rome")]
    running = start_worker(concurrency=2)
    q = app.queue
    wait_for(lambda: all(q.get(t.id).status in ENDED for t in tasks), timeout=30)
    running.stop()
    refused, refused_decorated, ran = (q.get(t.id) for t in tasks)
    for task, action in ((refused, "geo.lookup"), (refused_decorated, "geo.decorated")):
        assert task.status == "dead" and task.attempts == 1, task  # a code error: not retried
        assert f"tool {action!r}" in task.last_error and "asyncio.to_thread" in task.last_error, task.last_error
        assert q.effects(task.id) == []  # nothing recorded, nothing called
    assert ran.status == "completed" and ran.result == {"city": "Rome"}
    assert made == ["Rome"] and [e.action for e in q.effects(ran.id)] == ["geo.lookup"]
