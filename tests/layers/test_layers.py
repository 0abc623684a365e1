"""The package's layers hold: each imports only those beneath it (core < db < store < engine <
queue < aio < worker < service < cli), as the contract in ``.importlinter`` states."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_layers_contract_is_kept() -> None:
    if shutil.which("lint-imports") is None:
        pytest.skip("import-linter is not installed (the test extra installs it)")
    run = subprocess.run(["lint-imports", "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-1000:]
    assert "1 kept, 0 broken" in run.stdout


def test_the_contract_catches_an_upward_import(tmp_path: Path) -> None:
    """A test that can fail: the same contract, over a copy of the package in which the
    queue imports the worker again, is broken."""
    if shutil.which("lint-imports") is None:
        pytest.skip("import-linter is not installed (the test extra installs it)")
    copy = tmp_path / "leaseq"
    shutil.copytree(ROOT / "src" / "leaseq", copy, ignore=shutil.ignore_patterns("__pycache__", "*.json", "*.sql",
                                                                                   "static", "templates"))
    base = copy / "queue" / "base.py"
    base.write_text(base.read_text() + "\nfrom ..worker import runtime as _upward  # noqa\n")
    (tmp_path / ".importlinter").write_text((ROOT / ".importlinter").read_text())
    run = subprocess.run(["lint-imports", "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(tmp_path), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"})
    assert run.returncode != 0 and "leaseq.queue is not allowed to import leaseq.worker" in run.stdout, run.stdout[-2000:]
