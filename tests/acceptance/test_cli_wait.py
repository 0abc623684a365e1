"""``leaseq enqueue --after`` and ``leaseq wait`` through the real CLI, on both backends."""

from __future__ import annotations

import json
import subprocess
import threading

import leaseq

from .cli_support import assert_one_error_line


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc.stdout


def test_enqueue_after_and_wait(dsn, run_cli) -> None:
    cli = lambda *args, **kw: run_cli("--dsn", dsn, *args, **kw)  # noqa: E731
    ok(cli("migrate"))
    first = json.loads(ok(cli("enqueue", "fetch", "--json")))
    second = json.loads(ok(cli("enqueue", "fetch", "--json")))
    out = ok(cli("enqueue", "merge", "--after", f"{first['id']},{second['id']}", "--on-dependency-failure", "block"))
    assert "waiting" in out
    line = assert_one_error_line(cli("enqueue", "merge", "--after", "12,x"), "after")
    assert "'x'" in line
    assert_one_error_line(cli("enqueue", "merge", "--after", "99999"), "after")

    merge_id = int(out.split()[1])
    line = assert_one_error_line(cli("wait", str(merge_id), "--timeout", "0.3"), "timeout", exit_code=3)
    assert f"task {merge_id} is still waiting" in line

    with leaseq.connect(dsn) as q:
        w = q.register_worker("w")
        claims = q.claim(w, limit=2, kinds=["fetch"])
        timer = threading.Timer(1.0, lambda: [q.complete(w, c, result=c.task_id) for c in claims])
        timer.start()
        done = json.loads(ok(cli("wait", str(first["id"]), "--timeout", "30", "--json")))
        timer.join()
        assert (done["status"], done["result"]) == ("completed", first["id"])
        assert q.get(merge_id).status == "queued"
        q.cancel(merge_id, "no longer needed")
    out = ok(cli("wait", str(merge_id)))
    assert f"task {merge_id} cancelled (merge): cancelled: no longer needed" in out
    assert_one_error_line(cli("wait", "999999", "--timeout", "1"), "task")
