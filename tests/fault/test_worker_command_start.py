"""The real `leaseq worker` command, started before its PostgreSQL server is up, waits for it.

A private server (Debian's initdb and pg_ctl, in a temporary folder, on a free
port) is created but not started; the command is started against it with
`--migrate`, as a deployment's first boot would. It must say once that it
waits and keep waiting (before, it exited 1 at once); once the server starts,
it connects, creates the schema, registers and runs a task, and SIGTERM stops
it with status 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import leaseq
from leaseq_chaos.pgserver import ThrowawayPostgres
from system_tools import require_tool

from .support import ROOT, wait_for

APP = textwrap.dedent('''
    import leaseq

    app = leaseq.App()

    @app.task("greet")
    def greet(ctx, name):
        return {"greeting": f"hello, {name}"}
''')

WAITING = "waiting for the queue"


@pytest.fixture
def server_not_up() -> Iterator[ThrowawayPostgres]:
    """A private PostgreSQL server, initialized but not started: nothing listens on its port."""
    require_tool("pg_ctl")  # a skip naming it; a failure in CI
    server = ThrowawayPostgres(max_connections=20).create()
    try:
        yield server
    finally:
        server.stop()


def test_the_worker_command_waits_for_postgresql_to_come_up(server_not_up: ThrowawayPostgres,
                                                            tmp_path: Path) -> None:
    (tmp_path / "greeter.py").write_text(APP)
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if k != "LEASEQ_DSN"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    dsn = server_not_up.dsn()
    with log.open("w") as out:
        worker = subprocess.Popen([sys.executable, "-m", "leaseq.cli.main", "--dsn", dsn, "worker", "greeter:app",
                                   "--migrate", "--poll-interval", "0.1"],
                                  cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: WAITING in log.read_text() or worker.poll() is not None, 30,
                 "the worker saying it waits for the database")
        time.sleep(1.0)  # a few more tries, each refused
        assert worker.poll() is None, f"the worker gave up while the server was down:\n{log.read_text()}"

        server_not_up.start()
        wait_for(lambda: " started: " in log.read_text(), 30, "the worker connected, migrated and registered")
        with leaseq.connect(dsn) as q:
            assert q.schema_version() > 0, "the worker's --migrate created the schema"
            task = q.enqueue("greet", {"name": "late server"})
            wait_for(lambda: q.get(task.id).status == "completed", 30, "the task run by the worker")
            assert q.get(task.id).result == {"greeting": "hello, late server"}
            assert q.get(task.id).attempts == 1

        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    text = log.read_text()
    waiting = [line for line in text.splitlines() if WAITING in line]
    assert len(waiting) == 1, f"one line while it waits, not one per try:\n{text}"
    assert "cannot connect to PostgreSQL" in waiting[0] and "Traceback" not in text, text
    assert "worker stopped: completed 1," in text, text
