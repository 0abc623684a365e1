"""A research task whose budget covers the children it spawns, and the run that proves it:
the budget is spent mid-run by the children, every task of the tree stops at its next ledger
step (a consume or a tool call) and waits for a person, and approvals (one of them raising
the parent's budget) resume the tree from its ledgers, with no call made twice. Run by the
worker runtime on both backends (tests/worker) and over HTTP (tests/service)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Callable

import leaseq

TOK = "llm-tokens"
CHILDREN, CALLS, CALL = 3, 3, 100
BUDGET, RAISE = 500, 1_000


def tree_app(made: list[tuple[int, int]], *, is_async: bool, name: str = "tree-budgets") -> leaseq.App:
    app = leaseq.App(name=name)
    lock = threading.Lock()

    def call_model(n: int, i: int) -> dict[str, Any]:
        with lock:
            made.append((n, i))
        return {"n": n, "i": i, "tokens": CALL}

    if is_async:  # async all through: no blocking call on the worker's event loop
        async def acall_model(n: int, i: int) -> dict[str, Any]:
            return call_model(n, i)

        @app.task("research", budget={TOK: BUDGET})
        async def aresearch(ctx: leaseq.TaskContext, parts: int) -> int:
            handles = [await ctx.aspawn("part", {"n": n}, key=f"part-{n}") for n in range(parts)]
            return sum(await ctx.wait_for_all(handles))

        @app.task("part")
        async def apart(ctx: leaseq.TaskContext, n: int) -> int:
            model = ctx.tool(acall_model, action="llm.call", effect="read_only")
            for i in range(CALLS):
                reply = await model(n, i)
                await ctx.consume(TOK, reply["tokens"])
            return n
    else:
        @app.task("research", budget={TOK: BUDGET})
        def research(ctx: leaseq.TaskContext, parts: int) -> int:
            handles = [ctx.spawn("part", {"n": n}, key=f"part-{n}") for n in range(parts)]
            return sum(ctx.wait_for_all(handles))

        @app.task("part")
        def part(ctx: leaseq.TaskContext, n: int) -> int:
            model = ctx.tool(call_model, action="llm.call", effect="read_only")
            for i in range(CALLS):
                reply = model(n, i)
                ctx.consume(TOK, reply["tokens"])
            return n
    return app


def children_of(q: Any, parent_id: int) -> list[Any]:
    return [t for t in q.list_tasks(limit=100) if t.parent_id == parent_id]


def spent_and_settled(q: Any, parent_id: int) -> bool:
    """Every child spawned, none running or queued, and at least one waiting for a person."""
    children = children_of(q, parent_id)
    return (len(children) == CHILDREN and all(c.status in ("awaiting_approval", "completed") for c in children)
            and any(c.status == "awaiting_approval" for c in children))


def run_tree(q: Any, made: list[tuple[int, int]], enqueue: Callable[[], leaseq.Task],
             approve: Callable[[int, str, dict[str, int] | None], None],
             wait_for: Callable[..., Any]) -> leaseq.Task:
    """Enqueue the parent, let the running worker spend its budget, check the pause, approve
    each request (the first raising the budget), and check the tree completes repeating nothing."""
    task = enqueue()
    assert task.budget == {TOK: BUDGET}
    wait_for(lambda: spent_and_settled(q, task.id), timeout=60)
    children = children_of(q, task.id)
    paused = [c for c in children if c.status == "awaiting_approval"]
    spent = sum((c.spent or {}).get(TOK, 0) for c in children)
    assert BUDGET < spent <= BUDGET + CHILDREN * CALL  # at most one call's worth past it for each child
    requests = {c.id: q.approval(c.id) for c in paused}
    for request in requests.values():
        assert request.reason == "budget" and request.detail["owner"] == task.id
        assert request.detail["key"] == TOK and request.detail["budget"] == BUDGET
    assert q.get(task.id).status == "waiting"  # the parent waits for its children, as it did
    first, *rest = sorted(requests)
    approve(first, requests[first].digest, {TOK: RAISE})
    assert q.get(task.id).budget == {TOK: BUDGET + RAISE}
    for child_id in rest:
        approve(child_id, requests[child_id].digest, None)
    wait_for(lambda: q.get(task.id).status == "completed", timeout=60)
    done = q.get(task.id)
    assert done.result == sum(range(CHILDREN))
    assert Counter(made) == Counter((n, i) for n in range(CHILDREN) for i in range(CALLS))  # no call twice
    assert sum(c.spent[TOK] for c in children_of(q, task.id)) == CHILDREN * CALLS * CALL  # none charged twice
    return done
