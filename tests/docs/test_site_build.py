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


def mkdocs_build(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict``, as CI and a contributor run it."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(out)], cwd=config.parent, env=env, capture_output=True, text=True,
                          timeout=300)


def build(out: Path) -> Path:
    proc = mkdocs_build(ROOT / "mkdocs.yml", out)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return out


def test_a_broken_link_fails_the_strict_build(tmp_path: Path):
    """The build the suite runs is strict: a link to a missing page fails it."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the guide](guide.md).\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: broken\nnav:\n  - Home: index.md\n")
    proc = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0 and "guide.md" in proc.stdout + proc.stderr


def _text(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text()


def test_the_site_builds_strictly_and_its_generated_references_cover_the_code(tmp_path: Path):
    """One test, so the build (the slow part) runs once even when tests are spread over processes."""
    site = build(tmp_path / "site")
    assert (site / "index.html").exists()
    for page in ("tutorial", "how-to/fencing", "reference/python", "explanation/lease-protocol", "reliability"):
        assert (site / page / "index.html").exists(), page
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
    from leaseq.core.errors import ERRORS

    for cls in ERRORS:
        assert f"<code>{cls.code}</code>" in http_page, cls.code
    python_page = _text(site, "reference/python")
    for name in ("leaseq.Queue", "leaseq.TaskContext", "leaseq.fencing.FencedStore", "leaseq.client.RemoteQueue"):
        assert f'id="{name}"' in python_page, name
    assert "enqueue_many" in python_page and "begin_effect" in python_page
