"""Run a Markdown page's code blocks in order, as a reader would type them.

Every page runs in a fresh folder of its own (the current directory while it
runs), with ``$LEASEQ_DSN`` unset, so ``leaseq.connect()`` and the ``leaseq``
command use the embedded default, ``sqlite:///leaseq.db`` in that folder.

- ``python`` blocks run in this process, one namespace per page, so a later
  block sees what an earlier one defined; the page's folder is on
  ``sys.path``, so ``# file: myapp.py`` blocks import as ``myapp``.
- ``sh`` blocks run in ``bash -e -o pipefail`` in the page's folder; ``leaseq``
  on their ``PATH`` is this checkout's command (``python -m leaseq.cli``).
  Variables a block exports are seen by the blocks after it, Python ones too.
- A ``background`` block (``leaseq serve``) runs in its own process group
  while the rest of the page runs; the runner waits for ``/healthz`` on the
  port the page names and stops the group when the page ends. The port the
  docs use, 8765, stands for a free port chosen for the page.
- A ``page: postgres`` page runs on a fresh PostgreSQL schema: ``PGOPTIONS``
  sets its search_path for every connection that does not choose one, and
  the server written in the docs, ``postgresql://postgres@127.0.0.1:5432/test``,
  stands for ``$LEASEQ_TEST_PG_DSN``.
- A page whose shell blocks run a system tool that a fresh machine may lack
  (HAProxy, curl, psql: see ``tests/system_tools.py``) is skipped, naming
  the tool, when it is not installed (:func:`tools_needed`); with
  ``LEASEQ_REQUIRE_TOOLS=1`` (CI) it fails instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from system_tools import TOOLS

from .markdown_blocks import PARSED, PYTHON, SHELL, SHOWN_ONLY, Block, Page

#: The PostgreSQL server the docs name; the runner points it at the test server.
DOCUMENTED_PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"
SHELL_TIMEOUT = 120
#: The port the docs serve on; a page's blocks get a free one in its place.
DOCUMENTED_PORT = 8765
PORT = re.compile(rf"(?<=[: ]){DOCUMENTED_PORT}\b")
SERVER_START_TIMEOUT = 60
#: A command's first word: at a line's start, or after a pipe, a list operator, a subshell or a
#: command substitution, past any VAR=value assignments and a leading sudo, exec, if, then, do or !.
COMMAND_WORD = re.compile(r"(?:^|[|;&(`]|\$\()\s*(?:(?:sudo|exec|command|time|if|then|do|while|!)\s+)*"
                          r"(?:\w+=\S*\s+)*(?P<word>[\w./-]+)", re.M)
SHELL_COMMENT = re.compile(r"(?:^|(?<=\s))#.*$", re.M)


class ExampleFailed(AssertionError):
    """A block did not run as written."""


def _leaseq_command(bin_dir: Path) -> None:
    script = bin_dir / "leaseq"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m leaseq.cli.main "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def _read_env(path: Path) -> dict[str, str]:
    env = {}
    for item in path.read_bytes().split(b"\0"):
        if b"=" in item:
            key, value = item.decode(errors="replace").split("=", 1)
            env[key] = value
    return env


@contextlib.contextmanager
def _page_environment(env: dict[str, str], workdir: Path) -> Iterator[None]:
    """os.environ, the current directory and sys.path as the page sees them; restored after."""
    saved_env, saved_cwd, saved_path = dict(os.environ), os.getcwd(), list(sys.path)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(workdir)
    sys.path.insert(0, str(workdir))
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path


def _page_modules(workdir: Path) -> dict[str, object]:
    return {name: module for name, module in list(sys.modules.items())
            if str(getattr(module, "__file__", "") or "").startswith(str(workdir))}


def _close_queues(namespace: dict, workdir: Path) -> None:
    """Close what the page opened and forget the modules it wrote, so nothing outlives it."""
    import leaseq

    values = list(namespace.values())
    for name, module in _page_modules(workdir).items():
        values.extend(vars(module).values())
        del sys.modules[name]
    for value in values:
        for candidate in (value, getattr(value, "_queue", None)):
            if isinstance(candidate, leaseq.Queue):
                with contextlib.suppress(Exception):
                    candidate.close()


def tools_needed(page: Page) -> set[str]:
    """The system tools (names in ``system_tools.TOOLS``) that the page's shell blocks run."""
    needed = set()
    for block in page.blocks:
        if block.skip is not None or block.language not in SHELL or block.file_name:
            continue
        for match in COMMAND_WORD.finditer(SHELL_COMMENT.sub("", block.code)):
            word = match["word"].rsplit("/", 1)[-1]
            if word in TOOLS:
                needed.add(word)
    return needed


def run_page(page: Page, workdir: Path, *, pg_dsn: str | None = None) -> list[Block]:
    """Run every block of ``page`` in ``workdir``; returns the blocks that ran. Raises ExampleFailed."""
    bin_dir = workdir / ".bin"
    bin_dir.mkdir(parents=True)
    _leaseq_command(bin_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEASEQ_DSN", "LEASEQ_ACTION_KEYS", "PGOPTIONS"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", COLUMNS="120", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(workdir)) if p)
    schemas: list[str] = []
    if page.postgres or page.owned_schemas:
        if not pg_dsn:
            raise ExampleFailed(f"{page.path}: needs PostgreSQL (LEASEQ_TEST_PG_DSN)")
        schemas = list(page.owned_schemas)
        if page.postgres:
            schema = f"t_docs_{uuid.uuid4().hex[:12]}"
            schemas.append(schema)
            env["PGOPTIONS"] = f"-csearch_path={schema}"
        _drop_schemas(pg_dsn, page.owned_schemas)
        if page.postgres:
            _create_schema(pg_dsn, schemas[-1])
    namespace: dict = {"__name__": "__docs_example__"}
    ran = []
    servers: list[subprocess.Popen] = []
    port = _free_port()
    try:
        for block in page.blocks:
            if block.skip is not None or block.language in SHOWN_ONLY:
                continue
            code = PORT.sub(str(port), block.code)
            if pg_dsn and pg_dsn != DOCUMENTED_PG_DSN:
                code = code.replace(DOCUMENTED_PG_DSN, pg_dsn)
            name = block.file_name
            if block.background is not None:
                servers.append(_start_background(block, code, env, workdir, port))
                ran.append(block)
                continue
            if name:
                target = workdir / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(code, encoding="utf-8")
            elif block.language in PYTHON:
                _run_python(block, code, namespace, env, workdir)
            elif block.language in SHELL:
                env = _run_shell(block, code, env, workdir)
            elif block.language in PARSED:
                try:
                    json.loads(code)
                except ValueError as exc:
                    raise ExampleFailed(f"{block.where}: not valid JSON: {exc}") from None
            else:
                raise ExampleFailed(f"{block.where}: a {block.language or 'plain'} block is neither run, "
                                    "written as a file (# file: NAME), nor marked skip with a reason")
            ran.append(block)
    finally:
        for server in servers:
            _stop(server)
        with _page_environment(env, workdir):
            _close_queues(namespace, workdir)
        if pg_dsn and schemas:
            _drop_schemas(pg_dsn, schemas)
    return ran


def _run_python(block: Block, code: str, namespace: dict, env: dict[str, str], workdir: Path) -> None:
    with _page_environment(env, workdir):
        try:
            exec(compile(code, block.where, "exec"), namespace)  # noqa: S102 - the docs' own examples
        except BaseException as exc:  # SystemExit too: an example must not exit the test run
            raise ExampleFailed(f"{block.where}: {type(exc).__name__}: {exc}\n"
                                f"{textwrap.indent(code, '    ')}") from exc


def _run_shell(block: Block, code: str, env: dict[str, str], workdir: Path) -> dict[str, str]:
    dump = workdir / ".env-after"
    script = f"set -e -o pipefail\n{code}\nenv -0 > {str(dump)!r}\n"
    try:
        proc = subprocess.run(["bash", "-c", script], cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=SHELL_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise ExampleFailed(f"{block.where}: still running after {SHELL_TIMEOUT} s\n{code}") from exc
    if proc.returncode != 0:
        raise ExampleFailed(f"{block.where}: exit status {proc.returncode}\n{textwrap.indent(code, '    ')}\n"
                            f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return _read_env(dump)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_background(block: Block, code: str, env: dict[str, str], workdir: Path, port: int) -> subprocess.Popen:
    """Start the block in a process group of its own; return once /healthz answers on ``port``."""
    log = workdir / f".background-{block.line}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "-c", f"set -e -o pipefail\n{code}"], cwd=workdir, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    import httpx

    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ExampleFailed(f"{block.where}: exited with status {proc.returncode}\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        time.sleep(0.2)
    _stop(proc)
    raise ExampleFailed(f"{block.where}: nothing answered on port {port} within {SERVER_START_TIMEOUT} s\n"
                        f"{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the block's process group, SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _create_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')


def _drop_schemas(dsn: str, schemas: list[str]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
