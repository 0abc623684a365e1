"""``leaseq stream`` through the real CLI, on both backends: it prints a task's stream entry by
entry, follows it until the task settles, resumes after a cursor, and refuses bad input in
one line naming the field."""

from __future__ import annotations

import json
import subprocess
import threading

import leaseq

from .cli_support import assert_one_error_line, snapshot


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc.stdout


def test_stream_prints_follows_and_resumes(dsn, run_cli) -> None:
    cli = lambda *args, **kw: run_cli("--dsn", dsn, *args, **kw)  # noqa: E731
    ok(cli("migrate"))
    with leaseq.connect(dsn) as q:
        w = q.register_worker("w")
        task = q.enqueue("report", {}, idempotency_key="cli-report")
        [claim] = q.claim(w, lease_seconds=120)
        q.emit(w, claim, {"plan": 2}, key="cli-report:emit:0")
        q.emit(w, claim, "step 1")
        out = ok(cli("stream", str(task.id), "--no-follow"))
        assert out.splitlines() == [
            "#1 generation 1 reset: attempt 1 begins (the items of earlier attempts are void unless durable)",
            '#2 generation 1 durable item {"plan": 2}', '#3 generation 1 item "step 1"']
        # following: the command waits for the next entries and exits once the task completed
        timer = threading.Timer(1.0, lambda: (q.emit(w, claim, {"step": 2}), q.complete(w, claim, "done")))
        timer.start()
        proc = cli("stream", str(task.id), "--after", "3", "--json", "--timeout", "30")
        timer.join()
        entries = [json.loads(line) for line in ok(proc).splitlines()]
        assert [(e["seq"], e["type"], e["item"]) for e in entries] == [(4, "item", {"step": 2})]
        assert proc.stderr.strip() == f"task {task.id} is completed; resume with --after 4"
        assert ok(cli("stream", str(task.id), "--after", "4")) == ""  # nothing after the last cursor
        shown = ok(cli("show", str(task.id)))
        assert "3 item(s), 1 durable, in 1 attempt(s); last cursor 4" in shown and "stream_started" in shown
        before = snapshot(dsn)
    assert_one_error_line(cli("stream", "abc"), "task_id")
    assert_one_error_line(cli("stream", str(task.id), "--after", "x"), "after")
    assert_one_error_line(cli("stream", str(task.id), "--after", "-1"), "after")
    assert_one_error_line(cli("stream", str(task.id), "--timeout", "-1"), "timeout")
    assert_one_error_line(cli("stream", "999999"), "task")
    assert snapshot(dsn) == before
