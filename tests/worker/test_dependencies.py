"""Fan-out and fan-in under the worker runtime: a handler enqueues sub-tasks and
a follow-up that waits for them; the follow-up reads their results with
``ctx.results``. Both backends."""

from __future__ import annotations

import threading

import leaseq

from .conftest import wait_for


def test_a_handler_fans_out_and_a_follow_up_gathers_the_results(app: leaseq.App, start_worker) -> None:
    # The squares finish only once the follow-up is enqueued: otherwise a fast worker may
    # complete them all first, and the follow-up, with nothing left to wait for, never waits.
    follow_up_enqueued = threading.Event()

    @app.task("square")
    def square(ctx, n: int) -> int:
        assert follow_up_enqueued.wait(30)
        return n * n

    @app.task("total")
    def total(ctx, label: str) -> dict:
        results = ctx.results()
        return {"label": label, "parts": sorted(results.values()), "sum": sum(results.values())}

    @app.task("plan")
    def plan(ctx, upto: int) -> list[int]:
        parts = [square.enqueue(n=n).id for n in range(1, upto + 1)]
        total.options(after=parts).enqueue(label="squares")
        follow_up_enqueued.set()
        return parts

    @app.task("pick")
    async def pick(ctx, first: int, last: int) -> list:
        chosen = await ctx.aresults([last, first])  # in the order asked for
        return list(chosen.items())

    planned = plan.enqueue(upto=4)
    start_worker(concurrency=4)
    q = app.queue
    wait_for(lambda: q.get(planned.id).status == "completed")
    parts = q.get(planned.id).result
    follow_up = next(t for t in q.list_tasks(limit=100) if t.kind == "total")
    done = wait_for(lambda: (t := q.get(follow_up.id)).status == "completed" and t)
    assert done.result == {"label": "squares", "parts": [1, 4, 9, 16], "sum": 30}
    kinds = [e.type for e in q.events(follow_up.id)]
    assert kinds[:3] == ["enqueued", "waiting", "dependencies_met"] and "completed" in kinds

    chosen = pick.options(after=[parts[0], parts[-1]]).enqueue(first=parts[0], last=parts[-1])
    got = wait_for(lambda: (t := q.get(chosen.id)).status == "completed" and t)
    assert got.result == [[parts[-1], 16], [parts[0], 1]]


def test_ctx_results_refuses_a_task_it_did_not_wait_for(app: leaseq.App, start_worker) -> None:
    @app.task("one")
    def one(ctx) -> int:
        return 1

    @app.task("nosy")
    def nosy(ctx, other: int) -> str:
        try:
            ctx.results([other])
        except leaseq.InvalidInput as exc:
            return f"{exc.field}: {exc.problem}"
        return "read it"

    a, b = one.enqueue(), one.enqueue()
    t = nosy.options(after=[a.id]).enqueue(other=b.id)
    start_worker(concurrency=2)
    got = wait_for(lambda: (x := app.queue.get(t.id)).status == "completed" and x)
    assert got.result == f"after_ids: task {t.id} did not wait for task {b.id}"


def test_a_dead_sub_task_cancels_the_follow_up_and_wait_reports_it(app: leaseq.App, start_worker) -> None:
    @app.task("flaky", max_attempts=1)
    def flaky(ctx, ok: bool) -> str:
        if not ok:
            raise leaseq.Permanent("bad input")
        return "fine"

    @app.task("gather")
    def gather(ctx) -> str:
        return "never runs"

    good, bad = flaky.enqueue(ok=True), flaky.enqueue(ok=False)
    follow_up = gather.options(after=[good.id, bad.id]).enqueue()
    start_worker(concurrency=2)
    ended = app.queue.wait(follow_up.id, timeout=20)
    assert (ended.status, ended.last_error) == ("cancelled", f"dependency {bad.id} ended dead")
    assert app.queue.wait(good.id, timeout=20).status == "completed"
