"""A real ``leaseq worker`` process: its /metrics endpoint and its log records, checked
against what the queue recorded."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import textwrap
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import leaseq

from acceptance.cli_support import CLI, assert_one_error_line, cli_env
from fault.support import wait_for

APP = textwrap.dedent('''
    import leaseq

    app = leaseq.App()

    @app.task("ok")
    def ok(ctx, n=0):
        return {"n": n}

    @app.task("flaky")
    async def flaky(ctx, n=0):
        if ctx.task.attempts == 1:
            raise RuntimeError("the first try fails")
        return n

    @app.task("bad")
    def bad(ctx):
        raise leaseq.Permanent("no such mailbox")

    @app.task("held")
    def held(ctx):
        while True:          # until the lease is lost (the test cancels the task)
            ctx.pause(0.05)
''')

KINDS = {"ok": 5, "flaky": 3, "bad": 2}


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample at ``url``: {(name, sorted labels): value}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def start_worker(dsn: str, cwd: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    log = cwd / "worker.log"
    proc = subprocess.Popen([*CLI, "--dsn", dsn, "worker", "obsjobs:app", "--poll-interval", "0.05", *args],
                            cwd=cwd, env=cli_env(), stdout=subprocess.DEVNULL, stderr=log.open("w"))
    return proc, log


def stop_worker(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_metrics_and_json_logs_of_a_real_worker(dsn, tmp_path):
    (tmp_path / "obsjobs.py").write_text(APP)
    with leaseq.connect(dsn) as q:
        q.migrate()
        ids = {kind: [q.enqueue(kind, {} if kind == "bad" else {"n": i}).id for i in range(n)]
               for kind, n in KINDS.items()}
        held = q.enqueue("held", {}, lease_seconds=0.6).id
    proc, log = start_worker(dsn, tmp_path, "--metrics-port", "0", "--log-format", "json", "--concurrency", "8")
    try:
        line = wait_for(lambda: re.search(r"metrics at (http://127\.0\.0\.1:\d+/metrics)", log.read_text()),
                        what="the metrics line")
        url = line.group(1)
        with leaseq.connect(dsn) as q:
            def settled() -> bool:
                tasks = {t.id: t for t in q.list_tasks(limit=100)}
                return (all(tasks[i].status == "completed" for k in ("ok", "flaky") for i in ids[k])
                        and all(tasks[i].status == "dead" for i in ids["bad"]) and tasks[held].status == "running")
            wait_for(settled, timeout=60, what="every task settled")
            q.cancel(held, "the test takes the lease away")
            def loss_counted() -> dict | None:
                # counted when the lease is found lost; timed once the handler has returned
                s = scrape(url)
                done = sample(s, "leaseq_worker_handler_duration_seconds_count", kind="held", outcome="lost")
                return s if done and sample(s, "leaseq_worker_running_tasks") == 0 else None
            samples = wait_for(loss_counted, what="the loss counted and the handler returned")
            tasks = {t.id: t for t in q.list_tasks(limit=100)}
        # What the worker counted is what the queue recorded.
        attempts = {kind: sum(tasks[i].attempts for i in ids[kind]) for kind in KINDS}
        attempts["held"] = tasks[held].attempts
        for kind, n in attempts.items():
            assert sample(samples, "leaseq_worker_tasks_claimed_total", kind=kind) == n, kind
        assert sample(samples, "leaseq_worker_tasks_total", kind="ok", outcome="completed") == 5
        assert sample(samples, "leaseq_worker_tasks_total", kind="flaky", outcome="completed") == 3
        assert sample(samples, "leaseq_worker_tasks_total", kind="flaky", outcome="retried") == attempts["flaky"] - 3 == 3
        assert sample(samples, "leaseq_worker_tasks_total", kind="bad", outcome="failed") == 2
        # every attempt of "held" ends lost: cancelled, or (a box too busy to renew a 0.6 s
        # lease in time) expired and claimed again
        assert sample(samples, "leaseq_worker_tasks_total", kind="held", outcome="lost") == attempts["held"] >= 1
        outcomes = {(dict(k[1])["kind"], dict(k[1])["outcome"]): v for k, v in samples.items()
                    if k[0] == "leaseq_worker_tasks_total"}
        assert sum(outcomes.values()) == sum(attempts.values()), outcomes  # every attempt once
        for (kind, outcome), n in outcomes.items():
            assert sample(samples, "leaseq_worker_handler_duration_seconds_count", kind=kind, outcome=outcome) == n
        assert sample(samples, "leaseq_worker_running_tasks") == 0
        failures = sum(1 for k in ("flaky", "bad") for i in ids[k] for e in q_events(dsn, i) if e.type == "failed")
        assert sample(samples, "leaseq_worker_calls_total", call="fail") == failures == 5
        completions = sample(samples, "leaseq_worker_calls_total", call="complete")
        assert 1 <= completions <= 8  # batched: one statement per batch
        assert sample(samples, "leaseq_worker_calls_total", call="claim") >= 1
        assert sample(samples, "leaseq_worker_calls_total", call="renew") >= 1
        assert sample(samples, "leaseq_worker_leases_renewed_total") >= 1
        assert not [k for k in samples if k[0] == "leaseq_worker_call_errors_total"
                    and dict(k[1])["error"] == "infrastructure"], "no call failed in transit"
    finally:
        stop_worker(proc)

    # Every task log record carries the attempt's fields.
    records = [json.loads(line) for line in log.read_text().splitlines()]
    by_outcome: dict[tuple[int, int], dict] = {}
    for record in records:
        if "task_id" in record:
            assert {"kind", "generation", "attempt", "worker"} <= set(record), record
            if "outcome" in record:
                by_outcome[(record["task_id"], record["attempt"])] = record
    for kind, expected in (("ok", "completed"), ("bad", "failed")):
        for i in ids[kind]:
            record = by_outcome[(i, 1)]
            assert (record["kind"], record["outcome"], record["generation"]) == (kind, expected, 1), record
            assert isinstance(record["duration"], float) and 0 <= record["duration"] < 30
            assert record["worker"].startswith("worker-")
    for i in ids["flaky"]:
        assert by_outcome[(i, 1)]["outcome"] == "retried" and "the first try fails" in by_outcome[(i, 1)]["message"]
        assert by_outcome[(i, 2)]["outcome"] == "completed" and by_outcome[(i, 2)]["generation"] == 2
    lost = by_outcome[(held, 1)]
    assert lost["outcome"] == "lost" and lost["level"] == "warning" and "lease lost" in lost["message"]


def q_events(dsn: str, task_id: int) -> list:
    with leaseq.connect(dsn) as q:
        return q.events(task_id)


def test_text_logs_name_kind_and_duration(dsn, tmp_path):
    (tmp_path / "obsjobs.py").write_text(APP)
    with leaseq.connect(dsn) as q:
        q.migrate()
        done = q.enqueue("ok", {"n": 1}).id
    proc = subprocess.run([*CLI, "--dsn", dsn, "worker", "obsjobs:app", "--until-idle"], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if f"task={done} " in line]
    assert re.search(rf"task={done} kind=ok gen=1 attempt=1 worker=worker-\S+: completed \(duration \d+\.\d{{3}}s\)$",
                     line), line


def test_metrics_port_refused_clearly(tmp_path):
    (tmp_path / "obsjobs.py").write_text(APP)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([*CLI, "--dsn", f"sqlite:///{tmp_path / 'q.db'}", "worker", "obsjobs:app", "--migrate",
                               "--metrics-port", str(port)], cwd=tmp_path, env=cli_env(), capture_output=True,
                              text=True, timeout=60)
    assert f"cannot listen on 127.0.0.1:{port}" in assert_one_error_line(proc, "metrics_port")
    proc = subprocess.run([*CLI, "--dsn", f"sqlite:///{tmp_path / 'q.db'}", "worker", "obsjobs:app",
                           "--metrics-port", "70000"], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "metrics-port" in proc.stderr and "Traceback" not in proc.stderr


def test_metrics_of_a_remote_worker(dsn, tmp_path):
    """``leaseq worker --server``: the same series, counted over HTTP calls (one completion each)."""
    from fault.support import Service

    from leaseq import auth
    from leaseq_chaos.pgserver import free_port

    (tmp_path / "obsjobs.py").write_text(APP)
    with leaseq.connect(dsn) as q:
        q.migrate()
        token, _ = auth.create_token(q, name="obs-remote", role="worker", created_by="test", all_queues=True)
        ids = [q.enqueue("ok", {"n": i}).id for i in range(3)] + [q.enqueue("bad", {}).id]
    (tmp_path / "worker.token").write_text(token)
    svc = Service(dsn, free_port(), tmp_path / "service.log").start()
    log = tmp_path / "worker.log"
    proc = subprocess.Popen([*CLI, "worker", "obsjobs:app", "--server", svc.url, "--token-file",
                             str(tmp_path / "worker.token"), "--metrics-port", "0"], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        url = wait_for(lambda: re.search(r"metrics at (http://127\.0\.0\.1:\d+/metrics)", log.read_text()),
                       what="the metrics line").group(1)
        samples = wait_for(lambda: (s := scrape(url)) and sample(s, "leaseq_worker_handler_duration_seconds_count",
                                                                kind="ok", outcome="completed") == 3
                           and sample(s, "leaseq_worker_tasks_total", kind="bad", outcome="failed") == 1 and s,
                           what="every task counted")
        with leaseq.connect(dsn) as q:
            assert [q.get(i).status for i in ids] == ["completed"] * 3 + ["dead"]
        assert sample(samples, "leaseq_worker_tasks_claimed_total", kind="ok") == 3
        # the remote worker batches its completions (one request may carry all three)
        assert 1 <= sample(samples, "leaseq_worker_calls_total", call="complete") <= 3
        assert sample(samples, "leaseq_worker_calls_total", call="fail") == 1
        assert sample(samples, "leaseq_worker_calls_total", call="claim") >= 1
    finally:
        stop_worker(proc)
        svc.close()
