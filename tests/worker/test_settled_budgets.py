"""Budgets settled after the call under the worker runtime, on both backends: a handler's
``ctx.consume`` past its task's budget stops the attempt cleanly (no failure, no lost lease:
the task waits for a person), and an approval that raises the budget resumes it from its
ledger, repeating no call it recorded. Sync and async handlers alike."""

from __future__ import annotations

from typing import Any

import pytest

import leaseq
from leaseq_chaos.traces import validate_queue

from .conftest import wait_for

TOK = "llm-tokens"


def agent_app(app: leaseq.App, made: list[int], *, is_async: bool) -> Any:
    def call_model(step: int) -> dict[str, Any]:
        made.append(step)
        return {"step": step, "tokens": 100}

    async def acall_model(step: int) -> dict[str, Any]:
        return call_model(step)

    if is_async:
        @app.task("agent", limits=[TOK], units=100, budget={TOK: 250})
        async def agent(ctx: leaseq.TaskContext, steps: int) -> list[int]:
            model = ctx.tool(acall_model, action="llm.call", effect="read_only")  # awaited on the loop
            out = []
            for step in range(steps):
                reply = await model(step)
                answer = await ctx.consume(TOK, reply["tokens"])
                assert answer["state"] in ("charged", "replayed")
                out.append(reply["step"])
            return out
    else:
        @app.task("agent", limits=[TOK], units=100, budget={TOK: 250})
        def agent(ctx: leaseq.TaskContext, steps: int) -> list[int]:
            model = ctx.tool(call_model, action="llm.call", effect="read_only")
            out = []
            for step in range(steps):
                reply = model(step)
                ctx.consume(TOK, reply["tokens"])
                out.append(reply["step"])
            return out
    return agent


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_spent_budget_pauses_the_task_and_a_raise_resumes_it_repeating_nothing(
        app: leaseq.App, start_worker: Any, is_async: bool) -> None:
    q = app.queue
    q.set_limit(TOK, per_day=1_000_000, counts="units")
    made: list[int] = []
    agent = agent_app(app, made, is_async=is_async)
    task = agent.enqueue(steps=5)
    assert task.budget == {TOK: 250}
    running = start_worker(concurrency=2)
    wait_for(lambda: q.get(task.id).status == "awaiting_approval")
    assert made == [0, 1, 2]  # the third call's usage took the task past its budget: it stopped there
    held = q.get(task.id)
    assert held.lease_owner is None and held.spent == {TOK: 300} and held.attempts == 0
    [request] = q.approvals()
    assert request.reason == "budget" and request.detail == {"key": TOK, "budget": 250, "spent": 300,
                                                             "units": 100}
    q.approve(task.id, request.digest, raise_budget={TOK: 250}, note="the answer is close")
    wait_for(lambda: q.get(task.id).status == "completed")
    running.stop()
    done = q.get(task.id)
    assert done.result == [0, 1, 2, 3, 4] and made == [0, 1, 2, 3, 4]  # no call made twice
    assert done.spent == {TOK: 500} and done.budget == {TOK: 500}
    assert q.limits(TOK)[0]["day_used"] == 500 and q.limits(TOK)[0]["running"] == 0
    stats = running.runtime.stats
    assert (stats.suspended, stats.failed, stats.lost) == (1, 0, 0)
    replayed = [e for e in q.events(task.id) if e.type == "tool_replayed"]
    assert len(replayed) == 3
    assert validate_queue(q) == []


def test_a_consume_outside_the_lease_is_refused_and_stops_the_handler(app: leaseq.App, start_worker: Any) -> None:
    """A handler whose lease was cancelled under it: its next consume is refused by the guard and
    charges nothing (the handler learns it with LeaseLost)."""
    q = app.queue
    seen: list[str] = []

    @app.task("slow")
    def slow(ctx: leaseq.TaskContext) -> None:
        ctx.consume(TOK, 10)
        q.cancel(ctx.task_id, "stop it")
        try:
            ctx.consume(TOK, 10)
        except leaseq.LeaseLost:
            seen.append("refused")
            raise

    task = slow.enqueue()
    running = start_worker(concurrency=1)
    wait_for(lambda: seen == ["refused"] and q.get(task.id).status == "cancelled")
    running.stop()
    assert q.get(task.id).spent == {TOK: 10}
    assert [r["units"] for r in q.limit_spend(TOK)] == [10]
