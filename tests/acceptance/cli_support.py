"""Helpers for running the real ``leaseq`` command in a subprocess, on real databases.

:data:`CLI` runs ``python -m leaseq.cli.main`` (the code behind the
``leaseq`` console script) in a temporary working folder, with
``$LEASEQ_DSN`` removed, so the embedded default never touches the repository.
``snapshot`` reads every table through the Python API, to prove that a
refused command changed nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import leaseq

CLI = [sys.executable, "-m", "leaseq.cli.main"]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment the CLI runs in: no $LEASEQ_DSN, an 80-column terminal."""
    env = {k: v for k, v in os.environ.items() if k not in ("LEASEQ_DSN", "LEASEQ_DEBUG")}
    env.update(COLUMNS="80", LINES="50", PYTHONWARNINGS="ignore", **extra)
    return env


def snapshot(dsn: str) -> dict[str, Any]:
    """Every task with its events and effects, every worker and queue switch, read through the API."""
    with leaseq.connect(dsn) as q:
        tasks = q.list_tasks(limit=100_000)
        return {
            "tasks": tasks,
            "events": {t.id: q.events(t.id) for t in tasks},
            "effects": {t.id: q.effects(t.id) for t in tasks},
            "workers": q.workers(),
            "queues": q.queues(),
        }


def assert_one_error_line(proc: subprocess.CompletedProcess[str], field: str, *, exit_code: int = 2) -> str:
    """The process failed with ``exit_code`` and one ``error: <field>: …`` line; returns that line."""
    assert proc.returncode == exit_code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {field}: "), proc.stderr
    assert proc.stdout == "", proc.stdout
    return lines[0]
