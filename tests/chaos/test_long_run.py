"""The long mode of `leaseq chaos`: ten minutes on PostgreSQL with every fault. NOT run in CI.

Skipped unless LEASEQ_CHAOS_LONG=1 (optionally LEASEQ_CHAOS_LONG_SECONDS and
LEASEQ_CHAOS_LONG_SEED). docs/reliability.md has the figures of such a run.
"""

from __future__ import annotations

import os

import pytest

from .support import describe, need_pg_binaries, run_chaos_cli

LONG = os.environ.get("LEASEQ_CHAOS_LONG") == "1"
SECONDS = int(os.environ.get("LEASEQ_CHAOS_LONG_SECONDS", "600"))


@pytest.mark.skipif(not LONG, reason="long chaos run: set LEASEQ_CHAOS_LONG=1 (about ten minutes)")
@pytest.mark.timeout(SECONDS + 600)
def test_long_run_on_postgres_with_every_fault(tmp_path):
    need_pg_binaries()
    seed = os.environ.get("LEASEQ_CHAOS_LONG_SEED", "7")
    proc, doc = run_chaos_cli(tmp_path, "--backend", "postgres", "--duration", str(SECONDS), "--workers", "8",
                              "--tasks", str(SECONDS * 20 // 3), "--seed", seed, "--faults", "all",
                              timeout=SECONDS + 300)
    assert proc.returncode == 0, describe(proc)
    assert doc["verdict"]["ok"] and doc["settled"]
    print(proc.stdout)
