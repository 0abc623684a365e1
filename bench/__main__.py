"""``python -m bench``: run the workloads, alternate the systems, write JSON, Markdown and plots."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from . import agent, budgets, report, systems, workloads
from .database import BenchDatabase, display_dsn, server_facts
from .targets import check_targets

WORKLOADS = ("enqueue", "async-enqueue", "drain", "latency", "heartbeat", "depth", "evidence", "agent", "leases", "limits", "budgets",
             "starvation")
PEERS = ("leaseq", "leaseq-roles", "pgqueuer", "pgqueuer-psycopg", "procrastinate", "raw")


@dataclass(frozen=True)
class Sizes:
    """How big each workload is. ``FULL`` fits in about ten minutes on two cores."""

    rounds: int = 3
    enqueue_one: int = 2_000
    enqueue_batch: int = 20_000
    #: async-enqueue: tasks enqueued one per call from asyncio callers, by 1 and by many at once
    enqueue_async: int = 4_000
    enqueue_callers: tuple[int, ...] = (1, 50)
    drain: int = 20_000
    #: procrastinate drains about a hundred tasks a second here: a smaller
    #: queue gives the same rate without a quarter of an hour per round
    drain_procrastinate: int = 2_000
    latency_tasks: int = 200
    latency_gap: float = 0.02
    heartbeat_leases: int = 1_000
    heartbeat_workers: int = 10
    heartbeat_seconds: float = 60.0
    #: also hold leases with the peers, and with fewer leases or workers (proportionality)
    heartbeat_everything: bool = True
    #: drain with two worker processes for every system (else for leaseq only)
    two_processes_everywhere: bool = True
    depths: tuple[int, ...] = (1_000, 10_000, 100_000)
    depth_sample: int = 10_000
    history: int = 0
    evidence_tasks: int = 20_000
    #: agent: handlers awaiting agent_io seconds (a model call), one process at agent_concurrency
    agent_tasks: int = 2_000
    agent_concurrency: int = 200
    agent_io: float = 0.2
    #: also through `leaseq serve` (remote workers)
    agent_remote: bool = True
    #: leases: this many held at once by leases_workers processes, for heartbeat_seconds
    leases_held: int = 10_000
    leases_workers: int = 10
    #: limits: a drain of this many tasks with no limit key, a limit that never binds, a binding cap
    limits_tasks: int = 10_000
    limits_cap: int = 4
    #: budgets: tasks reserving one call's worth of a per_minute window, worked by threads that
    #: settle each call's usage; and claims timed one at a time, with and without the window
    budgets_tasks: int = 2_000
    budgets_threads: int = 4
    budgets_total: int = 50_000
    budgets_units: int = 100
    budgets_claims: int = 2_000
    #: starvation: one tenant's backlog, then another's few tasks, drained by 4 processes × 10
    starvation_backlog: int = 100_000
    starvation_late: int = 10


FULL = Sizes()
QUICK = Sizes(rounds=1, enqueue_one=100, enqueue_batch=2_000, enqueue_async=200, drain=1_000, drain_procrastinate=200,
              latency_tasks=20, latency_gap=0.01, heartbeat_leases=40, heartbeat_workers=2, heartbeat_seconds=1.0,
              heartbeat_everything=False, two_processes_everywhere=False,
              depths=(1_000, 5_000), depth_sample=1_000, evidence_tasks=1_000,
              agent_tasks=200, agent_concurrency=50, agent_io=0.05, leases_held=200, leases_workers=2,
              limits_tasks=1_000, budgets_tasks=200, budgets_total=5_000, budgets_claims=200,
              starvation_backlog=2_000)


def plan(workload: str, sizes: Sizes, chosen: list[str], rnd: int = 1) -> list[tuple[str, str, Any]]:
    """``(config, system, trial)`` for round ``rnd`` of ``workload``, in the order they alternate."""
    peers = [s for s in PEERS if s in chosen]
    trials: list[tuple[str, str, Any]] = []
    if workload == "enqueue":
        config = f"{sizes.enqueue_one:,} one by one, {sizes.enqueue_batch:,} in batches"
        for s in peers + [s for s in ("leaseq-sqlite",) if s in chosen]:
            trials.append((config, s, lambda db, sy: workloads.enqueue(db, sy, one=sizes.enqueue_one,
                                                                         batch=sizes.enqueue_batch)))
    elif workload == "async-enqueue":
        for callers in sizes.enqueue_callers:
            config = f"{sizes.enqueue_async:,} tasks, {callers} caller{'s' if callers > 1 else ''}"
            for s in [s for s in peers if s != "procrastinate"]:
                trials.append((config, s, lambda db, sy, c=callers: workloads.enqueue_async(
                    db, sy, tasks=sizes.enqueue_async, callers=c)))
    elif workload == "drain":
        for processes in (1, 2):
            config = f"{processes} process{'es' if processes > 1 else ''} × 10"
            for s in peers:
                if processes > 1 and s not in ("leaseq", "leaseq-roles") and not sizes.two_processes_everywhere:
                    continue
                n = sizes.drain_procrastinate if s == "procrastinate" else sizes.drain
                trials.append((config, s, lambda db, sy, p=processes, n=n: workloads.drain(db, sy, tasks=n, processes=p)))
        if "leaseq-sqlite" in chosen:
            trials.append(("embedded, 1 process × 10", "leaseq-sqlite",
                           lambda db, sy: workloads.drain(db, sy, tasks=sizes.drain)))
    elif workload == "latency":
        for s in peers:  # raw: a LISTEN and the guarded claim on the event loop, the ceiling
            trials.append(("idle worker", s, lambda db, sy: workloads.latency(db, sy, tasks=sizes.latency_tasks,
                                                                               gap=sizes.latency_gap)))
    elif workload == "heartbeat":
        leases, workers = sizes.heartbeat_leases, sizes.heartbeat_workers
        shapes = [(leases, workers)]
        if "leaseq" in chosen and sizes.heartbeat_everything:  # proportional to workers, not to leases?
            shapes += [(leases // 10, workers), (leases, max(1, workers // 2))]
        for lea, wor in shapes:
            for s in [s for s in peers if s not in ("raw", "pgqueuer-psycopg")]:
                if s != "leaseq" and ((lea, wor) != (leases, workers) or not sizes.heartbeat_everything):
                    continue
                trials.append((f"{lea:,} / {wor}", s, lambda db, sy, lea=lea, wor=wor: workloads.heartbeat(
                    db, sy, leases=lea, workers=wor, seconds=sizes.heartbeat_seconds)))
    elif workload == "depth":
        beside = sizes.depths[min(1, len(sizes.depths) - 1)]
        shapes = [(d, 0) for d in sizes.depths] + ([(beside, sizes.history)] if sizes.history else [])
        for queued, finished in shapes:
            if rnd > 1 and max(queued, finished) >= 1_000_000:
                continue  # a million rows take minutes to write: one round only
            config = f"{queued:,} queued" + (f" + {finished:,} finished" if finished else "")
            for s in [s for s in ("leaseq", "raw") if s in chosen]:
                trials.append((config, s, lambda db, sy, q=queued, f=finished: workloads.depth(
                    db, sy, queued=q, finished=f, sample=sizes.depth_sample)))
    elif workload == "evidence":
        for s in [s for s in ("leaseq", "leaseq-compact") if s in chosen or s == "leaseq"]:
            trials.append(("1 process × 10", s, lambda db, sy: workloads.drain(db, sy, tasks=sizes.evidence_tasks)))
    elif workload == "agent":
        shape = dict(tasks=sizes.agent_tasks, concurrency=sizes.agent_concurrency, io_seconds=sizes.agent_io)
        where = f"1 process × {sizes.agent_concurrency}, {sizes.agent_io * 1000:.0f} ms"
        for s in [s for s in ("leaseq", "leaseq-sqlite") if s in chosen]:
            trials.append((f"direct, {where}", s, lambda db, sy: agent.agent(db, sy, **shape)))
        if "leaseq" in chosen and sizes.agent_remote:
            trials.append((f"remote (leaseq serve), {where}", "leaseq",
                           lambda db, sy: agent.agent(db, sy, remote=True, **shape)))
            # the same worker leasing a quarter of its slots ahead (--prefetch): a wave of handlers
            # that end together starts the next ones at once, not a request later
            ahead = max(1, sizes.agent_concurrency // 4)
            trials.append((f"remote (leaseq serve), prefetch {ahead}, {where}", "leaseq",
                           lambda db, sy: agent.agent(db, sy, remote=True, prefetch=ahead, **shape)))
    elif workload == "limits":
        # what a limit costs a claim: the same drain with no limit key, with a key whose limit
        # never binds (max_running above the workers' concurrency), and with a binding cap
        for config, limit in (("no limit key", None), ("limit key, never binding", {"key": "api", "max_running": 1000}),
                              (f"limit key, max_running {sizes.limits_cap}",
                               {"key": "api", "max_running": sizes.limits_cap})):
            for s in [s for s in ("leaseq", "leaseq-sqlite") if s in chosen]:
                trials.append((f"1 process × 10, {config}", s, lambda db, sy, limit=limit: workloads.drain(
                    db, sy, tasks=sizes.limits_tasks, limit=limit)))
    elif workload == "budgets":
        # the worst overshoot of a per_minute window with usage settled after each call, and what the
        # window costs a claim (one at a time, timed: no limit key, then a window and its settlement)
        over = (f"{sizes.budgets_tasks:,} tasks × {sizes.budgets_units} units, per_minute "
                f"{sizes.budgets_total:,}, {sizes.budgets_threads} workers")
        for s in [s for s in ("leaseq", "leaseq-sqlite") if s in chosen]:
            trials.append((over, s, lambda db, sy: budgets.overshoot(
                db, sy, tasks=sizes.budgets_tasks, threads=sizes.budgets_threads, total=sizes.budgets_total,
                units=sizes.budgets_units)))
            for config, windows in (("claim cost, no limit key", False),
                                    ("claim cost, per_minute window, usage settled", True)):
                trials.append((config, s, lambda db, sy, windows=windows: budgets.claim_cost(
                    db, sy, claims=sizes.budgets_claims, windows=windows)))
    elif workload == "starvation":
        # a tenant's deep backlog, then another tenant's few tasks: how long those wait, with
        # fairness keys and without, and what the keys cost the drain
        for fair in (True, False):
            keys = "fairness keys" if fair else "no keys"
            for s, processes in (("leaseq", 4), ("leaseq-sqlite", 1)):
                if s in chosen:
                    trials.append((f"{processes} process{'es' if processes > 1 else ''} × 10, {keys}", s,
                                   lambda db, sy, fair=fair, processes=processes: workloads.starvation(
                                       db, sy, backlog=sizes.starvation_backlog, late=sizes.starvation_late,
                                       processes=processes, fair=fair)))
    elif workload == "leases" and "leaseq" in chosen:
        held = f"{sizes.leases_held:,} / {sizes.leases_workers}"
        for config, lease in ((f"{held}, 30 s leases", None),
                              (f"{held}, 1 h leases (no renewal in the window)", 3600.0)):
            trials.append((config, "leaseq", lambda db, sy, lease=lease: agent.leases(
                db, sy, leases=sizes.leases_held, workers=sizes.leases_workers, seconds=sizes.heartbeat_seconds,
                lease_seconds=lease)))
    return trials


def machine() -> dict[str, Any]:
    """The box these numbers come from."""
    facts: dict[str, Any] = {"nproc": os.cpu_count(), "python": platform.python_version(), "os": platform.platform()}
    try:
        meminfo = Path("/proc/meminfo").read_text().split("\n")[0].split()
        facts["memory_gb"] = round(int(meminfo[1]) / 1024 / 1024, 1)
        model = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")]
        facts["cpu"] = model[0].split(":", 1)[1].strip() if model else "?"
    except OSError:
        pass
    return facts


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["soak"]:  # sustained churn, reported each minute: a command of its own (bench/soak.py)
        from . import soak

        return soak.main(given[1:])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     epilog="python -m bench soak --minutes N: sustained enqueue and drain "
                                            "at a fixed rate (python -m bench soak --help)")
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help=f"which workloads (default: all of {', '.join(WORKLOADS)})")
    parser.add_argument("--quick", action="store_true", help="the small configuration CI runs (one round)")
    parser.add_argument("--rounds", type=int, help="rounds per workload (default 3, --quick 1)")
    parser.add_argument("--systems", default=",".join(systems.NAMES),
                        help="comma-separated subset of " + ", ".join(systems.NAMES))
    parser.add_argument("--dsn", default=os.environ.get("LEASEQ_BENCH_DSN") or os.environ.get("LEASEQ_TEST_PG_DSN")
                        or "postgresql://postgres@127.0.0.1:5432/postgres",
                        help="a PostgreSQL server URL; the run creates and drops its own database there")
    parser.add_argument("--out", default="bench-results", help="folder for results.json, results.md and plots")
    parser.add_argument("--depth-million", action="store_true",
                        help="add the 10^6-deep queue and the 10^6-task history to the depth workload")
    parser.add_argument("--heartbeat-seconds", type=float, help="length of each heartbeat window")
    parser.add_argument("--report-only", metavar="RESULTS_JSON",
                        help="run nothing: rewrite results.md and the plots in --out from an earlier results.json")
    args = parser.parse_args(argv)
    if args.report_only:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        return write_report(json.loads(Path(args.report_only).read_text()), out)

    sizes = QUICK if args.quick else FULL
    if args.rounds:
        sizes = replace(sizes, rounds=args.rounds)
    if args.heartbeat_seconds:
        sizes = replace(sizes, heartbeat_seconds=args.heartbeat_seconds)
    if args.depth_million:
        sizes = replace(sizes, depths=(*sizes.depths, 1_000_000), history=1_000_000)
    wrong = [w for w in args.workloads if w not in WORKLOADS]
    if wrong:
        parser.error(f"unknown workload {', '.join(wrong)}; choose from {', '.join(WORKLOADS)}")
    chosen = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(chosen) - set(systems.NAMES)
    if unknown:
        parser.error(f"--systems: unknown {', '.join(sorted(unknown))}; choose from {', '.join(systems.NAMES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    chosen_workloads = args.workloads or list(WORKLOADS)
    trials: list[dict[str, Any]] = []
    started = time.monotonic()
    with BenchDatabase(args.dsn) as db:
        for workload in chosen_workloads:
            rounds = 1 if workload in ("heartbeat", "leases") else sizes.rounds
            for rnd in range(1, rounds + 1):
                for config, name, trial in plan(workload, sizes, chosen, rnd):
                    record: dict[str, Any] = {"workload": workload, "config": config, "system": name, "round": rnd}
                    t0 = time.monotonic()
                    for attempt in (1, 2):
                        try:
                            metrics = trial(db, systems.get(name))
                            samples = metrics.pop("samples_ms", None)
                            record["metrics"] = metrics
                            if samples is not None:
                                record["samples"] = samples
                            record.pop("error", None)
                            break
                        except Exception as exc:  # one failed trial is reported (after one retry), not fatal
                            record["error"] = f"{type(exc).__name__}: {exc}"
                            record["retried"] = attempt
                    record["wall_s"] = round(time.monotonic() - t0, 2)
                    record["load1"] = round(os.getloadavg()[0], 2)  # others' work on the box skews a trial
                    trials.append(record)
                    shown = record.get("error") or ", ".join(f"{k}={report._fmt(v)}" for k, v in record["metrics"].items()
                                                             if isinstance(v, (int, float)))
                    print(f"[{time.monotonic() - started:6.0f}s] {workload} r{rnd} {config} {name}: {shown}",
                          file=sys.stderr, flush=True)
        facts = server_facts(db.dsn)

    summary = report.summarise(trials)
    versions = {name: systems.get(name).version() for name in chosen if name in PEERS}
    document = {
        "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "dsn": display_dsn(args.dsn), "machine": machine(), "server": facts, "versions": versions,
        "sizes": asdict(sizes), "seconds": round(time.monotonic() - started, 1), "trials": trials,
        "summary": [{"workload": w, "config": c, "system": s, "metrics": m} for (w, c, s), m in summary.items()],
        "targets": check_targets(summary),
    }
    (out / "results.json").write_text(json.dumps(document, indent=1, default=str))
    return write_report(document, out)


def write_report(document: dict[str, Any], out: Path) -> int:
    """results.md and the plots from a run's document; prints the tables. 1 if a trial failed."""
    trials = document["trials"]
    summary = report.summarise(trials)
    tables = report.markdown(summary)
    targets_md = "\n".join(["| target | measured | met |", "|---|---|---|"] +
                           [f"| {t['target']} | {t['measured']} | {t['met']} |" for t in check_targets(summary)])
    failed = [t for t in trials if "error" in t]
    errors_md = ("\n\n### failed trials\n\n" + "\n".join(f"- {t['workload']} {t['config']} {t['system']} "
                                                          f"round {t['round']}: {t['error']}" for t in failed)
                 if failed else "")
    (out / "results.md").write_text(f"{tables}\n### targets\n\n{targets_md}{errors_md}\n")
    plots = report.plots(trials, summary, out)
    print(f"{tables}\n### targets\n\n{targets_md}{errors_md}\n")
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}" + "".join(f", {p}" for p in plots)
          + f" in {document['seconds']:.0f}s", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
