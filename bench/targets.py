"""The performance targets of the project, checked against a run's medians.

A target whose workload did not run is reported as "not measured", never as
met. These are figures for the reader, not a pass/fail gate.
"""

from __future__ import annotations

from typing import Any

Summary = dict[tuple[str, str, str], dict[str, dict[str, float]]]


def _median(summary: Summary, workload: str, config: str, system: str, metric: str) -> float | None:
    stat = summary.get((workload, config, system), {}).get(metric)
    return None if stat is None else stat["median"]


def _row(target: str, measured: str, ok: bool | None) -> dict[str, Any]:
    return {"target": target, "measured": measured, "met": "not measured" if ok is None else ("yes" if ok else "no")}


def check_targets(summary: Summary) -> list[dict[str, Any]]:
    """One row per target: what was asked, what was measured, and whether it holds."""
    rows = []
    drain_configs = list(dict.fromkeys(k[1] for k in summary if k[0] == "drain" and k[2] == "leaseq"))
    for config in drain_configs:
        ours = _median(summary, "drain", config, "leaseq", "per_s")
        for peer, factor, words in (("pgqueuer", 1.5, "≥ 1.5× pgqueuer"), ("raw", 0.8, "≥ 80% of the raw ceiling")):
            theirs = _median(summary, "drain", config, peer, "per_s")
            if ours and theirs:
                rows.append(_row(f"drain, {config}: {words}", f"{ours / theirs:.2f}× ({ours:,.0f} vs {theirs:,.0f}/s)",
                                 ours >= factor * theirs))
            else:
                rows.append(_row(f"drain, {config}: {words}", "–", None))

    enqueue = [k[1] for k in summary if k[0] == "enqueue" and k[2] == "leaseq"]
    ours = _median(summary, "enqueue", enqueue[0], "leaseq", "batch_per_s") if enqueue else None
    theirs = _median(summary, "enqueue", enqueue[0], "pgqueuer", "batch_per_s") if enqueue else None
    rows.append(_row("enqueue in batches ≥ 1.5× pgqueuer's batch enqueue",
                     f"{ours / theirs:.2f}× ({ours:,.0f} vs {theirs:,.0f}/s)" if ours and theirs else "–",
                     ours >= 1.5 * theirs if ours and theirs else None))

    for callers, factor in ((1, 1.2), (50, 2.0)):
        config = next((k[1] for k in summary if k[0] == "async-enqueue" and k[2] == "leaseq"
                       and k[1].endswith(f" {callers} caller{'s' if callers > 1 else ''}")), None)
        ours = _median(summary, "async-enqueue", config, "leaseq", "per_s") if config else None
        theirs = _median(summary, "async-enqueue", config, "pgqueuer", "per_s") if config else None
        rows.append(_row(f"async enqueue, {callers} caller{'s' if callers > 1 else ''}: ≥ {factor}× pgqueuer",
                         f"{ours / theirs:.2f}× ({ours:,.0f} vs {theirs:,.0f}/s)" if ours and theirs else "–",
                         ours >= factor * theirs if ours and theirs else None))

    theirs_p50 = _median(summary, "latency", "idle worker", "pgqueuer", "p50_ms")
    theirs_p99 = _median(summary, "latency", "idle worker", "pgqueuer", "p99_ms")
    p50 = _median(summary, "latency", "idle worker", "leaseq", "p50_ms")
    p99 = _median(summary, "latency", "idle worker", "leaseq", "p99_ms")
    rows.append(_row("pickup latency p50 ≤ 3 ms (LISTEN/NOTIFY)", f"{p50:.2f} ms" if p50 is not None else "–",
                     p50 <= 3 if p50 is not None else None))
    rows.append(_row("pickup latency p99 ≤ 15 ms", f"{p99:.2f} ms" if p99 is not None else "–",
                     p99 <= 15 if p99 is not None else None))
    if p50 is not None and p99 is not None and theirs_p50 is not None and theirs_p99 is not None:
        rows.append(_row("pickup from the enqueue call ≤ pgqueuer's and ≤ 2.5 / 8 ms (p50 / p99)",
                         f"{p50:.2f} / {p99:.2f} ms (pgqueuer {theirs_p50:.2f} / {theirs_p99:.2f} ms)",
                         p50 <= min(2.5, theirs_p50) and p99 <= min(8, theirs_p99)))
    else:
        rows.append(_row("pickup from the enqueue call ≤ pgqueuer's and ≤ 2.5 / 8 ms (p50 / p99)", "–", None))

    depth = sorted((summary[k]["queued"]["median"], summary[k]["finished"]["median"], summary[k]["per_s"]["median"])
                   for k in summary if k[0] == "depth" and k[2] == "leaseq")
    plain = [(q, rate) for q, h, rate in depth if not h]
    if len(plain) >= 2:
        (q0, r0), (q1, r1) = plain[0], plain[-1]
        ok = r1 >= 0.9 * r0 if q1 >= 1_000_000 else None
        rows.append(_row("drain at 10^6 queued ≥ 90% of drain at 10^3",
                         f"{r1 / r0:.0%} at {q1:,.0f} queued ({r1:,.0f} vs {r0:,.0f}/s)", ok))
        plain_rate = dict(plain)
        for q, h, rate in depth:
            if h and q in plain_rate:
                base = plain_rate[q]
                rows.append(_row(f"(same bar, not an issue target) drain beside {h:,.0f} finished tasks ≥ 90% "
                                 f"of drain without them ({q:,.0f} queued)",
                                 f"{rate / base:.0%} ({rate:,.0f} vs {base:,.0f}/s)", rate >= 0.9 * base))
    else:
        rows.append(_row("drain at 10^6 queued ≥ 90% of drain at 10^3", "–", None))

    beats = {k[1]: (summary[k]["transactions_per_s"]["median"], summary[k]["leases"]["median"],
                    summary[k]["workers"]["median"]) for k in summary if k[0] == "heartbeat" and k[2] == "leaseq"}
    if len(beats) >= 2:
        per_worker = [tps / w for tps, _, w in beats.values()]
        spread = max(per_worker) / min(per_worker) if min(per_worker) > 0 else float("inf")
        rows.append(_row("heartbeat statements/s proportional to workers, not leases",
                         "per worker: " + ", ".join(f"{tps / w:.2f}/s ({lea:,.0f} leases, {w:.0f} workers)"
                                                    for tps, lea, w in beats.values()), spread <= 1.5))
    else:
        rows.append(_row("heartbeat statements/s proportional to workers, not leases", "–", None))

    sqlite = _median(summary, "drain", "embedded, 1 process × 10", "leaseq-sqlite", "per_s")
    rows.append(_row("SQLite embedded drain ≥ 5,000 tasks/s in one process",
                     f"{sqlite:,.0f}/s" if sqlite else "–", sqlite >= 5000 if sqlite else None))

    for where in ("direct", "remote", "remote with prefetch"):
        keys = [k for k in summary if k[0] == "agent" and k[2] == "leaseq" and k[1].startswith(where.split()[0])
                and ("prefetch" in k[1]) == ("prefetch" in where)]
        share = _median(summary, *keys[0], "of_ideal_percent") if keys else None
        rate = _median(summary, *keys[0], "per_s") if keys else None
        rows.append(_row(f"I/O-bound handlers, one process, {where}: ≥ 90% of the ideal rate",
                         f"{share:.0f}% ({rate:,.0f}/s, {keys[0][1]})" if share is not None else "–",
                         share >= 90 if share is not None else None))
    held = [k for k in summary if k[0] == "leases" and k[2] == "leaseq" and "30 s" in k[1]]
    per_worker = _median(summary, *held[0], "statements_per_worker_s") if held else None
    cpu = _median(summary, *held[0], "db_cpu_percent") if held else None
    rows.append(_row("leases held: renewal statements per worker per second ≤ 1",
                     f"{per_worker:.2f} ({held[0][1]})" if per_worker is not None else "–",
                     per_worker <= 1 if per_worker is not None else None))
    rows.append(_row("leases held: database CPU ≤ 5% of a core", f"{cpu:.2f}%" if cpu is not None else "–",
                     cpu <= 5 if cpu is not None else None))

    for system in ("leaseq", "leaseq-sqlite"):
        fair = [k for k in summary if k[0] == "starvation" and k[2] == system and k[1].endswith("fairness keys")]
        if not fair:
            continue
        base = (fair[0][0], fair[0][1].replace("fairness keys", "no keys"), system)
        ours, theirs = _median(summary, *fair[0], "per_s"), _median(summary, *base, "per_s")
        rows.append(_row(f"starvation, {fair[0][1]} ({system}): drain with fairness keys ≥ 90% of the same "
                         "drain without",
                         f"{ours / theirs:.0%} ({ours:,.0f} vs {theirs:,.0f}/s)" if ours and theirs else "–",
                         ours >= 0.9 * theirs if ours and theirs else None))
        late, unfair = _median(summary, *fair[0], "late_p99_ms"), _median(summary, *base, "late_p99_ms")
        rows.append(_row(f"(no bar) starvation ({system}): the late tenant's pickup p99, with keys and without",
                         f"{late:,.0f} ms vs {unfair:,.0f} ms" if late is not None and unfair is not None else "–",
                         None if late is None or unfair is None else late < unfair))

    rss = _median(summary, "drain", "1 process × 10", "leaseq", "worker_rss_mb")
    rows.append(_row("worker process RSS < 80 MB at concurrency 10", f"{rss:.0f} MB" if rss else "–",
                     rss < 80 if rss else None))
    return rows
