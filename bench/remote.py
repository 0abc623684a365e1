"""Remote workers against direct ones, side by side in one run: ``python -m bench.remote``.

Two workloads, each alternating direct and remote trials round by round on
fresh schemas of one benchmark database:

* drain: ``--processes`` worker processes (``--concurrency`` each, no-op
  handlers) drain ``--tasks`` queued tasks, either straight from PostgreSQL
  or through one ``leaseq serve`` process over HTTP (same runtime, same
  handlers); tasks per second from the first claim to the last completion
  as the database recorded it (``--service-processes 1,2`` runs the remote
  trial once per count, the service as ``leaseq serve --processes N``;
  ``--tool-calls N``: each handler records N tool calls through ``ctx.tool``,
  two ledger writes each, what an agent's tool use costs over HTTP);
* pickup latency: one idle worker process; tasks are enqueued one at a time
  (straight into the database), and the time from the enqueue's commit to
  the handler's start is recorded (p50, p99).

The machine is shared and noisy: quote the medians over rounds and the
remote/direct ratio of the same round. Writes the figures as JSON.

    python -m bench.remote --dsn postgresql://postgres@127.0.0.1:5432/test
    python -m bench.remote --dsn ... --quick      # one small round (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from . import systems, workloads
from .database import BenchDatabase

def modes(service_processes: list[int]) -> dict[str, str]:
    """Trial name -> benchmark system: direct, and remote once per service process count."""
    out = {"direct": "leaseq"}
    for n in service_processes:
        out["remote" if n == 1 else f"remote-{n}p"] = "leaseq-remote" if n == 1 else f"leaseq-remote-{n}p"
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    trials = modes(args.service_processes)
    db = BenchDatabase(args.dsn)
    try:
        for rnd in range(1, args.rounds + 1):
            figures: dict[str, Any] = {"round": rnd}
            # Alternate which goes first, so drift in the machine's load does not favour one.
            order = list(trials) if rnd % 2 else list(reversed(trials))
            for mode in order:
                system = systems.get(trials[mode])
                try:
                    drained = workloads.drain(db, system, tasks=args.tasks, processes=args.processes,
                                              concurrency=args.concurrency, prefetch=args.prefetch,
                                              tool_calls=args.tool_calls)
                finally:
                    workloads._close(system)
                figures[f"{mode}_drain_per_s"] = drained["per_s"]
                for p in ("p50", "p99") if args.tool_calls else ():
                    figures[f"{mode}_tool_{p}_ms"] = drained[f"tool_{p}_ms"]
                print(f"round {rnd}: {mode} drain {drained['per_s']:,.0f} tasks/s", file=sys.stderr)
            for mode in order:
                system = systems.get(trials[mode])
                picked = workloads.latency(db, system, tasks=args.latency_tasks, gap=args.latency_gap)
                workloads._close(system)
                figures[f"{mode}_pickup_p50_ms"] = picked["p50_ms"]
                figures[f"{mode}_pickup_p99_ms"] = picked["p99_ms"]
                print(f"round {rnd}: {mode} pickup p50 {picked['p50_ms']:.2f} ms, p99 {picked['p99_ms']:.2f} ms",
                      file=sys.stderr)
            for mode in trials:
                if mode != "direct":
                    ratio = figures[f"{mode}_drain_per_s"] / figures["direct_drain_per_s"]
                    figures["drain_ratio" if mode == "remote" else f"{mode}_drain_ratio"] = ratio
            rounds.append(figures)
    finally:
        db.drop()
    summary = {key: _median([r[key] for r in rounds]) for key in rounds[0] if key != "round"}
    return {"config": {"tasks": args.tasks, "processes": args.processes, "concurrency": args.concurrency,
                       "prefetch": args.prefetch, "tool_calls": args.tool_calls,
                       "latency_tasks": args.latency_tasks, "latency_gap_s": args.latency_gap,
                       "rounds": args.rounds, "service_processes": args.service_processes},
            "rounds": rounds, "median": summary}


def print_table(report: dict[str, Any]) -> None:
    c, m = report["config"], report["median"]
    ahead = f", prefetch {c['prefetch']}" if c.get("prefetch") else ""
    work = (f"tasks of {c['tool_calls']} recorded tool call{'s' if c['tool_calls'] != 1 else ''} each"
            if c.get("tool_calls") else "no-op tasks")
    print(f"\nremote vs direct workers: {c['processes']} processes x {c['concurrency']}{ahead}, "
          f"{c['tasks']:,} {work}; pickup over {c['latency_tasks']} tasks; medians of {c['rounds']} round(s)\n")
    remotes = [mode for mode in modes(c.get("service_processes", [1])) if mode != "direct"]
    for mode in remotes:
        label = "remote" if mode == "remote" else f"remote, service × {mode[len('remote-'):-1]}"
        ratio = "drain_ratio" if mode == "remote" else f"{mode}_drain_ratio"
        print(f"\n{'figure':<28} {'direct':>10} {'remote':>10} {'remote/direct':>14}   ({label})")
        print(f"{'drain, tasks/s':<28} {m['direct_drain_per_s']:>10,.0f} {m[f'{mode}_drain_per_s']:>10,.0f} "
              f"{m[ratio]:>13.0%}")
        for p in ("p50", "p99"):
            d, r = m[f"direct_pickup_{p}_ms"], m[f"{mode}_pickup_{p}_ms"]
            print(f"{'pickup ' + p + ', ms':<28} {d:>10.2f} {r:>10.2f} {r / d:>13.1f}x")
        for p in ("p50", "p99") if c.get("tool_calls") else ():  # during the drain, as each handler saw it
            d, r = m[f"direct_tool_{p}_ms"], m[f"{mode}_tool_{p}_ms"]
            print(f"{'tool call ' + p + ', ms':<28} {d:>10.2f} {r:>10.2f} {r / d:>13.1f}x")
        print(f"per round (drain ratio = {mode}/direct of the same round): "
              + ", ".join(f"{r[ratio]:.0%}" for r in report["rounds"]))


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be counts separated by commas, such as 1,2 (got {text!r})") from None
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"must be distinct counts of at least 1 (got {text!r})")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.remote", description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("LEASEQ_BENCH_DSN"), required="LEASEQ_BENCH_DSN" not in os.environ,
                        help="a PostgreSQL server the benchmark may create a database on")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--prefetch", type=int, default=0,
                        help="tasks each worker leases ahead of its slots, direct and remote alike")
    parser.add_argument("--tool-calls", type=int, default=0,
                        help="each drained task records this many tool calls (ctx.tool), direct and remote alike")
    parser.add_argument("--service-processes", type=_counts, default=[1], metavar="N[,N...]",
                        help="run the remote trials with `leaseq serve --processes N`, once per N (default 1)")
    parser.add_argument("--latency-tasks", type=int, default=200)
    parser.add_argument("--latency-gap", type=float, default=0.02)
    parser.add_argument("--quick", action="store_true", help="one round, 1,000 tasks, 30 pickups")
    parser.add_argument("--json", default=os.path.join(tempfile.gettempdir(), "leaseq-bench-remote.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.tasks, args.latency_tasks = 1, 1000, 30
    started = time.time()
    report = run(args)
    report["seconds"] = round(time.time() - started, 1)
    with open(args.json, "w") as fh:
        json.dump(report, fh, indent=2)
    print_table(report)
    print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
