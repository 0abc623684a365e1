"""Every page's examples need only what the page tells the reader to install.

A reader installs leaseq with the extras a page names (``pip install
'.[server]'``) and whatever else it names after ``pip install``; the test
suite installs everything, so a page that quietly needs ``httpx``, ``pytest``
or an extra it never mentions would pass here and fail for the reader. This
reads each page's Python blocks (their imports) and shell blocks (the
commands that load an extra) and checks that the page names each package's
extra, or the package itself, in a ``pip install`` line or a ``leaseq[...]``
mention; and that examples import only leaseq's public modules, never the
modules behind them.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from .markdown_blocks import PYTHON, SHELL, parse

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

#: leaseq's own dependencies (pyproject.toml's ``dependencies``): always installed.
BASE = {"psycopg", "psycopg_pool", "click", "rich"}
#: What each third-party module needs installed: an extra of leaseq's, or a package named on the page.
#: The longest dotted prefix wins (``fastapi.testclient`` needs httpx beside the server extra).
NEEDS: dict[str, tuple[str, ...]] = {
    "fastapi": ("extra:server",), "starlette": ("extra:server",), "uvicorn": ("extra:server",),
    "jinja2": ("extra:server",), "fastapi.testclient": ("extra:server", "httpx"), "httpx": ("httpx",),
    "prometheus_client": ("extra:metrics",), "cronsim": ("extra:schedules",), "mcp": ("extra:mcp",),
    "opentelemetry": ("extra:otel",), "opentelemetry.sdk": ("extra:otel", "opentelemetry-sdk"),
    "pydantic_ai": ("extra:pydantic-ai",), "agents": ("extra:openai-agents",),
    "openai": ("extra:openai-agents",), "langgraph": ("extra:langgraph",), "langchain_core": ("extra:langgraph",),
    "django": ("django",), "pytest": ("pytest",), "urllib3": ("extra:client",), "pydantic": ("pydantic",),
    "leaseq.integrations.pydantic_ai": ("extra:pydantic-ai",),
    "leaseq.integrations.openai_agents": ("extra:openai-agents",),
    "leaseq.integrations.langgraph": ("extra:langgraph",),
}
#: Shell commands that load an extra.
COMMANDS: dict[str, tuple[str, ...]] = {
    r"\bleaseq\s+(?:--\S+\s+\S+\s+)*serve\b": ("extra:server",),
    r"\bleaseq\s+(?:--\S+\s+\S+\s+)*mcp\b": ("extra:mcp",),
    r"\bleaseq\s+(?:--\S+\s+\S+\s+)*worker\b[^\n]*--server\b": ("extra:client",),
    r"--metrics-port\b": ("extra:metrics",),
    r"^\s*mkdocs\b": ("extra:docs",),
}
#: leaseq's public modules: examples import these, never the modules behind them.
PUBLIC = {"leaseq", "leaseq.fencing", "leaseq.client", "leaseq.integrations.pydantic_ai",
          "leaseq.integrations.openai_agents", "leaseq.integrations.langgraph"}
#: Extras that bring others with them.
IMPLIES = {"test": {"server", "client", "mcp", "docs", "schedules", "metrics", "otel", "pydantic-ai",
                    "openai-agents", "langgraph"}, "docs": {"server"}}
EXTRAS = re.compile(r"(?:leaseq|\.)\[([a-z0-9,-]+)\]")
PIP = re.compile(r"pip install ([^`\n]*)")


def named(text: str) -> set[str]:
    """What a page tells its reader to install: ``extra:NAME`` for each extra, and package names."""
    extras = {e for group in EXTRAS.findall(text) for e in group.split(",")}
    for e in list(extras):
        extras |= IMPLIES.get(e, set())
    packages = {word.strip("'\"") for line in PIP.findall(text) for word in line.split()
                if re.fullmatch(r"['\"]?[A-Za-z][A-Za-z0-9_.-]*['\"]?", word)}
    return {f"extra:{e}" for e in extras} | packages


def _need(module: str) -> tuple[str, ...] | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in NEEDS:
            return NEEDS[".".join(parts[:n])]
    return None


def needed(path: Path) -> tuple[dict[str, set[str]], list[str]]:
    """What the page's examples need (requirement -> where), and the private leaseq modules they import."""
    page = parse(path)
    own = set()  # modules the page writes itself (# file: NAME)
    for block in page.blocks:
        if block.file_name and block.file_name.endswith(".py"):
            own.add(block.file_name[:-3].split("/")[0])
    needs: dict[str, set[str]] = {}
    private: list[str] = []
    for block in page.blocks:
        if block.skip is not None:
            continue
        if block.language in PYTHON:
            modules = []
            for node in ast.walk(ast.parse(block.code)):
                if isinstance(node, ast.Import):
                    modules += [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules.append(node.module)
            for module in modules:
                top = module.split(".")[0]
                if top in own or top in sys.stdlib_module_names or top in BASE:
                    continue
                if top == "leaseq" and module not in PUBLIC:
                    private.append(f"{block.where}: {module}")
                for requirement in _need(module) or (() if top == "leaseq" else (f"unknown:{module}",)):
                    needs.setdefault(requirement, set()).add(block.where)
        elif block.language in SHELL:
            for pattern, requirements in COMMANDS.items():
                if re.search(pattern, block.code, re.M):
                    for requirement in requirements:
                        needs.setdefault(requirement, set()).add(block.where)
    return needs, private


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_names_what_its_examples_need(path: Path) -> None:
    needs, private = needed(path)
    assert private == [], "examples import leaseq's internal modules (import the public name instead)"
    missing = {r: sorted(where) for r, where in needs.items() if r not in named(path.read_text(encoding="utf-8"))}
    assert missing == {}, "the page's examples need what the page never tells the reader to install " \
                          "(name the extra, e.g. pip install '.[server]', or the package)"


def test_the_check_finds_what_a_page_leaves_out(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nimport pytest\nfrom fastapi.testclient import TestClient\n"
                    "from leaseq.worker.context import TaskContext\n```\n\n```sh\nleaseq serve --port 1\n```\n")
    needs, private = needed(page)
    assert set(needs) == {"pytest", "extra:server", "httpx"}
    assert private == [f"{page}:1: leaseq.worker.context"]
    assert named("Install with `pip install '.[server]' httpx`.") >= {"extra:server", "httpx"}
    assert "extra:otel" in named("`pip install -e '.[test]'`")
