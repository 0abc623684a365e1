"""Bounded load test of the queue service on loopback.

Starts ``leaseq serve`` as its own process on 127.0.0.1, enqueues the tasks
over HTTP, then runs N remote workers (threads, each with its own worker
token and RemoteQueue) that claim in batches, renew their leases in one
request per batch and complete each batch in one request. Afterwards it checks in the
database that no task was lost or completed twice, prints throughput and
p50/p99 request latency as a table, and writes the figures as JSON.

    python bench/service_load.py                  # 50 workers, 20,000 tasks, SQLite
    python bench/service_load.py --quick          # 10 workers, 1,000 tasks (CI)
    python bench/service_load.py --dsn postgresql://postgres@127.0.0.1:5432/test

A PostgreSQL DSN gets a fresh schema, dropped afterwards. Exit status 1 if
a task was lost or completed twice. For remote worker *processes* (the real
runtime) against direct ones in the same run, see ``python -m bench.remote``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import leaseq
from leaseq import access
from leaseq.client import RemoteQueue


class Recorder:
    """Request latencies by operation, thread-safe."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.lock = threading.Lock()

    @contextmanager
    def timed(self, op: str) -> Any:
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            with self.lock:
                self.samples[op].append(elapsed)

    def summary(self, wall: float) -> dict[str, dict[str, float]]:
        out = {}
        for op, values in sorted(self.samples.items()):
            values.sort()
            out[op] = {"requests": len(values), "per_second": round(len(values) / wall, 1),
                       "p50_ms": round(1000 * values[len(values) // 2], 2),
                       "p99_ms": round(1000 * values[min(len(values) - 1, int(len(values) * 0.99))], 2),
                       "mean_ms": round(1000 * statistics.fmean(values), 2)}
        return out


@contextmanager
def database(dsn: str | None) -> Any:
    """A fresh database: a temporary SQLite file, or a new schema in the PostgreSQL DSN."""
    if dsn is None or dsn.startswith("sqlite"):
        with tempfile.TemporaryDirectory() as tmp:
            yield dsn or f"sqlite:///{tmp}/bench.db"
        return
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in dsn else "?"
    try:
        yield f"{dsn}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@contextmanager
def service(dsn: str) -> Any:
    """``leaseq serve`` in its own process on a free loopback port; yields its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "leaseq.cli", "--dsn", dsn, "serve", "--host", "127.0.0.1",
                             "--port", "0", "--rate", "0", "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if m is None:
            raise SystemExit(f"the service did not start: {line}{proc.stderr.read() if proc.poll() else ''}")
        yield m.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.stderr.close()


def enqueue_all(url: str, token: str, total: int, threads: int, rec: Recorder) -> list[int]:
    ids: list[int] = []
    lock = threading.Lock()

    def run(part: range) -> None:
        rq = RemoteQueue(url, token)
        mine = []
        for n in part:
            with rec.timed("enqueue"):
                mine.append(rq.enqueue("bench", {"n": n}, queue="bench", idempotency_key=f"bench-{n}").id)
        rq.close()
        with lock:
            ids.extend(mine)

    parts = [range(i, total, threads) for i in range(threads)]
    workers = [threading.Thread(target=run, args=(p,)) for p in parts]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return ids


def work(url: str, token: str, total: int, batch: int, rec: Recorder, done: list[int], lock: threading.Lock,
         errors: list[str], stop: threading.Event) -> None:
    rq = RemoteQueue(url, token)
    try:
        with rec.timed("register"):
            w = rq.register_worker("bench")
        while not stop.is_set():
            with rec.timed("claim"):
                claims = rq.claim(w, queue="bench", limit=batch)
            if not claims:
                with lock:
                    if len(done) >= total:
                        return
                time.sleep(0.02)
                continue
            with rec.timed("renew"):
                renewed = rq.renew_leases(w, claims)
            if len(renewed) != len(claims):
                errors.append(f"renewal lost {len(claims) - len(renewed)} lease(s)")
            with rec.timed("complete"):  # the whole batch in one request, as the worker runtime does
                completed = rq.complete_many(w, [(c, {"by": w.id}) for c in claims])
            for c in claims:
                if c.task_id not in completed:
                    errors.append(f"task {c.task_id}: complete refused: lease lost")
            with lock:
                done.extend(sorted(completed))
                if len(done) >= total:
                    stop.set()
    except Exception as exc:  # reported, and the run fails
        errors.append(f"worker crashed: {type(exc).__name__}: {exc}")
    finally:
        rq.close()


def verify(q: leaseq.Queue, ids: list[int], done: list[int]) -> dict[str, int]:
    """Count lost and doubly completed tasks, from the workers' view and the database's."""
    completed_twice = len(done) - len(set(done))
    not_completed = len(set(ids) - set(done))
    stored = {t.id: t for t in q.list_tasks(queue="bench", limit=len(ids) + 10)}
    db_not_completed = sum(1 for i in ids if stored.get(i) is None or stored[i].status != "completed")
    db_reclaimed = sum(1 for i in ids if i in stored and stored[i].claim_generation != 1)
    return {"tasks": len(ids), "completed_by_workers": len(done), "completed_twice": completed_twice,
            "lost": not_completed, "not_completed_in_db": db_not_completed, "claimed_more_than_once": db_reclaimed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("LEASEQ_BENCH_DSN"),
                        help="database (default: a temporary SQLite file)")
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10, help="claim limit per request")
    parser.add_argument("--enqueue-threads", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="10 workers, 1,000 tasks")
    parser.add_argument("--json", default=os.path.join(tempfile.gettempdir(), "leaseq-service-load.json"),
                        help="where to write the figures (default: in the temporary folder)")
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.tasks = 10, 1_000

    with database(args.dsn) as dsn:
        q = leaseq.connect(dsn)
        q.migrate()
        admin_token, _ = access.create_token(q, name="bench-enqueue", role="operator")
        worker_tokens = [access.create_token(q, name=f"bench-{i}", role="worker", all_queues=True)[0]
                         for i in range(args.workers)]
        rec = Recorder()
        with service(dsn) as url:
            started = time.perf_counter()
            ids = enqueue_all(url, admin_token, args.tasks, args.enqueue_threads, rec)
            enqueue_wall = time.perf_counter() - started
            done: list[int] = []
            errors: list[str] = []
            lock, stop = threading.Lock(), threading.Event()
            threads = [threading.Thread(target=work, args=(url, tok, args.tasks, args.batch, rec, done, lock,
                                                           errors, stop)) for tok in worker_tokens]
            started = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            work_wall = time.perf_counter() - started
        checks = verify(q, ids, done)
        dialect = q.dialect
        q.close()

    requests = sum(len(v) for op, v in rec.samples.items() if op != "enqueue")
    report = {
        "backend": dialect, "workers": args.workers, "tasks": args.tasks, "batch": args.batch,
        "enqueue_seconds": round(enqueue_wall, 2), "enqueue_per_second": round(args.tasks / enqueue_wall, 1),
        "work_seconds": round(work_wall, 2), "tasks_per_second": round(args.tasks / work_wall, 1),
        "worker_requests_per_second": round(requests / work_wall, 1),
        "latency": {op: s for op, s in rec.summary(work_wall).items()},
        "checks": checks, "errors": errors[:20],
    }
    report["latency"]["enqueue"] = rec.summary(enqueue_wall)["enqueue"]
    with open(args.json, "w") as fh:
        json.dump(report, fh, indent=2)

    print(f"\nleaseq service load: {args.workers} remote workers, {args.tasks} tasks, {dialect}, batch {args.batch}")
    print(f"enqueue: {report['enqueue_per_second']} tasks/s over HTTP; "
          f"work: {report['tasks_per_second']} tasks/s, {report['worker_requests_per_second']} requests/s\n")
    print(f"{'operation':<10} {'requests':>9} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for op, s in report["latency"].items():
        print(f"{op:<10} {s['requests']:>9} {s['per_second']:>9} {s['p50_ms']:>8} {s['p99_ms']:>8} {s['mean_ms']:>8}")
    print(f"\nchecks: {checks}")
    if errors:
        print(f"errors ({len(errors)}): {errors[:5]}")
    print(f"figures written to {args.json}")
    ok = checks["lost"] == 0 and checks["completed_twice"] == 0 and checks["not_completed_in_db"] == 0 and not errors
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
