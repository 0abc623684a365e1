"""The benchmark's report is written without matplotlib: the plots are left out, the tables are not.

``python -m bench --report-only`` rewrites results.md from a results.json;
run here in a subprocess where importing matplotlib fails (as it does when
the ``bench`` extra is not installed), and once as the environment is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DOCUMENT = {
    "seconds": 12.0,
    "trials": [
        {"workload": "drain", "config": "1 process × 10", "system": "leaseq", "round": 1,
         "metrics": {"tasks": 1000, "seconds": 0.2, "per_s": 5000.0, "worker_cpu_s": 0.1, "worker_rss_mb": 40.0}},
        {"workload": "latency", "config": "idle worker", "system": "leaseq", "round": 1,
         "metrics": {"tasks": 3, "p50_ms": 2.0, "p90_ms": 3.0, "p99_ms": 3.0, "max_ms": 3.0},
         "samples": [1.0, 2.0, 3.0]},
        {"workload": "agent", "config": "direct, 1 process × 200, 200 ms", "system": "leaseq", "round": 1,
         "metrics": {"tasks": 2000, "per_s": 950.0, "ideal_per_s": 1000.0, "of_ideal_percent": 95.0,
                     "worker_cpu_s": 1.0}},
    ],
}

#: Runs the benchmark's entry point with matplotlib made unimportable.
WITHOUT_MATPLOTLIB = ("import runpy, sys; sys.modules['matplotlib'] = None; "
                      "sys.argv = ['bench'] + sys.argv[1:]; runpy.run_module('bench', run_name='__main__')")


@pytest.mark.parametrize("matplotlib", ["missing", "as installed"])
def test_the_report_is_written_with_or_without_matplotlib(tmp_path: Path, matplotlib: str) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps(DOCUMENT))
    head = [sys.executable, "-c", WITHOUT_MATPLOTLIB] if matplotlib == "missing" else [sys.executable, "-m", "bench"]
    run = subprocess.run([*head, "--report-only", str(results), "--out", str(tmp_path / "out")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    tables = (tmp_path / "out" / "results.md").read_text()
    assert "### drain" in tables and "### agent-shaped" in tables and "| 95.0 |" in tables
    if matplotlib == "missing":
        assert "no plots: matplotlib is not installed" in run.stderr
        assert not list((tmp_path / "out").glob("*.png"))
