"""The budgets workload: a per-minute token window with usage settled after each call.

Two trials, each on a fresh schema (or SQLite file):

* ``overshoot``: ``tasks`` tasks, each reserving one call's worth (``units``) of a limit with a
  ``per_minute`` total, are worked by ``threads`` concurrent workers (threads, one connection
  each): claim, make the call (a short sleep), charge what it used (``consume``, between half a
  call and a whole one), complete. The usage is grouped by the minute of the claim that
  reserved it (as the window counts it); the report gives each window's worst overshoot of its
  total, in units and in calls' worth (the promise: never more than one).
* ``claim cost``: one worker claims and completes ``claims`` tasks one at a time, timing each
  claim call, for tasks naming no limit, and for tasks naming a limit with a per-minute window
  (never binding) whose usage is settled after each call: what the windows cost a claim (the
  p10 is the figure least moved by other work on a shared machine).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from typing import Any

import leaseq

from . import systems
from .database import BenchDatabase
from .workloads import _schema_or_file

KEY = "llm-tokens"


def overshoot(db: BenchDatabase, system: systems.System, *, tasks: int, threads: int, total: int,
              units: int) -> dict[str, Any]:
    """The worst overshoot of a per_minute window by concurrent workers settling usage after each call."""
    with _schema_or_file(db, system) as dsn:
        system.install(dsn)
        q = leaseq.connect(dsn)
        try:
            q.set_limit(KEY, per_minute=total, counts="units")
            ids = q.enqueue_many("call", [{"n": n} for n in range(tasks)], limits=[KEY], units=units)
            errors: list[BaseException] = []
            start = threading.Barrier(threads)

            def work(n: int) -> None:
                queue = leaseq.connect(dsn)
                rng = random.Random(n)
                try:
                    w = queue.register_worker(f"w{n}")
                    start.wait()
                    while True:
                        got = queue.claim(w)
                        if not got:
                            return  # the window is spent, or nothing is left
                        [claim] = got
                        time.sleep(rng.uniform(0.0005, 0.002))  # the call
                        queue.consume(w, claim, f"{claim.task_id}:consume:0", KEY, rng.randint(units // 2, units))
                        queue.complete(w, claim)
                except BaseException as exc:  # surfaced below
                    errors.append(exc)
                finally:
                    queue.close()

            began = time.perf_counter()
            workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
            for t in workers:
                t.start()
            for t in workers:
                t.join()
            seconds = time.perf_counter() - began
            if errors:
                raise errors[0]
            by_window: dict[int, int] = {}
            done = 0
            for task_id in ids:
                task = q.get(task_id)
                if task.status != "completed":
                    continue
                done += 1
                [entry] = [e for e in q.effects(task_id) if e.action == "leaseq.consume"]
                window = int(task.claimed_at.timestamp() // 60) if task.claimed_at else 0
                by_window[window] = by_window.get(window, 0) + int(entry.response["units"])
        finally:
            q.close()
    worst = max(by_window.values(), default=0)
    return {"tasks": tasks, "completed": done, "windows": len(by_window), "total": total, "call_units": units,
            "max_settled": worst, "max_overshoot_units": max(0, worst - total),
            "max_overshoot_calls": round(max(0, worst - total) / units, 3), "seconds": seconds}


def claim_cost(db: BenchDatabase, system: systems.System, *, claims: int, windows: bool) -> dict[str, Any]:
    """Milliseconds per claim call (one task at a time), with or without a per_minute window."""
    with _schema_or_file(db, system) as dsn:
        system.install(dsn)
        q = leaseq.connect(dsn)
        try:
            if windows:
                q.set_limit(KEY, per_minute=10**12, counts="units")
            q.enqueue_many("call", [{"n": n} for n in range(claims)], limits=[KEY] if windows else None, units=100)
            w = q.register_worker("w")
            timings: list[float] = []
            for n in range(claims):
                started = time.perf_counter()
                [claim] = q.claim(w)
                timings.append(1000 * (time.perf_counter() - started))
                if windows:
                    q.consume(w, claim, f"{claim.task_id}:consume:0", KEY, 80)
                q.complete(w, claim)
        finally:
            q.close()
    timings.sort()
    return {"claims": claims, "claim_p10_ms": timings[len(timings) // 10], "claim_mean_ms": statistics.fmean(timings),
            "claim_p50_ms": timings[len(timings) // 2], "claim_p99_ms": timings[min(len(timings) - 1,
                                                                                    int(len(timings) * 0.99))]}
