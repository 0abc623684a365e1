"""The package's layers hold: each imports only those beneath it (core < db < store < engine <
queue < aio < access < worker < service < cli), and the modules of access control import one
way (actions < principals < tokens < operator), as the contracts in ``.importlinter`` state."""

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
    assert "2 kept, 0 broken" in run.stdout


def _broken_copy(tmp_path: Path, module: str, line: str) -> str:
    """The contracts run over a copy of the package in which ``module`` (a path under leaseq/)
    gets ``line``: lint-imports' report."""
    copy = tmp_path / "leaseq"
    shutil.copytree(ROOT / "src" / "leaseq", copy, ignore=shutil.ignore_patterns("__pycache__", "*.json", "*.sql",
                                                                                   "static", "templates"))
    changed = copy / module
    changed.write_text(changed.read_text() + f"\n{line}  # noqa\n")
    (tmp_path / ".importlinter").write_text((ROOT / ".importlinter").read_text())
    run = subprocess.run(["lint-imports", "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(tmp_path), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"})
    assert run.returncode != 0, run.stdout[-2000:]
    return run.stdout


@pytest.mark.parametrize(("module", "line", "refusal"), [
    # the queue importing the worker again
    ("queue/base.py", "from ..worker import runtime as _upward", "leaseq.queue is not allowed to import leaseq.worker"),
    # access control sits above the queues and below the worker and the service
    ("engine/common.py", "from .. import access as _upward", "leaseq.engine is not allowed to import leaseq.access"),
    ("access/principals.py", "from ..service import access as _upward",
     "leaseq.access is not allowed to import leaseq.service"),
    # the old cycle: principals importing the tokens module, which imports principals
    ("access/principals.py", "from . import tokens as _upward",
     "leaseq.access.principals is not allowed to import leaseq.access.tokens"),
])
def test_the_contracts_catch_an_upward_import(tmp_path: Path, module: str, line: str, refusal: str) -> None:
    """A test that can fail: the same contracts, over a copy of the package with one upward import, are broken."""
    if shutil.which("lint-imports") is None:
        pytest.skip("import-linter is not installed (the test extra installs it)")
    assert refusal in _broken_copy(tmp_path, module, line)
