"""``python -m bench soak`` runs as users run it: claims, completes, prunes and reports each minute
(here a minute lasts 1.5 s), in the test's schema (``--queue-dsn``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_soak_reports_every_minute_and_judges_the_last_against_the_first(pg_schema_dsn: str,
                                                                            tmp_path: Path) -> None:
    """About 5 s: two short minutes with one claiming process."""
    out = tmp_path / "soak"
    run = subprocess.run([sys.executable, "-m", "bench", "soak", "--minutes", "2", "--minute-seconds", "1.5",
                          "--rate", "100", "--workers", "1", "--retention", "0.5", "--queue-dsn", pg_schema_dsn,
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-5000:]  # 1: not flat, as judged
    assert [ln.split(":")[0] for ln in run.stderr.splitlines() if ln.startswith("minute ")] == [
        "minute   1", "minute   2"], run.stderr[-3000:]
    document = json.loads((out / "soak.json").read_text())
    samples = document["samples"]
    assert [s["minute"] for s in samples] == [1, 2]
    assert sum(s["completed"] for s in samples) > 0
    assert samples[-1]["pruned"]["passes"] >= 1, samples  # retention ran
    assert {"leaseq_tasks", "leaseq_events"} <= samples[-1]["tables"].keys() and samples[-1]["hot_bytes"] > 0
    assert set(document["verdict"]) == {"reference_minute", "claim_p50_ms", "hot_bytes", "flat"}
    assert document["verdict"]["reference_minute"] == 1  # two minutes leave no room for the warm-up
    assert (run.returncode == 0) == document["verdict"]["flat"]
    assert "Last minute (and the largest) against minute 1" in (out / "soak.md").read_text()


def test_the_verdict_takes_its_reference_after_the_warm_up_and_judges_the_largest_minute_too() -> None:
    """Minutes as a 30-minute run records them: the first ones fill up (the retention's worth of
    ended tasks, the dead rows autovacuum's first passes leave), then the tables hold."""
    script = """
import json
from bench.soak import verdict

def minute(n, p50, mib):
    return {"minute": n, "claim_p50_ms": p50, "hot_bytes": int(mib * 2**20)}

filling = [minute(1, 2.5, 8), minute(2, 2.6, 14), minute(3, 2.0, 15)]
steady = [minute(n, 1.6, 15.5) for n in range(4, 10)]
bump = steady[:3] + [minute(7, 1.6, 25)] + steady[4:]  # a minute in the middle grew, then shrank back
print(json.dumps([verdict(filling + steady, warmup=3), verdict(filling + steady, warmup=0),
                  verdict(filling + bump, warmup=3)]))
"""
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    after_warmup, from_the_first, bumped = json.loads(run.stdout)
    assert (after_warmup["reference_minute"], after_warmup["flat"]) == (4, True)
    assert from_the_first["flat"] is False  # the first minute was still filling
    assert bumped["hot_bytes"]["within"] is False and bumped["claim_p50_ms"]["within"] is True
