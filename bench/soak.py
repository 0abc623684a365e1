"""``python -m bench soak --minutes N``: sustained enqueue and drain at a fixed rate, measured each minute.

The question is whether a queue under steady churn stays the same: the same
claim latency and the same table sizes in its thirtieth minute as in its
first. Every claim and completion leaves a dead row version behind, and
retention deletes ended tasks; whether autovacuum keeps up (the settings of
migration 24) and retention's bounded batches keep the tables flat is what
the minutes show.

One process enqueues ``--rate`` tasks a second (a batch every 0.1 s) and runs
retention every 10 s (``Queue.prune``: ended tasks and their evidence record
older than ``--retention`` seconds, in batches of 1,000, one transaction
each). ``--workers`` processes claim (``--batch`` at a time) and complete
what they claim, polling every 20 ms when nothing is due. At the end of each
minute it reports the minute's claims (the ``claim`` call's duration, p50 and
p99, and the pickup: enqueue to claim), tasks completed, the queue's depth,
and each hot table's live and dead rows and its heap and index sizes. The
verdict compares the last minute with the first: claim latency (p50) and the
hot tables' total size each within 20 %.

Results go to ``--out`` (``soak.json`` and ``soak.md``). The database is a
fresh one on the ``--dsn`` server, dropped at the end, as for the other
workloads.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from .database import BenchDatabase, display_dsn

#: The tables every claim, completion and retention pass changes.
HOT_TABLES = ("leaseq_tasks", "leaseq_events", "leaseq_evidence", "leaseq_workers", "leaseq_audit")
#: How close the last minute must stay to the first (a fraction).
FLAT = 0.20


def _worker(dsn: str, index: int, batch: int, stop: Any, out: Any) -> None:
    """One claiming process: claim, complete, report each claim's (seconds, pickups) on ``out``."""
    import leaseq

    out.cancel_join_thread()  # what is left unread at the end is dropped: the process exits at once
    q = leaseq.connect(dsn, max_size=2)
    w = q.register_worker(f"soak-{index}")
    try:
        while not stop.is_set():
            started = time.perf_counter()
            claims = q.claim(w, limit=batch)
            took = time.perf_counter() - started
            now = time.time()
            pickups = [now - c.task.payload["t"] for c in claims]
            out.put((now, took, pickups))
            if claims:
                q.complete_many(w, [(c, None) for c in claims])
            else:
                time.sleep(0.02)
    finally:
        q.stop_worker(w)
        q.close()


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _tables(conn: psycopg.Connection) -> dict[str, dict[str, int]]:
    """Live and dead rows, heap and index bytes, and autovacuum runs of each hot table."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    out = {}
    for name in HOT_TABLES:
        row = conn.execute(
            "SELECT coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0), pg_table_size(c.oid), "
            "pg_indexes_size(c.oid), coalesce(s.autovacuum_count, 0) "
            "FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
            "WHERE c.oid = to_regclass(%s)", (name,)).fetchone()
        if row is not None:
            out[name] = dict(zip(("live", "dead", "heap_bytes", "index_bytes", "autovacuums"), map(int, row)))
    return out


def run(dsn: str, *, minutes: float, rate: float, workers: int, batch: int, retention: float,
        report: Any = print, minute_seconds: float = 60.0, warmup: int = 3) -> dict[str, Any]:
    """The soak on the migrated schema at ``dsn``; returns the document written as soak.json.
    (``minute_seconds``: the length of a reported "minute", shorter in the test of this module.)"""
    import leaseq
    from leaseq.db.dsn import split_leaseq_options

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    claims_out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(dsn, i, batch, stop, claims_out), daemon=True)
             for i in range(workers)]
    for p in procs:
        p.start()
    q = leaseq.connect(dsn)
    # (prepares nothing: the DSN may reach the schema through a transaction-mode pooler)
    probe = psycopg.connect(split_leaseq_options(dsn)[0], autocommit=True, prepare_threshold=None)
    halt = threading.Event()
    enqueued = [0]
    pruned = {"tasks": 0, "evidence_pruned": 0, "passes": 0}

    def enqueue() -> None:
        tick, per_tick = 0.1, rate * 0.1
        owed, next_at = 0.0, time.monotonic()
        while not halt.is_set():
            owed += per_tick
            n = int(owed)
            owed -= n
            if n:
                q.enqueue_many("soak", [{"t": time.time()} for _ in range(n)])
                enqueued[0] += n
            next_at += tick
            halt.wait(max(0.0, next_at - time.monotonic()))

    def retain() -> None:
        while not halt.wait(min(10.0, minute_seconds / 3)):
            done = q.prune(retention, evidence_older_than_seconds=retention, batch=1000, by="soak",
                           record_empty=False)
            pruned["tasks"] += done["tasks"]
            pruned["evidence_pruned"] += done["evidence_pruned"]
            pruned["passes"] += 1

    threads = [threading.Thread(target=enqueue, daemon=True), threading.Thread(target=retain, daemon=True)]
    for t in threads:
        t.start()
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        for minute in range(1, int(minutes) + 1):
            end = started + minute_seconds * minute
            took: list[float] = []
            pickups: list[float] = []
            while time.monotonic() < end:
                try:
                    _, seconds, picked = claims_out.get(timeout=max(0.01, min(1.0, end - time.monotonic())))
                except Exception:  # queue.Empty: nothing reported within the wait
                    continue
                took.append(seconds)
                pickups.extend(picked)
            depth = probe.execute("SELECT count(*) FROM leaseq_tasks WHERE status = 'queued'").fetchone()
            tables = _tables(probe)
            sample = {
                "minute": minute, "claims": len(took), "completed": len(pickups),
                "claim_p50_ms": _ms(_pct(took, 50)), "claim_p99_ms": _ms(_pct(took, 99)),
                "pickup_p50_ms": _ms(_pct(pickups, 50)), "pickup_p99_ms": _ms(_pct(pickups, 99)),
                "queued": int(depth[0]) if depth else 0, "enqueued": enqueued[0], "pruned": dict(pruned),
                "tables": tables,
                "hot_bytes": sum(t["heap_bytes"] + t["index_bytes"] for t in tables.values()),
                "dead_rows": sum(t["dead"] for t in tables.values()),
            }
            samples.append(sample)
            report(_line(sample))
    finally:
        halt.set()
        stop.set()
        for t in threads:
            t.join(30)
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
        probe.close()
        q.close()
    return {"samples": samples, "verdict": verdict(samples, warmup)}


def server_settings(dsn: str) -> dict[str, str]:
    """The server's version and the settings that decide whether dead rows are reclaimed."""
    from leaseq.db.dsn import split_leaseq_options

    with psycopg.connect(split_leaseq_options(dsn)[0], autocommit=True, prepare_threshold=None) as conn:
        rows = conn.execute("SELECT name, setting FROM pg_settings WHERE name IN ('server_version', 'autovacuum', "
                            "'autovacuum_naptime', 'autovacuum_vacuum_cost_delay', 'autovacuum_max_workers')")
        return {name: value for name, value in rows.fetchall()}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 3)


def _line(s: dict[str, Any]) -> str:
    t = s["tables"].get("leaseq_tasks", {})
    return (f"minute {s['minute']:3d}: {s['completed']:6d} completed, claim p50 {s['claim_p50_ms']} ms "
            f"p99 {s['claim_p99_ms']} ms, pickup p50 {s['pickup_p50_ms']} ms, queued {s['queued']}, "
            f"tasks {t.get('live', 0)} live {t.get('dead', 0)} dead, hot tables {s['hot_bytes'] / 2**20:.1f} MiB, "
            f"dead rows {s['dead_rows']}")


def verdict(samples: list[dict[str, Any]], warmup: int = 0) -> dict[str, Any]:
    """Claim p50 and the hot tables' size of the last minute, and of the largest minute, against
    the first minute after ``warmup`` minutes (the tables fill up to the retention's worth of
    ended tasks, and to the dead rows autovacuum's first passes leave, before they can be
    flat): each within :data:`FLAT` of it. With fewer minutes than that, against the first."""
    if len(samples) < 2:
        return {"flat": None, "why": "fewer than two minutes"}
    start = min(max(0, warmup), len(samples) - 2)
    first, last, steady = samples[start], samples[-1], samples[start:]
    out: dict[str, Any] = {"reference_minute": first["minute"]}
    for key in ("claim_p50_ms", "hot_bytes"):
        a, b = first[key], last[key]
        peak = max((s[key] for s in steady if s[key] is not None), default=None)
        ratio = None if not a or b is None else b / a
        peak_ratio = None if not a or peak is None else peak / a
        out[key] = {"first": a, "last": b, "ratio": None if ratio is None else round(ratio, 3),
                    "peak": peak, "peak_ratio": None if peak_ratio is None else round(peak_ratio, 3),
                    "within": ratio is not None and abs(ratio - 1) <= FLAT
                    and peak_ratio is not None and peak_ratio - 1 <= FLAT}
    out["flat"] = all(v["within"] for v in out.values() if isinstance(v, dict))
    return out


def markdown(document: dict[str, Any]) -> str:
    """The minutes as a Markdown table, and the verdict."""
    rows = ["| minute | completed | claim p50 ms | claim p99 ms | pickup p50 ms | queued | tasks live/dead "
            "| events dead | tasks heap+idx MiB | hot tables MiB |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in document["samples"]:
        t = s["tables"].get("leaseq_tasks", {})
        e = s["tables"].get("leaseq_events", {})
        rows.append(f"| {s['minute']} | {s['completed']:,} | {s['claim_p50_ms']} | {s['claim_p99_ms']} "
                    f"| {s['pickup_p50_ms']} | {s['queued']:,} | {t.get('live', 0):,}/{t.get('dead', 0):,} "
                    f"| {e.get('dead', 0):,} | {(t.get('heap_bytes', 0) + t.get('index_bytes', 0)) / 2**20:.2f} "
                    f"| {s['hot_bytes'] / 2**20:.2f} |")
    v = document["verdict"]
    server = document.get("server") or {}
    lines = ["\n".join(rows), ""]
    if server:
        lines += [f"Server: PostgreSQL {server.get('server_version', '?')}, autovacuum {server.get('autovacuum', '?')} "
                  f"(naptime {server.get('autovacuum_naptime', '?')} s).", ""]
    if v.get("flat") is None:
        lines.append(f"Verdict: none ({v.get('why')}).")
    else:
        parts = [f"{k} {d['first']} -> {d['last']} (x{d['ratio']}; largest x{d['peak_ratio']})"
                 for k, d in v.items() if isinstance(d, dict)]
        lines.append(f"Last minute (and the largest) against minute {v['reference_minute']}, the first after "
                     f"the warm-up: {'; '.join(parts)}: {'flat (each within 20 %)' if v['flat'] else 'NOT flat'}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long (default 30)")
    parser.add_argument("--rate", type=float, default=100.0, help="tasks enqueued per second (default 100)")
    parser.add_argument("--workers", type=int, default=2, help="claiming processes (default 2)")
    parser.add_argument("--batch", type=int, default=10, help="tasks per claim (default 10)")
    parser.add_argument("--retention", type=float, default=30.0,
                        help="seconds an ended task (and its evidence record) is kept (default 30)")
    parser.add_argument("--dsn", default=os.environ.get("LEASEQ_BENCH_DSN") or os.environ.get("LEASEQ_TEST_PG_DSN")
                        or "postgresql://postgres@127.0.0.1:5432/postgres",
                        help="a PostgreSQL server URL; the run creates and drops its own database there")
    parser.add_argument("--queue-dsn", help="run in this schema instead (migrated first, kept afterwards): "
                                            "e.g. one reached through PgBouncer, with ?pooler=transaction")
    parser.add_argument("--private-server", action="store_true",
                        help="start a PostgreSQL server of the run's own (Debian's initdb and pg_ctl, the leaseq-chaos "
                             "package), with the server's defaults, autovacuum on; fsync off (the soak measures "
                             "churn, not durability), removed at the end")
    parser.add_argument("--warmup", type=int, default=3,
                        help="minutes the tables take to fill before the verdict's reference minute (default 3)")
    parser.add_argument("--out", default="bench-results/soak", help="folder for soak.json and soak.md")
    parser.add_argument("--minute-seconds", type=float, default=60.0, help=argparse.SUPPRESS)  # its test's
    args = parser.parse_args(argv)
    if args.minutes < 1:
        parser.error("--minutes: at least 1")
    import leaseq

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def soak_in(dsn: str) -> dict[str, Any]:
        with leaseq.connect(dsn) as q:
            q.migrate()
        facts.update(server_settings(dsn))
        if facts.get("autovacuum") != "on":
            print("warning: autovacuum is off on this server: nothing reclaims dead rows, and the tables grow "
                  "whatever the migrations set (run the soak where autovacuum is on)", file=sys.stderr, flush=True)
        return run(dsn, minutes=args.minutes, rate=args.rate, workers=args.workers, batch=args.batch,
                   retention=args.retention, report=lambda line: print(line, file=sys.stderr, flush=True),
                   minute_seconds=args.minute_seconds, warmup=args.warmup)

    facts: dict[str, str] = {}
    if args.queue_dsn:
        document = soak_in(args.queue_dsn)
    elif args.private_server:
        from leaseq_chaos.pgserver import ThrowawayPostgres

        with ThrowawayPostgres(max_connections=50) as server:
            args.dsn = server.dsn()
            facts["private_server"] = "yes (fsync off)"
            document = soak_in(server.create_database("soak"))
    else:
        with BenchDatabase(args.dsn) as db, db.schema("soak") as dsn:
            document = soak_in(dsn)
    document = {"command": "python -m bench soak " + " ".join(argv),
                "dsn": display_dsn(args.queue_dsn or args.dsn),
                "server": facts, "settings": {"minutes": args.minutes, "rate": args.rate, "workers": args.workers,
                             "batch": args.batch, "retention": args.retention, "warmup": args.warmup},
                **document}
    (out / "soak.json").write_text(json.dumps(document, indent=1))
    text = markdown(document)
    (out / "soak.md").write_text(text)
    print(text)
    return 0 if document["verdict"].get("flat") is not False else 1


if __name__ == "__main__":  # pragma: no cover - run as python -m bench soak
    sys.exit(main(sys.argv[1:]))
