"""``leaseq worker`` as an operator runs it: schema step, --until-idle, logs, progress line, HTTP quietness."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import textwrap
import time
from urllib.parse import urlsplit, urlunsplit

import pytest

import leaseq

from .cli_support import CLI, assert_one_error_line, cli_env

APP = textwrap.dedent('''
    import time
    import leaseq

    app = leaseq.App()

    @app.task("quick")
    def quick(ctx, n=0):
        return {"n": n}

    @app.task("slow")
    def slow(ctx, seconds=0.0, fail=False):
        time.sleep(seconds)
        if fail:
            raise leaseq.Permanent("no such mailbox")
''')


@pytest.fixture
def app_dir(run_cli):
    (run_cli.cwd / "jobs.py").write_text(APP)
    return run_cli.cwd


def schema_version(dsn: str) -> int:
    with leaseq.connect(dsn) as q:
        return q.schema_version()


def test_worker_refuses_a_database_without_schema(dsn, run_cli, app_dir):
    if dsn.startswith("sqlite"):
        with leaseq.connect(dsn):
            pass  # the file exists, without a schema
    line = assert_one_error_line(run_cli("--dsn", dsn, "worker", "jobs:app", "--until-idle"), "database")
    assert "has no leaseq schema; run `leaseq migrate` first" in line and "--migrate" in line
    ls_line = assert_one_error_line(run_cli("--dsn", dsn, "ls"), "database")
    assert ls_line.split(";")[0] == line.split(";")[0], "the same wording as ls"
    assert schema_version(dsn) == 0, "a refused worker must create nothing"
    # $LEASEQ_DSN is a named database as well.
    proc = run_cli("worker", "jobs:app", "--until-idle", env=cli_env(LEASEQ_DSN=dsn))
    assert "leaseq migrate" in assert_one_error_line(proc, "database")
    assert schema_version(dsn) == 0
    # With --migrate, the worker prepares it and works.
    proc = run_cli("--dsn", dsn, "worker", "jobs:app", "--until-idle", "--migrate")
    assert proc.returncode == 0, proc.stderr
    assert schema_version(dsn) > 0


def test_worker_fails_at_once_for_what_waiting_cannot_heal(pg_schema_dsn, run_cli, app_dir):
    """A worker waits for a database it cannot reach (tests/fault/test_worker_command_start.py),
    but a login the server refuses, a DSN that cannot be parsed and an app that cannot be
    loaded end it at once with one line, status 2."""
    parts = urlsplit(pg_schema_dsn)
    no_role = urlunsplit(parts._replace(netloc=f"leaseq_no_such_role@{parts.hostname}:{parts.port or 5432}"))
    no_database = urlunsplit(parts._replace(path="/leaseq_no_such_database"))
    cases = [
        (["--dsn", no_role, "worker", "jobs:app", "--migrate"], "dsn",
         ["PostgreSQL refused the connection", "leaseq_no_such_role"]),
        (["--dsn", no_database, "worker", "jobs:app"], "dsn",
         ["PostgreSQL refused the connection", "leaseq_no_such_database"]),
        (["--dsn", pg_schema_dsn + "&no_such_parameter=1", "worker", "jobs:app", "--migrate"], "dsn",
         ["cannot parse", "no_such_parameter"]),
        (["--dsn", pg_schema_dsn, "worker", "no_such_module:app", "--migrate"], "app", ["no_such_module"]),
    ]
    for args, field, words in cases:
        started = time.monotonic()
        line = assert_one_error_line(run_cli(*args, timeout=30), field)
        assert time.monotonic() - started < 15, f"{args}: took {time.monotonic() - started:.1f}s"
        for word in words:
            assert word in line, line
    assert schema_version(pg_schema_dsn) == 0, "nothing was migrated"


def test_a_mistyped_app_name_says_which_apps_the_module_has(run_cli, app_dir):
    line = assert_one_error_line(run_cli("worker", "jobs:nope"), "app")
    assert "module 'jobs' has no attribute 'nope'" in line and "jobs:app" in line and "NoneType" not in line
    (app_dir / "plain.py").write_text("x = 1\n")
    line = assert_one_error_line(run_cli("worker", "plain:app"), "app")
    assert "defines no leaseq.App" in line
    line = assert_one_error_line(run_cli("worker", "plain:x"), "app")
    assert "'plain:x' is not a leaseq.App (it is of type int)" in line


def test_worker_refuses_a_missing_sqlite_file(run_cli, app_dir):
    target = run_cli.cwd / "typo.db"
    line = assert_one_error_line(run_cli("--dsn", f"sqlite:///{target}", "worker", "jobs:app"), "dsn")
    assert "leaseq migrate" in line and "--migrate" in line
    assert not target.exists()


def test_until_idle_drains_and_exits(dsn, run_cli, app_dir):
    with leaseq.connect(dsn) as q:
        q.migrate()
        ids = [q.enqueue("quick", {"n": i}).id for i in range(5)]
        failing = q.enqueue("slow", {"fail": True}).id
        later = q.enqueue("quick", {"n": 99}, delay=3600).id
    started = time.monotonic()
    proc = run_cli("--dsn", dsn, "worker", "jobs:app", "--until-idle", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 60
    with leaseq.connect(dsn) as q:
        assert [q.get(i).status for i in ids] == ["completed"] * 5
        assert q.get(failing).status == "dead"
        assert q.get(later).status == "queued", "a task not yet due does not keep the worker up"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("worker stopped: completed 5, failed 1, lost 0, released 0"), last
    assert "WorkerStats(" not in proc.stderr


def test_json_logs(dsn, run_cli, app_dir):
    with leaseq.connect(dsn) as q:
        q.migrate()
        done = q.enqueue("quick", {"n": 1}).id
        dead = q.enqueue("slow", {"fail": True}).id
    proc = run_cli("--dsn", dsn, "worker", "jobs:app", "--until-idle", "--log-format", "json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines()]  # every line is one JSON object
    for record in lines:
        assert {"time", "level", "logger", "message"} <= set(record), record
        assert record["time"].endswith("Z")
    by_task = {r.get("task_id"): r for r in lines if "task_id" in r}
    completed = by_task[done]
    assert (completed["level"], completed["message"], completed["generation"]) == ("info", "completed", 1)
    assert completed["worker"].startswith("worker-")
    failed = by_task[dead]
    assert failed["level"] == "warning" and "no such mailbox" in failed["message"]
    final = lines[-1]
    assert final["message"].startswith("worker stopped: completed 1, failed 1")
    assert final["stats"]["completed"] == 1 and final["stats"]["failed"] == 1
    assert "WorkerStats(" not in proc.stderr


def read_all(fd: int) -> str:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        out += chunk
    return out.decode()


def test_progress_line_stays_readable_on_a_terminal(tmp_path, run_cli, app_dir):
    dsn = f"sqlite:///{tmp_path / 'progress.db'}"
    with leaseq.connect(dsn) as q:
        q.migrate()
        for i in range(4):
            q.enqueue("quick", {"n": i})
        for _ in range(2):  # failures logged while the progress line is on screen
            q.enqueue("slow", {"seconds": 2.5, "fail": True})
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([*CLI, "--dsn", dsn, "worker", "jobs:app", "--until-idle", "--progress"],
                            cwd=run_cli.cwd, env=cli_env(), stdout=subprocess.PIPE, stderr=secondary)
    os.close(secondary)
    try:
        err = read_all(primary)
        assert proc.wait(timeout=120) == 0, err
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    # Per-task INFO lines give way to the progress line; warnings still show.
    assert not re.search(r"task=\d+ gen=\d+ worker=\S+: completed", err), err
    warnings = [m.start() for m in re.finditer(r"\d{4}-\d\d-\d\d [\d:,]+ WARNING", err)]
    assert len(warnings) == 2, err
    for at in warnings:
        # Each log line starts on a cleared line (never glued after the progress text)...
        assert err[:at].endswith("\r\x1b[2K") or err[:at].endswith("\n"), repr(err[max(0, at - 80):at + 20])
        # ...and the progress line is drawn again below it.
        assert re.match(r"[^\n]*\r?\nclaimed \d+ ", err[at:]), repr(err[at:at + 300])
    assert re.search(r"claimed 6  completed 4  failed 2  lost 0  released 0 [^\n]*\r?\n"
                     r"worker stopped: completed 4, failed 2", err), repr(err[-300:])


def test_worker_over_http_does_not_log_every_request(tmp_path, run_cli, app_dir):
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    from leaseq import auth

    dsn = f"sqlite:///{tmp_path / 'served.db'}"
    with leaseq.connect(dsn) as q:
        q.migrate()
        token, _ = auth.create_token(q, name="w", role="worker", all_queues=True)
        ids = [q.enqueue("quick", {"n": i}).id for i in range(3)]
    (tmp_path / "worker.token").write_text(token)
    server = subprocess.Popen([*CLI, "--dsn", dsn, "serve", "--port", "0", "--log-level", "warning"],
                              cwd=run_cli.cwd, env=cli_env(), stderr=subprocess.PIPE, text=True)
    try:
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", server.stderr.readline())
        assert m
        proc = run_cli("worker", "jobs:app", "--server", m.group(1), "--token-file", str(tmp_path / "worker.token"),
                       "--until-idle", "--log-level", "info", timeout=120)
    finally:
        server.terminate()
        server.wait(timeout=30)
        server.stderr.close()
    assert proc.returncode == 0, proc.stderr
    with leaseq.connect(dsn) as q:
        assert [q.get(i).status for i in ids] == ["completed"] * 3
    assert "completed" in proc.stderr, "the worker's own INFO lines are still shown"
    assert "HTTP Request" not in proc.stderr and "httpx" not in proc.stderr, proc.stderr


def blocked(modules: list[str], *args: str) -> list[str]:
    """Run the CLI in a Python where ``modules`` cannot be imported (as if their extra were not installed)."""
    code = ("import sys\n"
            f"for name in {modules!r}:\n"
            "    sys.modules[name] = None  # 'import name' now raises ModuleNotFoundError\n"
            "from leaseq.cli.main import main\n"
            "main(sys.argv[1:])\n")
    return [sys.executable, "-c", code, *args]


SERVER_MODULES = ["fastapi", "starlette", "uvicorn", "jinja2", "multipart", "python_multipart", "prometheus_client"]


def test_missing_extras_are_one_line(tmp_path, run_cli, app_dir):
    dsn = f"sqlite:///{tmp_path / 'q.db'}"
    with leaseq.connect(dsn) as q:
        q.migrate()
    proc = subprocess.run(blocked(SERVER_MODULES, "--dsn", dsn, "serve", "--port", "0"), capture_output=True,
                          text=True, timeout=60, cwd=run_cli.cwd, env=cli_env())
    line = assert_one_error_line(proc, "server")
    # the words that work from a checkout too, where 'leaseq[server]' would look leaseq up on an index
    assert "pip install 'leaseq[server]'" in line and "from a checkout of leaseq: pip install '.[server]'" in line
    (tmp_path / "worker.token").write_text("t")
    proc = subprocess.run(blocked(["urllib3"], "worker", "jobs:app", "--server", "http://127.0.0.1:1",
                                  "--token-file", str(tmp_path / "worker.token")), capture_output=True, text=True,
                          timeout=60, cwd=run_cli.cwd, env=cli_env())
    assert "pip install '.[client]'" in assert_one_error_line(proc, "client")


def test_library_and_demo_need_no_server_extra(tmp_path, run_cli):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    everything = [*SERVER_MODULES, "urllib3", "httpx", "httpcore"]
    proc = subprocess.run(blocked(everything, "demo"), capture_output=True, text=True, timeout=120,
                          cwd=run_cli.cwd, env=cli_env(TMPDIR=str(scratch)))
    assert proc.returncode == 0, proc.stderr
    assert "Done in" in proc.stdout
    for args in (["--help"], ["enqueue", "x"], ["ls"], ["tokens", "list"]):
        proc = subprocess.run(blocked(everything, *args), capture_output=True, text=True, timeout=60,
                              cwd=run_cli.cwd, env=cli_env())
        assert proc.returncode == 0, (args, proc.stderr)
