"""Running `leaseq chaos` in a subprocess, as a user would, and reading its verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from leaseq_chaos.pgserver import find_bindir

ROOT = Path(__file__).resolve().parents[2]


def need_pg_binaries() -> None:
    """Skip (or fail, with LEASEQ_REQUIRE_PG=1) when no PostgreSQL server binaries are installed."""
    if find_bindir() is None:
        if os.environ.get("LEASEQ_REQUIRE_PG") == "1":
            pytest.fail("LEASEQ_REQUIRE_PG=1 but no initdb/pg_ctl was found for the private chaos server")
        pytest.skip("the PostgreSQL chaos run needs the server binaries (initdb, pg_ctl)")


def run_chaos_cli(tmp_path: Path, *args: str, pythonpath: Path | None = None,
                  timeout: float = 240) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``leaseq chaos ARGS --history …`` and return the process and the parsed history file."""
    history = tmp_path / "history.json"
    env = {k: v for k, v in os.environ.items() if k != "LEASEQ_DSN"}
    if pythonpath is not None:  # first; leaseq_chaos still comes from where it was found
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "leaseq.cli.main", "chaos", *args, "--history", str(history)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    document = json.loads(history.read_text()) if history.exists() else {}
    return proc, document


def recheck_cli(history: Path) -> subprocess.CompletedProcess:
    """``leaseq chaos --recheck HISTORY`` with the package under test."""
    return subprocess.run([sys.executable, "-m", "leaseq.cli.main", "chaos", "--recheck", str(history)],
                          cwd=history.parent, capture_output=True, text=True, timeout=120)


def describe(proc: subprocess.CompletedProcess) -> str:
    """The end of a run's output, for assertion messages."""
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-3000:]}"
