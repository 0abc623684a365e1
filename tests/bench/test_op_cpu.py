"""``python -m bench.op_cpu`` runs end to end: each variant (this tree as the owner and as a worker
role) in a process of its own, every operation measured, the plans read back. A smoke test,
never a speed test: it checks that each figure was measured (a backend that did the work used
CPU), not what it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .test_bench_smoke import _server_dsn

ROOT = Path(__file__).resolve().parents[2]


def test_op_cpu_measures_each_operation_of_each_variant_and_reads_the_plans() -> None:
    dsn = _server_dsn()
    done = subprocess.run([sys.executable, "-m", "bench.op_cpu", "--dsn", dsn, "--tree", f"here={ROOT}",
                           "--rounds", "2", "--cycles", "3", "--batch", "2", "--warm", "1", "--explain"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out["variants"]) == {"here, owner", "here, role"}
    for name, v in out["variants"].items():
        for op in ("claim", "renew", "complete"):
            assert v[f"{op}_us_per_call"] > 0, (name, op)
            assert len(v["rounds"][op]) == 2
    plans = "\n".join(out["plans"]["here, owner"])
    assert "leaseq_q_claim_plain" in plans and "Buffers" in plans  # the function's body, with its buffers
    assert "| per task |" in done.stderr
