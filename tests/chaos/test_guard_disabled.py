"""The checker can fail: with a lease guard removed, a short chaos run finds the violation.

The package is copied into a scratch folder, the generation check is removed
from ``complete_batch`` (the one completion statement) in the copy's
queries.sql, by passing the lease guard template the row's own generation
(the real file is never touched), and `leaseq chaos` runs with the copy first on PYTHONPATH, for
both the harness and its worker processes. The stale-writer probe then
completes a task with a superseded claim of the same worker, the database
accepts it, and the checker must say so and exit non-zero.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import leaseq

from .support import describe, need_pg_binaries, recheck_cli, run_chaos_cli

pytestmark = pytest.mark.timeout(180)
#: complete_batch's use of the guard template, and the same use with the generation check made a tautology
GUARD_USE = "/* TEMPLATE: lease_guard(c.generation) */"
NO_GENERATION_CHECK = "/* TEMPLATE: lease_guard(t.claim_generation) */"


def scratch_copy_without_generation_check(root: Path) -> Path:
    """A copy of the leaseq package whose complete_batch ignores the claim generation."""
    source = Path(leaseq.__file__).parent
    target = root / "leaseq"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for dialect in ("sqlite", "postgres"):
        path = target / "sql" / dialect / "queries.sql"
        text = path.read_text()
        start = text.index("-- name: complete_batch\n")
        end = text.index("-- name: ", start + 1)
        block = text[start:end]
        assert block.count(GUARD_USE) == 1, f"{dialect} complete_batch no longer expands the guard once"
        path.write_text(text[:start] + block.replace(GUARD_USE, NO_GENERATION_CHECK) + text[end:])
        assert (source / "sql" / dialect / "queries.sql").read_text().count(GUARD_USE) >= 1  # the real file is intact
    return root


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_removing_the_generation_check_is_caught(tmp_path, backend):
    if backend == "postgres":
        need_pg_binaries()
    scratch = scratch_copy_without_generation_check(tmp_path / "scratch")
    proc, doc = run_chaos_cli(tmp_path, "--backend", backend, "--duration", "20", "--workers", "2",
                              "--tasks", "30", "--seed", "3", "--faults", "none", "--quiet", pythonpath=scratch)
    assert proc.returncode == 1, describe(proc)
    verdict = doc["verdict"]
    assert not verdict["ok"]
    assert verdict["by_invariant"]["stale_write_refused"] >= 1, verdict["by_invariant"]
    assert verdict["by_invariant"]["single_completion"] >= 1, verdict["by_invariant"]
    accepted = [r for r in doc["history"] if r["op"] == "probe.complete" and r["outcome"] == "ok"]
    assert accepted, "the probe's stale completion should have been accepted by the broken copy"
    assert "VIOLATION stale_write_refused" in proc.stdout
    # The other guards were left alone, and still refused the probe.
    refused = {r["op"] for r in doc["history"] if r["op"].startswith("probe.") and r["outcome"] == "refused"}
    assert {"probe.renew", "probe.begin_effect", "probe.downstream"} <= refused
    # The saved history convicts the broken copy again, with the intact checker.
    again = recheck_cli(tmp_path / "history.json")
    assert again.returncode == 1 and "VIOLATION single_completion" in again.stdout, describe(again)
