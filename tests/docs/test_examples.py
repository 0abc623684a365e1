"""Every code block of the README and the docs runs as written.

A renamed argument, a removed command or option, or an example that no longer
does what its page says breaks one of these tests, not a reader. See
``runner.py`` for how blocks run and ``markdown_blocks.py`` for the
directives a page may carry.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from system_tools import REQUIRE_TOOLS, TOOLS, Tool, require_tools

from .markdown_blocks import PARSED, PYTHON, SHELL, SHOWN_ONLY, indented_code, parse
from .runner import ExampleFailed, run_page, tools_needed

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
PG_DSN = os.environ.get("LEASEQ_TEST_PG_DSN")
#: Blocks that cannot run as written (a server that runs until stopped, an install, a run of
#: minutes, the model checker over the repository's own model/ folder). Each carries its
#: reason on the page; keep them few.
MAX_SKIPPED = 17


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", PAGES, ids=_id)
def test_page_examples_run(path: Path, tmp_path: Path):
    page = parse(path)
    if page.postgres and not PG_DSN:
        if os.environ.get("LEASEQ_REQUIRE_PG") == "1":
            pytest.fail("LEASEQ_REQUIRE_PG=1 but LEASEQ_TEST_PG_DSN is not set")
        pytest.skip("this page runs on PostgreSQL: set LEASEQ_TEST_PG_DSN")
    require_tools(tools_needed(page))  # HAProxy, curl, psql: a skip naming the missing one (CI: a failure)
    run_page(page, tmp_path / "page", pg_dsn=PG_DSN)


def test_the_tools_a_page_runs_are_found():
    """The pages that run a system tool are seen to (so a machine without it skips them), and
    only what runs counts: a skipped block, a file, a comment or an argument does not."""
    assert tools_needed(parse(ROOT / "docs" / "replicas.md")) == {"haproxy"}
    assert tools_needed(parse(ROOT / "docs" / "tutorial.md")) == {"curl"}
    assert tools_needed(parse(ROOT / "docs" / "how-to" / "postgresql.md")) == {"psql"}
    assert tools_needed(parse(ROOT / "docs" / "how-to" / "fastapi.md")) == set()


def test_a_page_needing_a_missing_tool_is_skipped_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(TOOLS, "leaseq-absent-tool", Tool("leaseq-absent-tool", "nothing that exists"))
    page = tmp_path / "tool.md"
    page.write_text("```sh\nleaseq migrate && FOO=1 leaseq-absent-tool --check | cat\n```\n\n"
                    "<!-- docs-test: skip: shown only -->\n```sh\nhaproxy -f x.cfg\n```\n\n"
                    "```sh\necho curl  # psql\n```\n")
    needed = tools_needed(parse(page))
    assert needed == {"leaseq-absent-tool"}
    monkeypatch.delenv(REQUIRE_TOOLS, raising=False)
    monkeypatch.delenv("LEASEQ_REQUIRE_PG", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs leaseq-absent-tool, which is not installed"):
        require_tools(needed)
    monkeypatch.setenv(REQUIRE_TOOLS, "1")
    with pytest.raises(pytest.fail.Exception, match="LEASEQ_REQUIRE_TOOLS=1 but leaseq-absent-tool is not installed"):
        require_tools(needed)
    monkeypatch.setitem(TOOLS, "leaseq-present-tool", Tool("leaseq-present-tool", "", (sys.executable,)))
    require_tools({"leaseq-present-tool"})  # installed: runs, even when tools are required


def test_every_example_is_fenced_and_accounted_for():
    skipped, runnable = [], 0
    for path in PAGES:
        assert not indented_code(path), f"{_id(path)}: indented code blocks at lines {indented_code(path)}: fence them"
        for block in parse(path).blocks:
            assert block.language, f"{block.where}: a code block needs a language"
            if block.skip is not None:
                skipped.append(f"{block.where}: {block.skip}")
            elif block.file_name or block.language in PYTHON | SHELL | PARSED:
                runnable += 1
            else:
                assert block.language in SHOWN_ONLY, (
                    f"{block.where}: a {block.language} block is neither run, a file, nor skipped with a reason")
    assert runnable >= 40
    assert len(skipped) <= MAX_SKIPPED, "\n".join(skipped)


def test_a_broken_example_fails(tmp_path: Path):
    """The runner can fail: a wrong keyword, a failing command and a missing command option each raise."""
    page = tmp_path / "broken.md"
    cases = [
        '```python\nimport leaseq\nq = leaseq.connect()\nq.migrate()\nq.enqueue("k", {}, lease_secs=3)\n```\n',
        "```sh\nleaseq enqueue k --no-such-option 1\n```\n",
        "```sh\nfalse | cat\necho never\n```\n",
        "```yaml\nkey: value\n```\n",
        "<!-- docs-test: background: a server that dies at once -->\n```sh\nexit 3\n```\n",
    ]
    for n, text in enumerate(cases):
        page.write_text(text)
        with pytest.raises(ExampleFailed):
            run_page(parse(page), tmp_path / f"run{n}")


def test_pages_share_a_namespace_and_the_shell_environment(tmp_path: Path):
    page = tmp_path / "flow.md"
    page.write_text(
        "```python\n# file: myapp.py\nVALUE = 41\n```\n\n"
        "```sh\nexport GREETING=hello\nleaseq migrate\n```\n\n"
        "```python\nimport os, myapp\nanswer = myapp.VALUE + 1\nassert os.environ['GREETING'] == 'hello'\n```\n\n"
        "```python\nassert answer == 42\n```\n\n"
        "<!-- docs-test: skip: runs until stopped -->\n```sh\nexit 1\n```\n")
    ran = run_page(parse(page), tmp_path / "run")
    assert len(ran) == 4


def test_the_readme_test_command_is_the_one_ci_runs():
    """CI runs the README's test command (and the type check beside it, started first): the
    same pytest runs, in the same order; the two must not drift apart."""
    install = "python -m pip install -e '.[test]' -e ./chaos && pytest"
    [line] = [row for row in (ROOT / "README.md").read_text().splitlines() if row.startswith(install)]
    runs = [run.strip() for run in line.split("#")[0].split("&&")[1:]]
    assert runs and all(run.startswith("pytest") for run in runs), line
    ci = (ROOT / ".ci" / "run").read_text()
    at = ci.index("\npython -m pip install -q -e '.[test]' -e ./chaos\n")
    at = ci.index(" python -m mypy --strict src/leaseq ", at)  # at the idle priority: chrt --idle 0
    for run in runs:  # each where CI runs it, after the one before
        at = ci.index("\n" + run.replace("pytest", "pytest -q -p no:cacheprovider", 1), at + 1)
