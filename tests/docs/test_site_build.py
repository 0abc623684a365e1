"""The documentation site builds with ``mkdocs build --strict``: a broken link,
a missing page, an API name mkdocstrings cannot find, or a generated section
whose source went away fails the test suite, as it would fail CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocs", reason="the docs build needs the docs extra: pip install -e '.[docs]'")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return out


def _text(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text()


def test_the_site_builds_strictly(site: Path):
    assert (site / "index.html").exists()
    for page in ("tutorial", "how-to/fencing", "reference/python", "explanation/lease-protocol", "reliability"):
        assert (site / page / "index.html").exists(), page


def test_generated_references_cover_the_code(site: Path):
    from leaseq.cli.main import cli
    from leaseq.service.app import create_app  # noqa: F401 - the server extra is installed

    cli_page = _text(site, "reference/cli")
    for name, command in cli.commands.items():
        assert f"leaseq {name}" in cli_page, name
    env_page = _text(site, "reference/configuration")
    assert "LEASEQ_WORKER_CONCURRENCY" in env_page and "LEASEQ_TOKENS_CREATE_ROLE" in env_page
    spec = json.loads((site / "reference" / "openapi.json").read_text())
    http_page = _text(site, "reference/http")
    for route, methods in spec["paths"].items():
        for method in methods:
            assert f"{method.upper()} {route}" in http_page, (method, route)
    python_page = _text(site, "reference/python")
    for name in ("leaseq.Queue", "leaseq.TaskContext", "leaseq.fencing.FencedStore", "leaseq.client.RemoteQueue"):
        assert f'id="{name}"' in python_page, name
    assert "enqueue_many" in python_page and "begin_effect" in python_page
