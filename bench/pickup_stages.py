"""Where a task's pickup latency goes: ``python -m bench.pickup_stages --tasks 500``.

One idle worker process and one enqueuer (this process), as ``python -m bench latency``
runs them, on a database of their own. Each stage of the path from the enqueue call to
the handler's start is stamped with the wall clock (both processes share it):

* ``sent``: the enqueue's statement is sent (the blocking queue's, or with ``--async``
  the asyncio queue's); ``returned``: its answer (the commit) came back; ``enqueued``: the
  enqueue call returned;
* ``heard``: the worker process's notifier heard ``leaseq_work`` on its connection;
* ``woken``: the claim loop's waiter was woken on the worker's event loop;
* ``claim_sent`` / ``claim_back``: the claim that took the task was sent and answered;
* ``started``: the handler began.

Each stage's time is taken from the one before it; ``poll`` counts the tasks claimed
with no wake-up heard since their enqueue (the worker's poll timer, not a notification).
The stamps are taken by wrapping internal methods of this tree in both processes: a
probe of the path, not a public interface.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import leaseq

from .database import BenchDatabase, with_search_path


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(p / 100 * len(values) + 0.5) - 1))
    return values[k]


# -- the worker process --------------------------------------------------------------------

def _worker(dsn: str, tasks: int) -> None:
    from leaseq.store import notifier, postgres
    from leaseq.worker import claim_loop

    events: dict[str, list[float]] = {"heard": [], "woken": []}
    claims: list[tuple[float, float, list[int]]] = []
    started: dict[int, float] = {}

    def wrap_wait(original: Any) -> Any:
        def wait(self: Any, timeout: float) -> Any:
            notes = original(self, timeout)
            if any(channel == notifier.WORK_CHANNEL for channel, _ in notes):
                events["heard"].append(time.time())
            return notes
        return wait

    postgres.SharedListener.wait = wrap_wait(postgres.SharedListener.wait)  # type: ignore[method-assign]
    on_loop = getattr(postgres, "AsyncSharedListener", None)  # a notifier that reads on the event loop
    if on_loop is not None:
        original_readable = on_loop._readable

        def readable(self: Any) -> None:  # the loop read the socket: its one connection, only LISTENing
            events["heard"].append(time.time())
            original_readable(self)
        on_loop._readable = readable

    original_wake = notifier.AsyncWait._wake

    def wake(self: Any) -> None:
        if isinstance(self, notifier.AsyncWorkWait):
            events["woken"].append(time.time())
        original_wake(self)
    notifier.AsyncWait._wake = wake  # type: ignore[method-assign]

    original_claim = claim_loop.ClaimLoop._claim

    async def claim(self: Any, queue: str, limit: int, wait: float = 0.0) -> Any:
        sent = time.time()
        got = await original_claim(self, queue, limit, wait)
        claims.append((sent, time.time(), [c.task.payload.get("i", -1) for c in got]))
        return got
    claim_loop.ClaimLoop._claim = claim  # type: ignore[method-assign]

    app = leaseq.App(dsn)
    done = asyncio.Event()

    @app.task("noop")
    async def noop(ctx: Any, i: int = 0) -> None:
        started[i] = time.time()
        if len(started) >= tasks:
            done.set()

    async def main() -> None:
        runtime = app.worker(concurrency=10, grace=0.5)
        run = asyncio.create_task(runtime.run())
        await asyncio.sleep(1.0)
        print("READY", flush=True)
        await asyncio.wait([asyncio.create_task(done.wait()), run], timeout=120,
                           return_when=asyncio.FIRST_COMPLETED)
        runtime.stop()
        await run

    asyncio.run(main())
    print("RESULT " + json.dumps({"events": events, "claims": claims, "started": started}), flush=True)


# -- the enqueuer ----------------------------------------------------------------------------

def _stamp_statements(stamps: dict[str, float]) -> None:
    from leaseq.store import postgres

    def wrap(original: Any, is_async: bool) -> Any:
        if is_async:
            async def arow(self: Any, query: str, **params: Any) -> Any:
                stamps["sent"] = time.time()
                found = await original(self, query, **params)
                stamps["returned"] = time.time()
                return found
            return arow

        def row(self: Any, query: str, **params: Any) -> Any:
            stamps["sent"] = time.time()
            found = original(self, query, **params)
            stamps["returned"] = time.time()
            return found
        return row

    for cls, is_async in ((postgres.PostgresTx, False), (postgres.AsyncPostgresTx, True)):
        cls.rows = wrap(cls.rows, is_async)  # type: ignore[method-assign]


def _enqueue_all(dsn: str, tasks: int, gap: float, use_async: bool) -> list[dict[str, float]]:
    stamps: dict[str, float] = {}
    _stamp_statements(stamps)
    out: list[dict[str, float]] = []
    if use_async:
        async def go() -> None:
            q = await leaseq.connect_async(dsn)
            try:
                for i in range(tasks):
                    stamps.clear()
                    call = time.time()
                    await q.enqueue("noop", {"i": i})
                    out.append({"call": call, "enqueued": time.time(), **stamps})
                    await asyncio.sleep(gap)
            finally:
                await q.close()
        asyncio.run(go())
        return out
    with leaseq.connect(dsn) as q:
        for i in range(tasks):
            stamps.clear()
            call = time.time()
            q.enqueue("noop", {"i": i})
            out.append({"call": call, "enqueued": time.time(), **stamps})
            time.sleep(gap)
    return out


STAGES = ("sent", "returned", "enqueued", "heard", "woken", "claim_sent", "claim_back", "started")


def _breakdown(enqueues: list[dict[str, float]], worker: dict[str, Any]) -> dict[str, Any]:
    heard, woken = worker["events"]["heard"], worker["events"]["woken"]
    by_task = {i: (s, b) for s, b, got in worker["claims"] for i in got}
    started = {int(k): v for k, v in worker["started"].items()}
    per_stage: dict[str, list[float]] = {s: [] for s in STAGES}
    total, total_from_return, poll, raced = [], [], 0, 0
    for i, e in enumerate(enqueues):
        if i not in started or i not in by_task:
            continue
        call, claim_sent = e["call"], by_task[i][0]
        h = next((t for t in heard if call <= t <= started[i]), None)
        w = next((t for t in woken if call <= t <= started[i]), None)
        if h is None or w is None:
            poll += 1  # claimed with no wake-up heard: the poll timer
            continue
        if w > claim_sent:
            raced += 1  # taken by a claim already on its way (sent after the commit, before the wake-up)
            continue
        t = {"call": call, "sent": e["sent"], "returned": e["returned"], "enqueued": e["enqueued"],
             "heard": h, "woken": w, "claim_sent": claim_sent, "claim_back": by_task[i][1], "started": started[i]}
        before = "call"
        for stage in STAGES:
            per_stage[stage].append((t[stage] - t[before]) * 1000)
            before = stage
        total.append((started[i] - call) * 1000)
        total_from_return.append((started[i] - e["enqueued"]) * 1000)
    if not total:
        raise RuntimeError("no task was picked up through a notification")
    rows = {stage: {"p50_ms": _pct(v, 50), "p99_ms": _pct(v, 99)} for stage, v in per_stage.items() if v}
    return {"samples": len(total), "woken_by_poll": poll, "claim_already_sent": raced, "stages": rows,
            "total": {"p50_ms": _pct(total, 50), "p99_ms": _pct(total, 99)},
            "from_return": {"p50_ms": _pct(total_from_return, 50), "p99_ms": _pct(total_from_return, 99)}}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pickup_stages", description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("LEASEQ_BENCH_DSN") or os.environ.get("LEASEQ_TEST_PG_DSN")
                        or "postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--gap", type=float, default=0.02)
    parser.add_argument("--async", dest="use_async", action="store_true", help="enqueue with the asyncio queue")
    parser.add_argument("--json", help="write the report and every stamp to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.tasks)
        return
    with BenchDatabase(args.dsn) as db:
        dsn = with_search_path(db.dsn, "public")
        with leaseq.connect(dsn) as q:
            q.migrate()
        proc = subprocess.Popen([sys.executable, "-m", "bench.pickup_stages", "--worker", dsn,
                                 "--tasks", str(args.tasks)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "READY":
                raise RuntimeError("the worker did not start")
            enqueues = _enqueue_all(dsn, args.tasks, args.gap, args.use_async)
            result = next(json.loads(line[7:]) for line in proc.stdout if line.startswith("RESULT "))
        except BaseException:
            proc.kill()
            raise
        finally:
            proc.wait(timeout=60)
    report = _breakdown(enqueues, result)
    print(f"{report['samples']} samples; left out: {report['woken_by_poll']} claimed with no wake-up heard, "
          f"{report['claim_already_sent']} by a claim sent before the wake-up")
    if args.json:
        Path(args.json).write_text(json.dumps({"report": report, "enqueues": enqueues, "worker": result}))
    print(f"{'stage':<12} {'p50 ms':>8} {'p99 ms':>8}")
    for stage, row in report["stages"].items():
        print(f"{stage:<12} {row['p50_ms']:8.3f} {row['p99_ms']:8.3f}")
    print(f"{'total':<12} {report['total']['p50_ms']:8.3f} {report['total']['p99_ms']:8.3f}")
    print(f"{'from return':<12} {report['from_return']['p50_ms']:8.3f} {report['from_return']['p99_ms']:8.3f}")


if __name__ == "__main__":
    main()
