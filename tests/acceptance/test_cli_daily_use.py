"""Daily use of the real ``leaseq`` command: pipes, environment variables, scheduling, keys, migrations."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from datetime import datetime, timedelta, timezone

import leaseq
from conformance.support import run_out

from .cli_support import CLI, assert_one_error_line, cli_env, snapshot


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc.stdout


def schema_version(dsn: str) -> int:
    with leaseq.connect(dsn) as q:
        return q.schema_version()


def reconciliation_task(dsn: str, kind: str) -> leaseq.Task:
    """A side-effect task whose worker recorded an intent and vanished: needs_reconciliation."""
    with leaseq.connect(dsn) as q:
        q.migrate()
        w = q.register_worker("gone")
        task = q.enqueue(kind, {"to": "a@example.com"}, effect="side_effect", queue="outbound-mail-priority")
        [claim] = q.claim(w, queue="outbound-mail-priority")
        q.begin_effect(w, claim, "email.send")
        run_out(q, w, claim)
        q.sweep()
        assert q.get(task.id).status == "needs_reconciliation"
        return task


def test_piped_tables_keep_whole_rows(dsn, run_cli):
    kind = "send_quarterly_account_statement_with_attachments"
    task = reconciliation_task(dsn, kind)
    # A real shell pipe, in an 80-column environment: rows must not wrap or fold.
    command = " ".join(map(shlex.quote, [*CLI, "--dsn", dsn, "ls", "--status", "needs_reconciliation"]))
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {command} | grep needs_reconciliation"],
                          capture_output=True, text=True, timeout=60, cwd=run_cli.cwd, env=cli_env())
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    [line] = proc.stdout.splitlines()
    assert line.split()[:4] == [str(task.id), "outbound-mail-priority", kind, "needs_reconciliation"], line
    assert len(line) > 80
    # The other tables too: the whole row on one line.
    stats = [line for line in ok(run_cli("--dsn", dsn, "stats")).splitlines() if "needs_reconciliation" in line]
    assert stats and "outbound-mail-priority" in stats[0]
    shown = ok(run_cli("--dsn", dsn, "show", str(task.id)))
    assert any(kind in line and "needs_reconciliation" in line for line in shown.splitlines())


def test_every_option_has_an_environment_variable(dsn, run_cli):
    cli = lambda *args, env=None: run_cli(*args, env=cli_env(LEASEQ_DSN=dsn, **(env or {})))  # noqa: E731
    ok(cli("migrate"))
    ok(cli("enqueue", "a", env={"LEASEQ_ENQUEUE_QUEUE": "jobs", "LEASEQ_ENQUEUE_PRIORITY": "7"}))
    ok(cli("enqueue", "b", "--queue", "other", env={"LEASEQ_ENQUEUE_QUEUE": "jobs"}))  # the flag wins
    listed = json.loads(ok(cli("ls", env={"LEASEQ_LS_JSON": "1"})))
    assert sorted((t["kind"], t["queue"], t["priority"]) for t in listed) == [("a", "jobs", 7), ("b", "other", 0)]
    only = json.loads(ok(cli("ls", "--json", env={"LEASEQ_LS_QUEUE": "jobs"})))
    assert [t["kind"] for t in only] == ["a"]
    # A bad value from the environment is a clear usage error, and changes nothing.
    before = snapshot(dsn)
    proc = cli("enqueue", "c", env={"LEASEQ_ENQUEUE_PRIORITY": "high"})
    assert proc.returncode == 2 and "LEASEQ_ENQUEUE_PRIORITY" in proc.stderr and "Traceback" not in proc.stderr
    assert snapshot(dsn) == before
    # --help names the variables.
    for command, names in ((["worker"], ["LEASEQ_WORKER_CONCURRENCY", "LEASEQ_WORKER_UNTIL_IDLE",
                                         "LEASEQ_WORKER_LOG_FORMAT"]),
                           (["enqueue"], ["LEASEQ_ENQUEUE_AT", "LEASEQ_ENQUEUE_KEY"]),
                           (["tokens", "create"], ["LEASEQ_TOKENS_CREATE_ROLE"]),
                           ([], ["LEASEQ_DSN"])):
        text = " ".join(ok(run_cli(*command, "--help")).split())
        for name in names:
            assert f"env var: {name}" in text, (command, name)


def test_migrate_sql_prints_without_applying(dsn, run_cli):
    if dsn.startswith("sqlite"):
        missing = run_cli.cwd / "not-yet.db"
        out = ok(run_cli("--dsn", f"sqlite:///{missing}", "migrate", "--sql"))
        assert "CREATE TABLE" in out and not missing.exists(), "printing must not create the file"
        with leaseq.connect(dsn):
            pass  # an empty SQLite file: the database exists, without a schema
    assert schema_version(dsn) == 0
    out = ok(run_cli("--dsn", dsn, "migrate", "--sql"))
    latest = max(m.version for m in leaseq.store.base.load_migrations("sqlite" if dsn.startswith("sqlite")
                                                                       else "postgres"))
    assert "-- migration 0001_initial" in out and f"-- migration {latest:04d}_" in out
    assert "CREATE TABLE" in out and "nothing was changed" in out
    assert schema_version(dsn) == 0, "--sql must apply nothing"
    assert "leaseq migrate" in assert_one_error_line(run_cli("--dsn", dsn, "ls"), "database")
    ok(run_cli("--dsn", dsn, "migrate"))
    assert "up to date" in ok(run_cli("--dsn", dsn, "migrate", "--sql"))


def test_enqueue_at(dsn, run_cli):
    cli = lambda *args: run_cli("--dsn", dsn, *args)  # noqa: E731
    ok(cli("migrate"))
    with leaseq.connect(dsn) as q:
        now = q.now()
    at = (now + timedelta(hours=2)).astimezone(timezone.utc)
    task = json.loads(ok(cli("enqueue", "later", "--at", at.isoformat(), "--json")))
    due = datetime.fromisoformat(task["available_at"]) if isinstance(task["available_at"], str) \
        else datetime.fromtimestamp(task["available_at"], tz=timezone.utc)
    assert abs((due - at).total_seconds()) < 5, (due, at)
    assert "due in 1h5" in ok(cli("enqueue", "later2", "--at", at.isoformat().replace("+00:00", "Z")))
    before = snapshot(dsn)
    past = (now - timedelta(minutes=1)).isoformat()
    assert "not in the future" in assert_one_error_line(cli("enqueue", "x", "--at", past), "at")
    assert "ISO 8601" in assert_one_error_line(cli("enqueue", "x", "--at", "next tuesday"), "at")
    assert "not both" in assert_one_error_line(cli("enqueue", "x", "--at", at.isoformat(), "--delay", "5"), "at")
    assert "too far ahead" in assert_one_error_line(cli("enqueue", "x", "--at", "2999-01-01T00:00:00Z"), "at")
    assert snapshot(dsn) == before


def test_reused_key(dsn, run_cli):
    cli = lambda *args: run_cli("--dsn", dsn, *args)  # noqa: E731
    ok(cli("migrate"))
    first = json.loads(ok(cli("enqueue", "send", "--key", "welcome:7", "--payload", '{"user": 7}', "--json")))
    # The same kind and payload: the existing task, said as such.
    out = ok(cli("enqueue", "send", "--key", "welcome:7", "--payload", '{"user": 7}'))
    assert out.startswith(f"existing task {first['id']} returned") and "queued" in out
    assert json.loads(ok(cli("enqueue", "send", "--key", "welcome:7", "--payload", '{"user":7}', "--json")))["id"] \
        == first["id"]
    # A later --delay asks for the same task.
    assert json.loads(ok(cli("enqueue", "send", "--key", "welcome:7", "--payload", '{"user": 7}', "--delay", "60",
                             "--json")))["id"] == first["id"]
    before = snapshot(dsn)
    # Any other difference is refused by the engine's rule, one line naming what differs and the task.
    for args, what in ((["send", "--payload", '{"user": 8}'], "payload"),
                       (["mail", "--payload", '{"user": 7}'], "kind"),
                       (["send", "--payload", '{"user": 7}', "--effect", "side_effect"], "effect"),
                       (["send", "--payload", '{"user": 7}', "--priority", "3"], "priority"),
                       (["send", "--payload", '{"user": 7}', "--max-attempts", "2"], "max_attempts"),
                       (["send", "--payload", '{"user": 7}', "--lease-seconds", "9"], "lease_seconds"),
                       (["send", "--payload", '{"user": 7}', "--timeout", "5"], "timeout"),
                       (["send", "--payload", '{"user": 7}', "--deadline", "1h"], "deadline"),
                       (["send", "--payload", '{"user": 7}', "--limit", "api"], "limits"),
                       (["send", "--payload", '{"user": 7}', "--units", "4"], "units"),
                       (["send", "--payload", '{"user": 7}', "--approval-required"], "approval"),
                       (["send", "--payload", '{"user": 7}', "--after", str(first["id"])], "after")):
        line = assert_one_error_line(cli("enqueue", *args, "--key", "welcome:7"), "key")
        assert f"already used by task {first['id']}" in line and re.search(rf"different {what}(?!\w)", line), line
        assert "nothing was written" in line, line
    # --json changes what a success prints, not the refusal (one CLI process each: checked once)
    assert_one_error_line(cli("enqueue", "send", "--payload", '{"user": 8}', "--key", "welcome:7", "--json"), "key")
    line = assert_one_error_line(cli("enqueue", "mail", "--key", "welcome:7", "--priority", "2"), "key")
    assert "different kind, payload and priority (its kind is 'send', not 'mail'; its priority is 0, not 2)" \
        in line, line
    assert snapshot(dsn) == before
    # Another queue is another key space.
    other = json.loads(ok(cli("enqueue", "mail", "--key", "welcome:7", "--queue", "q2", "--json")))
    assert other["id"] != first["id"]
