"""One trial of each workload: fresh schema in, figures out.

Every function takes the run's :class:`~bench.database.BenchDatabase`, a
system and sizes, builds its own schema (or SQLite file), and returns a dict
of metrics. Rounds and alternation are the caller's business.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from . import systems
from .database import BenchDatabase
from .fill import fill_leaseq
from .processes import WorkerGroup


def _analyze(dsn: str) -> None:
    """Give the planner statistics after a bulk fill, as autovacuum would."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")


def _schema_or_file(db: BenchDatabase, system: systems.System):
    """A fresh PostgreSQL schema, or for the embedded system a fresh SQLite file."""
    if system.dialect == "sqlite":
        return _SqliteFile()
    return db.schema(system.name)


class _SqliteFile:
    def __enter__(self) -> str:
        self._dir = tempfile.TemporaryDirectory(prefix="leaseq-bench-")
        return f"sqlite:///{Path(self._dir.name) / 'bench.db'}"

    def __exit__(self, *exc: object) -> None:
        self._dir.cleanup()


def _close(system: systems.System) -> None:
    close = getattr(system, "close", None)
    if close is not None:
        close()


def enqueue(db: BenchDatabase, system: systems.System, *, one: int, batch: int) -> dict[str, Any]:
    """Tasks per second enqueued one at a time (one commit each) and in batches."""
    out: dict[str, Any] = {}
    with _schema_or_file(db, system) as dsn:
        system.install(dsn)
        started = time.perf_counter()
        system.enqueue_one(dsn, one)
        out["one_per_s"] = one / (time.perf_counter() - started)
    with _schema_or_file(db, system) as dsn:
        system.install(dsn)
        started = time.perf_counter()
        system.enqueue_batch(dsn, batch)
        out["batch_per_s"] = batch / (time.perf_counter() - started)
    return out


def enqueue_async(db: BenchDatabase, system: systems.System, *, tasks: int, callers: int) -> dict[str, Any]:
    """Tasks per second enqueued one per call (one commit each) from asyncio code: ``callers``
    coroutines on one event loop, each awaiting its calls one at a time, sharing one pool of
    :data:`systems.ASYNC_POOL` connections (1 caller: a script; 50: a web server under load)."""
    with _schema_or_file(db, system) as dsn:
        system.install(dsn)
        seconds = system.enqueue_async(dsn, tasks, callers)
    return {"per_s": tasks / seconds, "callers": callers}


def _clock(db: BenchDatabase, system: systems.System) -> float:
    return time.time() if system.dialect == "sqlite" else db.clock()


def drain(db: BenchDatabase, system: systems.System, *, tasks: int, processes: int = 1,
          concurrency: int = 10, limit: dict[str, Any] | None = None, prefetch: int = 0,
          tool_calls: int = 0) -> dict[str, Any]:
    """Worker start to last completion, as the database recorded it, for ``tasks`` queued tasks.

    ``limit`` (leaseq only): every task names the limit ``limit["key"]``, set
    with the rest of ``limit`` when there is more (else the key has no limit).
    ``tool_calls`` (leaseq only): each handler records that many tool calls."""
    with _schema_or_file(db, system) as dsn:
        system.install(dsn)
        if limit is None:
            system.enqueue_batch(dsn, tasks)
        else:
            settings = {k: v for k, v in limit.items() if k != "key"}
            if settings:
                system.set_limit(dsn, limit["key"], **settings)
            system.enqueue_batch(dsn, tasks, limits=[limit["key"]])
        if system.dialect == "postgres":
            _analyze(dsn)
        group = WorkerGroup(system.name, dsn, count=processes, concurrency=concurrency, prefetch=prefetch,
                            tool_calls=tool_calls).start()
        postgres = system.dialect == "postgres"
        before = db.backend_cpu() if postgres else {}
        seen: dict[int, float] = {}

        def finished() -> bool:
            # Backends go when their worker exits: sample their CPU while they live.
            if postgres:
                seen.update(db.backend_cpu())
            return system.finished(dsn)[0] >= tasks

        started = _clock(db, system)
        group.go()
        results = group.wait(finished=finished)
        count, first, last = system.finished(dsn)
    if count != tasks:
        raise RuntimeError(f"{system.name}: {count} of {tasks} tasks completed")
    db_cpu = sum(cpu - before.get(pid, 0.0) for pid, cpu in seen.items())
    tool_ms = sorted(1000 * s for r in results for s in r.get("tool_s", []))
    return {"tasks": tasks, "seconds": last - started, "per_s": tasks / (last - started),
            **({"tool_p50_ms": _pct(tool_ms, 50), "tool_p99_ms": _pct(tool_ms, 99)} if tool_ms else {}),
            "db_cpu_s": db_cpu if postgres else None,
            "steady_per_s": (tasks - 1) / (last - first) if last > first else None,
            "first_completion_s": first - started,
            "worker_rss_mb": max(r["max_rss_mb"] for r in results),
            "worker_cpu_s": sum(r["cpu_s"] for r in results)}


def starvation(db: BenchDatabase, system: systems.System, *, backlog: int, late: int = 10, processes: int = 4,
               concurrency: int = 10, fair: bool = True) -> dict[str, Any]:
    """Tenant A's ``backlog`` tasks are queued; once the workers have drained a tenth of them,
    tenant B enqueues ``late`` tasks, one at a time. How long B's tasks waited to be picked up
    (enqueue to claim, by the database's clock), and the drain's rate, start to last
    completion: with fairness keys (``fair``: A's and B's), or the same drain without any."""
    with _schema_or_file(db, system) as dsn:
        system.install(dsn)
        system.enqueue_batch(dsn, backlog, fairness_key="A" if fair else None)  # type: ignore[call-arg]
        if system.dialect == "postgres":
            _analyze(dsn)
        group = WorkerGroup(system.name, dsn, count=processes, concurrency=concurrency).start()
        postgres = system.dialect == "postgres"
        before = db.backend_cpu() if postgres else {}
        seen: dict[int, float] = {}

        def finished(target: int) -> bool:
            if postgres:  # backends go when their worker exits: sample their CPU while they live
                seen.update(db.backend_cpu())
            return system.finished(dsn)[0] >= target

        started = _clock(db, system)
        group.go()
        deadline = time.monotonic() + 600
        while not finished(backlog // 10) and time.monotonic() < deadline:
            time.sleep(0.005)
        ids = system.enqueue_each(dsn, late, fairness_key="B" if fair else None)  # type: ignore[attr-defined]
        results = group.wait(finished=lambda: finished(backlog + late))
        count, _, last = system.finished(dsn)
        waits = sorted(system.pickups_ms(dsn, ids))  # type: ignore[attr-defined]
    if count != backlog + late:
        raise RuntimeError(f"{system.name}: {count} of {backlog + late} tasks completed")
    return {"tasks": count, "seconds": last - started, "per_s": count / (last - started),
            "late_p50_ms": _pct(waits, 50), "late_p99_ms": _pct(waits, 99), "late_max_ms": waits[-1],
            "db_cpu_s": sum(cpu - before.get(pid, 0.0) for pid, cpu in seen.items()) if postgres else None,
            "worker_cpu_s": sum(r["cpu_s"] for r in results)}


def depth(db: BenchDatabase, system: systems.System, *, queued: int, finished: int, sample: int,
          concurrency: int = 10) -> dict[str, Any]:
    """Drain rate over the first ``sample`` tasks of a queue ``queued`` deep over ``finished`` history."""
    with db.schema(system.name) as dsn:
        system.install(dsn)
        if system.name in ("leaseq", "raw"):
            fill_leaseq(dsn, queued=queued, finished=finished)
        else:  # peers fill through their own client
            system.enqueue_batch(dsn, queued)
            _analyze(dsn)
        target = min(sample, queued)
        group = WorkerGroup(system.name, dsn, mode="count", target=target, concurrency=concurrency).start()
        started = db.clock()
        group.go()
        group.wait(finished=lambda: system.finished(dsn)[0] - finished >= target)
        count, _, last = system.finished(dsn)
        count -= finished if system.name in ("leaseq", "raw") else 0
    return {"queued": queued, "finished": finished, "tasks": count, "per_s": count / (last - started)}


def latency(db: BenchDatabase, system: systems.System, *, tasks: int, gap: float) -> dict[str, Any]:
    """Milliseconds from the enqueue call to the handler's start, one task at a time into an idle worker."""
    commits: dict[int, float] = {}
    with db.schema(system.name) as dsn:
        system.install(dsn)
        group = WorkerGroup(system.name, dsn, mode="latency", concurrency=10).start()
        group.go()
        time.sleep(0.5)  # the worker reaches its idle wait
        try:
            for i in range(tasks):
                commits[i] = time.time()  # from the call the user makes, its round trip included
                system.enqueue_timed(dsn, i)
                time.sleep(gap)
            deadline = time.monotonic() + 10
            while system.finished(dsn)[0] < tasks and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            _close(system)
        [result] = group.stop()
    starts = {int(k): v for k, v in result["starts"].items()}
    samples = sorted((starts[i] - commits[i]) * 1000 for i in commits if i in starts)
    if len(samples) < tasks:
        raise RuntimeError(f"{system.name}: {tasks - len(samples)} of {tasks} tasks never started")
    return {"tasks": tasks, "p50_ms": _pct(samples, 50), "p90_ms": _pct(samples, 90), "p99_ms": _pct(samples, 99),
            "max_ms": samples[-1], "mean_ms": statistics.fmean(samples), "samples_ms": samples}


def _pct(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    k = max(0, min(len(sorted_values) - 1, round(p / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


def heartbeat(db: BenchDatabase, system: systems.System, *, leases: int, workers: int,
              seconds: float, lease_seconds: float | None = None) -> dict[str, Any]:
    """Database load while ``workers`` processes hold ``leases`` leases between them for ``seconds``."""
    with db.schema(system.name) as dsn:
        system.install(dsn)
        system.enqueue_batch(dsn, leases)
        _analyze(dsn)
        group = WorkerGroup(system.name, dsn, count=workers, mode="hold",
                            concurrency=leases // workers, lease_seconds=lease_seconds).start()
        group.go()
        deadline = time.monotonic() + 60
        while (held := system.running(dsn)) < leases and time.monotonic() < deadline:
            time.sleep(0.2)
        if held < leases:
            group.kill()
            raise RuntimeError(f"{system.name}: only {held} of {leases} leases taken")
        # Autovacuum's transactions count in pg_stat_database too: measure a
        # window in which it did not run (catalog clean-up after the earlier
        # trials' dropped schemas can keep it busy for minutes).
        # The probe's own statements are transactions too: they are counted
        # and taken off (one per second, plus the counters' own few).
        with db.probe() as probe:
            for attempt in range(3):
                deadline = time.monotonic() + 120
                while db.maintenance_running(probe) and time.monotonic() < deadline:
                    time.sleep(1)
                db.wait_stats_flushed()
                before = db.counters(probe)
                own, disturbed = 2, False
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    disturbed |= db.maintenance_running(probe)
                    own += 1
                    time.sleep(min(1.0, max(0.0, end - time.monotonic())))
                db.wait_stats_flushed()
                after = db.counters(probe)
                if not disturbed:
                    break
        results = group.stop()
    window = after.at - before.at
    # Counted by the workers themselves (leaseq's runner reports them): on a shared
    # server pg_stat_database also counts the transactions idle backends run to
    # absorb other databases' catalog changes.
    renewals = [r["renewal_statements"] / r["run_s"] for r in results if r.get("run_s")]
    return {"leases": leases, "workers": workers, "seconds": window, "autovacuum_in_window": int(disturbed),
            "renewals_per_worker_s": statistics.fmean(renewals) if renewals else None,
            "transactions_per_s": max(0, after.transactions - before.transactions - own) / window,
            "rows_updated_per_s": (after.tuples_updated - before.tuples_updated) / window,
            "db_cpu_percent": 100 * (after.backend_cpu - before.backend_cpu) / window,
            "worker_rss_mb": max(r["max_rss_mb"] for r in results)}
