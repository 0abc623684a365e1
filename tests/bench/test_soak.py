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
    assert set(document["verdict"]) == {"claim_p50_ms", "hot_bytes", "flat"}
    assert (run.returncode == 0) == document["verdict"]["flat"]
    assert "Last minute against the first" in (out / "soak.md").read_text()
