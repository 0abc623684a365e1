"""Fixtures for the acceptance tests: the real ``leaseq`` command in a subprocess."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from .cli_support import CLI, cli_env


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_cli(*args, input=None, env=None)``: run the CLI; returns the completed process."""
    workdir = tmp_path / "cwd"
    workdir.mkdir()

    def run(*args: str, input: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], input=input, capture_output=True, text=True, timeout=timeout,
                              cwd=workdir, env=env or cli_env())

    run.cwd = workdir  # type: ignore[attr-defined]
    return run

