"""Turning trials into medians, ratios, Markdown tables, target checks and plots."""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

LABELS = {"leaseq": "leaseq", "leaseq-roles": "leaseq, worker role", "pgqueuer": "pgqueuer", "procrastinate": "procrastinate", "raw": "raw ceiling",
          "leaseq-sqlite": "leaseq on SQLite", "leaseq-compact": "leaseq, compact evidence",
          "pgqueuer-psycopg": "pgqueuer on psycopg"}


def summarise(trials: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, dict[str, float]]]:
    """``{(workload, config, system): {metric: {median, min, max, n}}}`` over rounds."""
    grouped: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        if "metrics" not in t:
            continue
        for metric, value in t["metrics"].items():
            if isinstance(value, (int, float)):
                grouped[(t["workload"], t["config"], t["system"])][metric].append(float(value))
    return {key: {m: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
                  for m, v in metrics.items()} for key, metrics in grouped.items()}


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(stat: dict[str, float] | None) -> str:
    if stat is None:
        return "–"
    if stat["n"] == 1:
        return _fmt(stat["median"])
    return f"{_fmt(stat['median'])} ({_fmt(stat['min'])}–{_fmt(stat['max'])})"


def _ratio(a: dict[str, float] | None, b: dict[str, float] | None, *, lower_is_better: bool = False) -> str:
    if a is None or b is None or not b["median"] or not a["median"]:
        return "–"
    r = b["median"] / a["median"] if lower_is_better else a["median"] / b["median"]
    return f"{r:.2f}×"


def _configs(summary: dict, workload: str) -> list[str]:
    return list(dict.fromkeys(k[1] for k in summary if k[0] == workload))


def _systems(summary: dict, workload: str, config: str) -> list[str]:
    order = list(LABELS)
    return sorted({k[2] for k in summary if k[0] == workload and k[1] == config}, key=order.index)


def markdown(summary: dict) -> str:
    """Every workload as a Markdown table: median (min–max) over rounds, and leaseq's ratio."""
    out: list[str] = []

    def get(w: str, c: str, s: str, m: str) -> dict[str, float] | None:
        return summary.get((w, c, s), {}).get(m)

    for workload, metric in (("enqueue", None), ("drain", "per_s"), ("evidence", "per_s"), ("limits", "per_s")):
        configs = _configs(summary, workload)
        if not configs:
            continue
        out.append(f"### {workload}\n")
        if workload == "enqueue":
            out.append("| system | one at a time (tasks/s) | batches of 1,000 (tasks/s) | leaseq ÷ system, batches |")
            out.append("|---|---|---|---|")
            for s in _systems(summary, "enqueue", configs[0]):
                c = configs[0]
                out.append(f"| {LABELS[s]} | {_cell(get('enqueue', c, s, 'one_per_s'))} | "
                           f"{_cell(get('enqueue', c, s, 'batch_per_s'))} | "
                           f"{_ratio(get('enqueue', c, 'leaseq', 'batch_per_s'), get('enqueue', c, s, 'batch_per_s'))} |")
        else:
            out.append("| workers | system | tasks/s, start to last completion | leaseq ÷ system | "
                       "tasks/s, first to last completion | worker CPU, ms per 1,000 tasks | "
                       "database CPU, ms per 1,000 tasks | worker RSS (MB) |")
            out.append("|---|---|---|---|---|---|---|---|")
            for c in configs:
                base = "leaseq"
                for s in _systems(summary, workload, c):
                    cpu = get(workload, c, s, "worker_cpu_s")
                    tasks = get(workload, c, s, "tasks")
                    cpu_per = _fmt(1e6 * cpu["median"] / tasks["median"]) if cpu and tasks else "–"
                    dbcpu = get(workload, c, s, "db_cpu_s")
                    db_per = _fmt(1e6 * dbcpu["median"] / tasks["median"]) if dbcpu and tasks else "–"
                    out.append(f"| {c} | {LABELS[s]} | {_cell(get(workload, c, s, metric))} | "
                               f"{_ratio(get(workload, c, base, metric), get(workload, c, s, metric))} | "
                               f"{_cell(get(workload, c, s, 'steady_per_s'))} | {cpu_per} | {db_per} | "
                               f"{_cell(get(workload, c, s, 'worker_rss_mb'))} |")
        out.append("")

    if _configs(summary, "async-enqueue"):
        out.append("### async enqueue: one task per call, from asyncio callers\n")
        out.append("| callers | system | tasks/s | leaseq ÷ system |")
        out.append("|---|---|---|---|")
        for c in _configs(summary, "async-enqueue"):
            for s in _systems(summary, "async-enqueue", c):
                out.append(f"| {c} | {LABELS[s]} | {_cell(get('async-enqueue', c, s, 'per_s'))} | "
                           f"{_ratio(get('async-enqueue', c, 'leaseq', 'per_s'), get('async-enqueue', c, s, 'per_s'))} |")
        out.append("")

    if _configs(summary, "latency"):
        out.append("### pickup latency (from the enqueue call to the handler's start)\n")
        out.append("| system | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) |")
        out.append("|---|---|---|---|---|")
        c = _configs(summary, "latency")[0]
        for s in _systems(summary, "latency", c):
            out.append(f"| {LABELS[s]} | " + " | ".join(_cell(get("latency", c, s, m))
                                                       for m in ("p50_ms", "p90_ms", "p99_ms", "max_ms")) + " |")
        out.append("")

    if _configs(summary, "heartbeat"):
        out.append("### heartbeat load\n")
        out.append("| leases held / workers | system | transactions/s | per worker | rows updated/s | "
                   "database CPU (% of a core) |")
        out.append("|---|---|---|---|---|---|")
        for c in _configs(summary, "heartbeat"):
            for s in _systems(summary, "heartbeat", c):
                tps = get("heartbeat", c, s, "transactions_per_s")
                workers = get("heartbeat", c, s, "workers")
                per_worker = _fmt(tps["median"] / workers["median"]) if tps and workers else "–"
                out.append(f"| {c} | {LABELS[s]} | {_cell(tps)} | {per_worker} | "
                           f"{_cell(get('heartbeat', c, s, 'rows_updated_per_s'))} | "
                           f"{_cell(get('heartbeat', c, s, 'db_cpu_percent'))} |")
        out.append("")

    if _configs(summary, "agent"):
        out.append("### agent-shaped: handlers awaiting I/O (a model call)\n")
        out.append("| where | system | tasks/s, start to last completion | ideal (tasks/s) | % of ideal | "
                   "worker CPU (s) |")
        out.append("|---|---|---|---|---|---|")
        for c in _configs(summary, "agent"):
            for s in _systems(summary, "agent", c):
                out.append(f"| {c} | {LABELS[s]} | {_cell(get('agent', c, s, 'per_s'))} | "
                           f"{_cell(get('agent', c, s, 'ideal_per_s'))} | "
                           f"{_cell(get('agent', c, s, 'of_ideal_percent'))} | "
                           f"{_cell(get('agent', c, s, 'worker_cpu_s'))} |")
        out.append("")

    if _configs(summary, "leases"):
        out.append("### leases held at agent scale\n")
        out.append("| leases held / workers | system | renewal statements per worker per second | "
                   "database transactions per worker per second | rows updated/s | database CPU (% of a core) |")
        out.append("|---|---|---|---|---|---|")
        for c in _configs(summary, "leases"):
            for s in _systems(summary, "leases", c):
                out.append(f"| {c} | {LABELS[s]} | {_cell(get('leases', c, s, 'statements_per_worker_s'))} | "
                           f"{_cell(get('leases', c, s, 'transactions_per_worker_s'))} | "
                           f"{_cell(get('leases', c, s, 'rows_updated_per_s'))} | "
                           f"{_cell(get('leases', c, s, 'db_cpu_percent'))} |")
        out.append("")

    if _configs(summary, "budgets"):
        out.append("### budgets settled after the call\n")
        out.append("| trial | system | worst window overshoot (units) | (calls' worth) | tasks done / queued | "
                   "claim p10 (ms) | claim p50 (ms) | claim p99 (ms) |")
        out.append("|---|---|---|---|---|---|---|---|")
        for c in _configs(summary, "budgets"):
            for s in _systems(summary, "budgets", c):
                done, queued = get("budgets", c, s, "completed"), get("budgets", c, s, "tasks")
                out.append(f"| {c} | {LABELS[s]} | {_cell(get('budgets', c, s, 'max_overshoot_units'))} | "
                           f"{_cell(get('budgets', c, s, 'max_overshoot_calls'))} | "
                           f"{_fmt(done['median']) + ' / ' + _fmt(queued['median']) if done and queued else '–'} | "
                           f"{_cell(get('budgets', c, s, 'claim_p10_ms'))} | "
                           f"{_cell(get('budgets', c, s, 'claim_p50_ms'))} | "
                           f"{_cell(get('budgets', c, s, 'claim_p99_ms'))} |")
    if _configs(summary, "starvation"):
        out.append("### starvation: one tenant's backlog, another's few tasks\n")
        out.append("| workers | system | tasks/s | with keys ÷ without | late tenant's pickup p50 (ms) | "
                   "p99 (ms) | max (ms) |")
        out.append("|---|---|---|---|---|---|---|")
        for c in _configs(summary, "starvation"):
            base = c.replace("fairness keys", "no keys")
            for s in _systems(summary, "starvation", c):
                ratio = (_ratio(get("starvation", c, s, "per_s"), get("starvation", base, s, "per_s"))
                         if base != c else "–")
                out.append(f"| {c} | {LABELS[s]} | {_cell(get('starvation', c, s, 'per_s'))} | {ratio} | "
                           + " | ".join(_cell(get("starvation", c, s, m))
                                        for m in ("late_p50_ms", "late_p99_ms", "late_max_ms")) + " |")
        out.append("")

    if _configs(summary, "depth"):
        out.append("### drain against depth (1 process, concurrency 10)\n")
        out.append("| queue | system | tasks/s | ÷ shallowest |")
        out.append("|---|---|---|---|")
        for s in ("leaseq", "raw", "pgqueuer", "procrastinate"):
            configs = [c for c in _configs(summary, "depth") if (("depth", c, s) in summary)]
            if not configs:
                continue
            first = get("depth", configs[0], s, "per_s")
            for c in configs:
                out.append(f"| {c} | {LABELS[s]} | {_cell(get('depth', c, s, 'per_s'))} | "
                           f"{_ratio(get('depth', c, s, 'per_s'), first)} |")
        out.append("")
    return "\n".join(out)


def plots(trials: list[dict[str, Any]], summary: dict, folder: Path) -> list[Path]:
    """drain_vs_depth.png, latency.png and drain.png (each only if its workload ran).

    None without matplotlib (the ``bench`` extra): the tables are the figures, the plots a view of them."""
    try:
        import matplotlib
    except ImportError:
        print("no plots: matplotlib is not installed (pip install 'leaseq[bench]')", file=sys.stderr)
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    depth_keys = [k for k in summary if k[0] == "depth"]
    if depth_keys:
        fig, ax = plt.subplots(figsize=(7, 4))
        for s in dict.fromkeys(k[2] for k in depth_keys):
            points = sorted(((summary[k]["queued"]["median"], summary[k]["per_s"], summary[k]["finished"]["median"])
                             for k in depth_keys if k[2] == s), key=lambda p: (p[0], p[2]))
            plain = [(q, st) for q, st, h in points if not h]
            color = None
            if plain:
                line = ax.errorbar([q for q, _ in plain], [st["median"] for _, st in plain],
                                   yerr=[[st["median"] - st["min"] for _, st in plain],
                                         [st["max"] - st["median"] for _, st in plain]],
                                   marker="o", capsize=3, label=LABELS[s])
                color = line[0].get_color()
            for q, st, h in points:
                if h:
                    ax.plot([q], [st["median"]], marker="s", markerfacecolor="none", linestyle="none", color=color,
                            label=f"{LABELS[s]}, {int(h):,} finished tasks in history")
        ax.set_xscale("log")
        ax.set_xlabel("tasks queued when the worker starts")
        ax.set_ylabel("drain rate (tasks/s)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("Drain rate against queue depth")
        fig.tight_layout()
        written.append(folder / "drain_vs_depth.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    samples: dict[str, list[float]] = defaultdict(list)
    for t in trials:
        if t["workload"] == "latency" and "samples" in t:
            samples[t["system"]].extend(t["samples"])
    if samples:
        fig, ax = plt.subplots(figsize=(7, 4))
        for s, values in samples.items():
            values = sorted(values)
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=LABELS[s])
        ax.set_xscale("log")
        ax.set_xlabel("enqueue commit to handler start (ms)")
        ax.set_ylabel("fraction of tasks")
        ax.axvline(3, color="grey", linestyle=":", linewidth=1)
        ax.axvline(15, color="grey", linestyle="--", linewidth=1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("Pickup latency, idle worker (dotted: 3 ms, dashed: 15 ms)")
        fig.tight_layout()
        written.append(folder / "latency.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    drain_keys = [k for k in summary if k[0] == "drain"]
    if drain_keys:
        configs = list(dict.fromkeys(k[1] for k in drain_keys))
        names = sorted({k[2] for k in drain_keys}, key=list(LABELS).index)
        fig, ax = plt.subplots(figsize=(7, 4))
        width = 0.8 / len(names)
        for i, s in enumerate(names):
            xs, ys, lo, hi = [], [], [], []
            for j, c in enumerate(configs):
                st = summary.get(("drain", c, s), {}).get("per_s")
                if st:
                    xs.append(j + i * width)
                    ys.append(st["median"])
                    lo.append(st["median"] - st["min"])
                    hi.append(st["max"] - st["median"])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=LABELS[s])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(configs))], configs)
        ax.set_ylabel("tasks/s (median, min–max)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("Drain, no-op handlers")
        fig.tight_layout()
        written.append(folder / "drain.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written
