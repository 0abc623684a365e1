"""Durable waits under the worker runtime, on both backends: sleeping tasks hold no lease and
no slot, the worker claims other work meanwhile, and every sleeper completes.

The issue's figure is 1,000 tasks that each sleep 2 s on 4 slots; the default here is 200
(LEASEQ_SLEEPERS=1000 runs the full figure, which takes about a minute on SQLite)."""

from __future__ import annotations

import os
import time
from typing import Any

import leaseq
from leaseq_chaos.traces import validate_queue

from .conftest import wait_for

SLEEPERS = int(os.environ.get("LEASEQ_SLEEPERS", "200"))
SLEEP = 2.0


def running_leases(q: leaseq.Queue) -> int:
    return sum(r["count"] for r in q.stats() if r["status"] == "running")


def sleepers_app(app: leaseq.App, woke: list[int]) -> tuple[Any, Any]:
    @app.task("nap", max_attempts=1)
    async def nap(ctx: leaseq.TaskContext, n: int) -> int:
        await ctx.sleep(SLEEP)
        woke.append(n)
        return n

    @app.task("work")
    def work(ctx: leaseq.TaskContext, n: int) -> int:
        return n * 2

    return nap, work


def check_many_sleepers(q: leaseq.Queue, nap: Any, work: Any, woke: list[int], start: Any) -> dict[str, float]:
    sleepers = q.enqueue_many("nap", [{"n": n} for n in range(SLEEPERS)])
    began = time.monotonic()
    running = start()
    # Sampled until every sleeper completed: no waiting task holds a lease, and the leases held
    # are the 4 slots' plus the completions in flight (a slot frees as its handler returns,
    # before its batched completion is written), far fewer than the tasks asleep. Other work
    # enqueued meanwhile is claimed and done while sleepers still sleep.
    peak_leases = peak_waiting = 0
    others: list[int] = []
    others_done_while_asleep = None
    while time.monotonic() - began < 300:
        counts = {r["status"]: r["count"] for r in q.stats()}
        peak_leases = max(peak_leases, counts.get("running", 0))
        peak_waiting = max(peak_waiting, counts.get("waiting", 0))
        assert all(t.lease_owner is None and t.lease_expires_at is None
                   for t in q.list_tasks(status="waiting", limit=50))
        if not others and counts.get("waiting", 0) >= min(20, SLEEPERS):
            others = q.enqueue_many("work", [{"n": n} for n in range(20)], priority=10)
        elif others and others_done_while_asleep is None and all(q.get(i).status == "completed" for i in others):
            others_done_while_asleep = counts.get("waiting", 0)
        if counts.get("completed", 0) == SLEEPERS + len(others) and others:
            break
        time.sleep(0.02)
    total = time.monotonic() - began
    running.stop()
    # (Sleepers are claimed again as they wake, beside the ones not yet started: how many sleep
    # at once depends on the machine's speed; always many times the 4 slots.)
    assert peak_waiting >= min(SLEEPERS // 4, 200) and peak_leases * 4 <= peak_waiting, (peak_leases, peak_waiting)
    assert others_done_while_asleep, "the other work was done while sleepers slept"
    assert sorted(woke) == list(range(SLEEPERS)) and running.runtime.stats.suspended == SLEEPERS
    assert running.runtime.stats.failed == 0 and running.runtime.stats.lost == 0
    done = [q.get(i) for i in sleepers]
    assert all(t.status == "completed" and t.attempts == 1 and t.claim_generation == 2 for t in done)
    assert validate_queue(q) == []
    return {"total": total, "peak_waiting": peak_waiting, "peak_leases": peak_leases}


def test_many_sleepers_on_four_slots_hold_no_lease_and_all_complete(app: leaseq.App, start_worker: Any) -> None:
    woke: list[int] = []
    nap, work = sleepers_app(app, woke)
    figures = check_many_sleepers(app.queue, nap, work, woke, lambda: start_worker(concurrency=4))
    print(f"\n{SLEEPERS} sleepers x {SLEEP:g} s on 4 slots ({app.queue.dialect}): at most "
          f"{figures['peak_leases']} leases held while up to {figures['peak_waiting']} slept; all done after "
          f"{figures['total']:.2f} s")


def test_a_sync_handler_sleeps_and_replays_its_tool_calls(app: leaseq.App, start_worker: Any) -> None:
    made: list[str] = []

    def lookup(city: str) -> dict[str, Any]:
        made.append(city)
        return {"city": city}

    @app.task("trip", max_attempts=1)
    def trip(ctx: leaseq.TaskContext, city: str) -> dict[str, Any]:
        found = ctx.tool(lookup, action="geo.lookup", effect="read_only")(city)
        ctx.sleep(0.3)
        ctx.sleep(0.3)
        return found

    task = trip.enqueue(city="Oslo")
    running = start_worker(concurrency=1)
    wait_for(lambda: app.queue.get(task.id).status == "completed")
    running.stop()
    assert app.queue.get(task.id).result == {"city": "Oslo"} and made == ["Oslo"]  # the lookup ran once
    assert [e.type for e in app.queue.events(task.id)].count("tool_replayed") == 2
    assert running.runtime.stats.suspended == 2 and app.queue.get(task.id).claim_generation == 3
    assert validate_queue(app.queue) == []


def test_a_signal_reaches_a_waiting_handler(app: leaseq.App, start_worker: Any) -> None:
    @app.task("review")
    async def review(ctx: leaseq.TaskContext, doc: str) -> dict[str, Any]:
        verdict = await ctx.wait_for_signal("verdict", timeout=60)
        return {"doc": doc, "verdict": verdict}

    task = review.enqueue(doc="d-1")
    running = start_worker(concurrency=1)
    wait_for(lambda: app.queue.get(task.id).status == "waiting")
    assert running_leases(app.queue) == 0
    app.queue.signal(task.id, "verdict", {"ok": True}, by="ann")
    wait_for(lambda: app.queue.get(task.id).status == "completed")
    running.stop()
    assert app.queue.get(task.id).result == {"doc": "d-1", "verdict": {"ok": True}}
    assert validate_queue(app.queue) == []


def test_a_sleeper_wakes_at_its_time_not_at_the_workers_next_poll(app: leaseq.App, start_worker: Any) -> None:
    # A poll a minute apart: the sleeper is claimed again because its worker knows when it wakes,
    # not because the worker happened to look.
    @app.task("nap", max_attempts=1)
    async def nap(ctx: leaseq.TaskContext) -> float:
        await ctx.sleep(0.5)
        return time.time()

    task = nap.enqueue()
    running = start_worker(concurrency=1, poll_interval=60.0)  # its first claim takes the task
    wait_for(lambda: app.queue.get(task.id).status == "waiting")
    done = wait_for(lambda: (t := app.queue.get(task.id)).status == "completed" and t, timeout=10)
    running.stop()
    assert running.runtime.stats.suspended == 1
    assert (done.updated_at - done.created_at).total_seconds() < 5.0  # a poll would have taken 60 s
