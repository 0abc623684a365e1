"""The benchmark runs end to end in its quick configuration and writes its report.

A smoke test, never a speed test: it checks that every workload ran against
every system, that no trial failed, and that the JSON, the Markdown tables
and the plots were written. The benchmark is run as users run it, with
``python -m bench`` in a subprocess; it creates and drops its own database
on the test server (it never touches the test database's tables).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = {"enqueue", "async-enqueue", "drain", "latency", "heartbeat", "depth", "evidence", "agent", "leases", "limits",
             "budgets", "starvation"}


def _server_dsn() -> str:
    dsn = os.environ.get("LEASEQ_TEST_PG_DSN")
    if dsn:
        return dsn
    if os.environ.get("LEASEQ_REQUIRE_PG") == "1":
        pytest.fail("LEASEQ_REQUIRE_PG=1 but LEASEQ_TEST_PG_DSN is not set")
    pytest.skip("the benchmark needs a PostgreSQL server: set LEASEQ_TEST_PG_DSN")


def test_quick_benchmark_writes_tables_json_and_plots(tmp_path: Path) -> None:
    dsn = _server_dsn()
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("the benchmark's plots need the bench extra: pip install -e '.[bench]'")
    peers = [p for p in ("pgqueuer", "procrastinate") if importlib.util.find_spec(p) is not None]
    chosen = ["leaseq", *peers, "raw", "leaseq-sqlite", "leaseq-compact"]
    out = tmp_path / "results"
    run = subprocess.run([sys.executable, "-m", "bench", "--quick", "--dsn", dsn, "--out", str(out),
                          "--systems", ",".join(chosen)],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]

    document = json.loads((out / "results.json").read_text())
    trials = document["trials"]
    assert not [t for t in trials if "error" in t]
    assert {t["workload"] for t in trials} == WORKLOADS
    drained = {t["system"] for t in trials if t["workload"] == "drain"}
    assert drained == set(chosen) - {"leaseq-compact"}
    assert {t["config"] for t in trials if t["workload"] == "drain" and t["system"] == "leaseq"} == {
        "1 process × 10", "2 processes × 10"}
    assert {t["system"] for t in trials if t["workload"] == "latency"} == {"leaseq", *peers, "raw"}
    asynchronous = {(t["config"], t["system"]) for t in trials if t["workload"] == "async-enqueue"}
    assert asynchronous == {(f"200 tasks, {c}", s) for c in ("1 caller", "50 callers")
                            for s in {"leaseq", *peers, "raw"} - {"procrastinate"}}
    assert all(t["metrics"]["per_s"] > 0 for t in trials if t["workload"] == "async-enqueue")
    agent = {(t["config"].split(",")[0], t["system"]) for t in trials if t["workload"] == "agent"}
    assert agent == {("direct", "leaseq"), ("direct", "leaseq-sqlite"), ("remote (leaseq serve)", "leaseq")}
    assert all(0 < t["metrics"]["of_ideal_percent"] <= 100 for t in trials if t["workload"] == "agent")
    held = {t["config"]: t["metrics"] for t in trials if t["workload"] == "leases"}
    assert set(held) == {"200 / 2, 30 s leases", "200 / 2, 1 h leases (no renewal in the window)"}
    assert all(m["leases"] == 200 and m["statements_per_worker_s"] >= 0 for m in held.values())
    limited = {(t["config"], t["system"]) for t in trials if t["workload"] == "limits"}
    assert limited == {(f"1 process × 10, {c}", s) for s in ("leaseq", "leaseq-sqlite")
                       for c in ("no limit key", "limit key, never binding", "limit key, max_running 4")}
    assert held["200 / 2, 1 h leases (no renewal in the window)"]["statements_per_worker_s"] == 0
    assert all(t["metrics"]["per_s"] > 0 for t in trials if t["workload"] in ("drain", "depth", "evidence"))
    assert {row["target"].split(":")[0] for row in document["targets"]} >= {"pickup latency p50 ≤ 3 ms (LISTEN/NOTIFY)"}
    assert document["machine"]["nproc"] and document["server"]["postgresql"]

    tables = (out / "results.md").read_text()
    for heading in ("### enqueue", "### async enqueue", "### drain", "### pickup latency", "### heartbeat load",
                    "### drain against depth", "### evidence", "### agent-shaped", "### leases held",
                    "### starvation", "### targets"):
        assert heading in tables
    assert run.stdout.count("| leaseq |") >= 3  # the tables are printed too
    for plot in ("drain.png", "latency.png", "drain_vs_depth.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_remote_benchmark_measures_pickup_after_the_drains(tmp_path: Path) -> None:
    """``python -m bench.remote``: the direct pickup trial runs after the remote drain
    (whose service is gone by then) and still goes straight to the database. The remote
    workers run the direct ones' handler (here, with a recorded tool call each): the
    tool calls' latency is read on both sides."""
    dsn = _server_dsn()
    out = tmp_path / "remote.json"
    run = subprocess.run([sys.executable, "-m", "bench.remote", "--dsn", dsn, "--rounds", "1", "--tasks", "100",
                          "--processes", "1", "--latency-tasks", "5", "--service-processes", "2",
                          "--tool-calls", "1", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    median = json.loads(out.read_text())["median"]
    # one remote trial (a service of two processes, the harder case) keeps the check short
    for key in ("direct_drain_per_s", "direct_pickup_p50_ms", "remote-2p_drain_per_s", "remote-2p_drain_ratio",
                "remote-2p_pickup_p50_ms", "direct_tool_p50_ms", "remote-2p_tool_p99_ms", "remote-2p_tool_p50_ms"):
        assert median[key] > 0
    assert "service × 2" in run.stdout


def test_budgets_benchmark_reports_the_overshoot_and_the_claims_cost(tmp_path: Path) -> None:
    """``python -m bench budgets``: concurrent workers settling each call's usage never take a
    per_minute window past its total by more than one call's worth, and the claim is timed with
    and without the window, on both backends."""
    dsn = _server_dsn()
    out = tmp_path / "results"
    run = subprocess.run([sys.executable, "-m", "bench", "budgets", "--quick", "--dsn", dsn, "--out", str(out),
                          "--systems", "leaseq,leaseq-sqlite"],
                         cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    trials = json.loads((out / "results.json").read_text())["trials"]
    assert not [t for t in trials if "error" in t] and {t["workload"] for t in trials} == {"budgets"}
    over = [t["metrics"] for t in trials if t["config"].startswith("200 tasks")]
    assert len(over) == 2
    for m in over:
        assert 0 < m["completed"] < m["tasks"]  # the window held some back
        assert m["max_overshoot_units"] <= m["call_units"] and m["max_overshoot_calls"] <= 1
    costs = {(t["config"], t["system"]): t["metrics"] for t in trials if t["config"].startswith("claim cost")}
    assert set(costs) == {(c, s) for c in ("claim cost, no limit key", "claim cost, per_minute window, usage settled")
                          for s in ("leaseq", "leaseq-sqlite")}
    assert all(m["claims"] == 200 and m["claim_p50_ms"] > 0 for m in costs.values())
    assert "### budgets settled after the call" in (out / "results.md").read_text()


def test_starvation_benchmark_measures_the_late_tenant_with_and_without_keys(tmp_path: Path) -> None:
    """``python -m bench starvation --quick``: a tenant's backlog, then another tenant's few
    tasks, drained with fairness keys and without, on PostgreSQL (4 worker processes) and
    SQLite; the late tenant is picked up behind the backlog without keys, and at once with."""
    dsn = _server_dsn()
    out = tmp_path / "results"
    run = subprocess.run([sys.executable, "-m", "bench", "starvation", "--quick", "--dsn", dsn, "--out", str(out),
                          "--systems", "leaseq,leaseq-sqlite"],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    trials = json.loads((out / "results.json").read_text())["trials"]
    assert not [t for t in trials if "error" in t]
    found = {(t["config"], t["system"]): t["metrics"] for t in trials}
    assert set(found) == {(f"{w}, {keys}", s) for w, s in (("4 processes × 10", "leaseq"), ("1 process × 10", "leaseq-sqlite"))
                          for keys in ("fairness keys", "no keys")}
    for (config, system), metrics in found.items():
        assert metrics["tasks"] == 2_010 and metrics["per_s"] > 0 and metrics["late_p99_ms"] >= metrics["late_p50_ms"]
        if config.endswith("fairness keys"):  # served beside the backlog, not behind it
            behind = found[(config.replace("fairness keys", "no keys"), system)]
            assert metrics["late_p99_ms"] < behind["late_p99_ms"], (metrics, behind)
    assert "### starvation" in run.stdout and "late tenant's pickup p99" in run.stdout
