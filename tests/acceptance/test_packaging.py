"""What a library user installs, and the files a package is expected to carry."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = {"fastapi", "starlette", "uvicorn", "httptools", "uvloop", "jinja2", "prometheus-client",
               "python-multipart"}


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_the_library_installs_only_what_it_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = names(project["dependencies"])
    assert core == {"psycopg", "psycopg-pool", "click", "rich"}
    extras = project["optional-dependencies"]
    assert names(extras["server"]) == SERVER_ONLY
    assert names(extras["client"]) == {"urllib3"}
    assert names(extras["schedules"]) == {"cronsim"}
    assert names(extras["metrics"]) == {"prometheus-client"}  # leaseq worker --metrics-port
    assert names(extras["otel"]) == {"opentelemetry-api"}     # spans; the SDK is the application's choice
    assert "opentelemetry-sdk" in names(extras["test"])  # the tracing tests run
    # `pip install -e '.[test]'` (the README's second set-up line) still runs every test.
    [own] = [r for r in extras["test"] if r.startswith("leaseq[")]
    assert {"server", "client", "mcp", "docs", "schedules", "metrics", "otel"} <= set(own[len("leaseq["):-1].split(","))
    assert names(extras["mcp"]) == {"mcp"}
    # `pip install -e '.[docs]' && mkdocs build --strict`: the site's hook imports the service
    # (.ci/run builds it so, in a fresh virtualenv)
    assert "leaseq[server]" in extras["docs"] and {"mkdocs", "mkdocs-material"} <= names(extras["docs"])
    urls = project["urls"]
    assert {"Homepage", "Documentation", "Changelog"} <= set(urls)
    assert all(u.startswith("https://github.com/leaseq/leaseq") for u in urls.values())


def test_license_and_changelog():
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and f"## [{project['version']}]" in changelog
