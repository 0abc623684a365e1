"""Two `leaseq serve` replicas behind a real HAProxy, one killed under load (PostgreSQL).

Everything is a real process: two replicas on one PostgreSQL schema, Debian's
HAProxy balancing them round robin with health checks on /healthz, and two
`leaseq worker --server <haproxy>` processes with a worker token. The
replica that leads maintenance is SIGKILLed once a third of the tasks are
done. Then: every task is completed, by exactly one completion, and the
downstream ledger the handlers write shows no generation's handler ran twice;
the surviving replica took over maintenance (its /healthz, its leader gauge,
the lease row) and its sweep routes an expired lease that no claim touches.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import leaseq
from leaseq import auth
from conformance.support import run_out
from leaseq_chaos.pgserver import free_port
from system_tools import require_tool

from .support import ROOT, Service, wait_for

TASKS = 300
LEADER_LEASE = "1s"

HANDLERS = '''
import sqlite3, time
import leaseq

app = leaseq.App(name="replicas")
LEDGER = {ledger!r}


@app.task("job", effect="idempotent", lease_seconds=2, max_attempts=10)
def job(ctx, n):
    time.sleep(0.02)
    # The downstream system: one row per handler run that reached it.
    with sqlite3.connect(LEDGER, timeout=30) as db:
        db.execute("INSERT INTO runs (task_id, generation) VALUES (?, ?)", (ctx.task_id, ctx.generation))
    return {{"n": n}}
'''

HAPROXY = '''
global
    maxconn 2000
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    retries 3
    option redispatch
frontend leaseq
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance roundrobin
    option httpchk GET /healthz
    http-check expect status 200
    default-server inter 200ms fall 2 rise 2
    server a 127.0.0.1:{a} check
    server b 127.0.0.1:{b} check
'''


@pytest.fixture
def haproxy_bin() -> str:
    return require_tool("haproxy")  # a skip naming it; a failure with LEASEQ_REQUIRE_TOOLS=1 (CI)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    """Processes the test starts; killed at the end whatever happened."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def spawn(processes: list[subprocess.Popen], args: list[str], log: Path, **options) -> subprocess.Popen:
    """Start ``args`` with stdout and stderr going to ``log``; the fixture stops it."""
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, **options)
    processes.append(proc)
    return proc


def ledger_jobs(q: leaseq.Queue, tmp_path: Path) -> tuple[Path, Path]:
    """The handlers' module (replica_jobs.py) writing to a fresh downstream ledger, and a
    worker token file: ``(ledger, token_file)``."""
    ledger = tmp_path / "ledger.db"
    with sqlite3.connect(ledger) as db:
        db.execute("CREATE TABLE runs (task_id INTEGER NOT NULL, generation INTEGER NOT NULL)")
    (tmp_path / "replica_jobs.py").write_text(HANDLERS.format(ledger=str(ledger)))
    token, _ = auth.create_token(q, name="replica-workers", role="worker", created_by="test", all_queues=True)
    token_file = tmp_path / "worker.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    return ledger, token_file


def health(url: str) -> dict | None:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).json()
    except httpx.HTTPError:
        return None


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def replica_id(url: str) -> str:
    """The replica id a replica's /metrics labels its leader gauge with."""
    [key] = [labels for name, labels in metrics(url) if name == "leaseq_maintenance_leader"]
    return dict(key)["replica"]


# serial: the kill must land while a worker's request is on replica a; beside other tests on a
# small machine the workers' request flow thins out and the kill can fall between requests.
@pytest.mark.serial
def test_a_replica_killed_under_load_loses_and_doubles_nothing(pg_schema_dsn: str, tmp_path: Path, haproxy_bin: str,
                                                               processes: list[subprocess.Popen]) -> None:
    dsn = pg_schema_dsn
    q = leaseq.connect(dsn)
    q.migrate()
    ledger, token_file = ledger_jobs(q, tmp_path)

    args = ("--public-metrics", "--leader-lease", LEADER_LEASE, "--sweep-every", "0.3s")
    a = Service(dsn, free_port(), tmp_path / "a.log", args).start()
    processes.append(a.proc)
    wait_for(lambda: (health(a.url) or {}).get("maintenance_leader"), 15, "replica a leading maintenance")
    b = Service(dsn, free_port(), tmp_path / "b.log", args).start()
    processes.append(b.proc)
    a_id, b_id = replica_id(a.url), replica_id(b.url)

    port = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(textwrap.dedent(HAPROXY).format(port=port, a=a.port, b=b.port))
    balancer = spawn(processes, [haproxy_bin, "-f", str(config), "-db"], tmp_path / "haproxy.log")
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: health(url), 15, "haproxy serving")

    ids = q.enqueue_many("job", [{"n": n} for n in range(TASKS)], effect="idempotent", lease_seconds=2,
                         max_attempts=10)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT / 'src'}"}
    workers = [spawn(processes, [sys.executable, "-m", "leaseq.cli", "worker", "replica_jobs:app", "--server", url,
                                 "--token-file", str(token_file), "--concurrency", "8", "--poll-interval", "0.05",
                                 "--until-idle", "--name", f"remote-{i}"],
                     tmp_path / f"worker{i}.log", cwd=tmp_path, env=env) for i in range(2)]

    def completed() -> int:
        return sum(r["count"] for r in q.stats() if r["status"] == "completed")

    wait_for(lambda: completed() >= TASKS // 3, 30, "a third of the tasks done")
    served_by_a = metrics(a.url)[("leaseq_claims_total", (("queue", "default"),))]
    assert served_by_a > 0, "the balancer never sent a claim to replica a"
    # Frozen first (SIGSTOP), then SIGKILLed: the requests the balancer sends to a while it is
    # frozen (about half, until its health checks fail) are in flight when the kill cuts them.
    # A bare SIGKILL between two requests, at this drain's pace, could cut none.
    assert a.proc is not None
    a.proc.send_signal(signal.SIGSTOP)
    time.sleep(0.3)
    a.kill()
    killed = time.monotonic()
    done_at_kill = completed()
    assert done_at_kill < TASKS, "the run ended before the kill; make the tasks slower"

    wait_for(lambda: (health(b.url) or {}).get("maintenance_leader"), 10, "replica b taking over maintenance")
    print(f"replica a killed with {done_at_kill}/{TASKS} tasks completed; "
          f"b led maintenance {time.monotonic() - killed:.2f}s later (leader lease {LEADER_LEASE})")
    for i, worker in enumerate(workers):
        assert worker.wait(45) == 0, (tmp_path / f"worker{i}.log").read_text()[-3000:]
    logs = "".join((tmp_path / f"worker{i}.log").read_text() for i in range(2))
    assert "failed (BackendUnavailable" in logs, "the kill cut no request in flight: nothing was tested"

    # A claim that replica a committed but whose answer the kill cut left a lease nobody
    # knows of: it expires (2 s) and is claimed again, which one more worker run shows
    # (by then the sweep may have queued it again).
    orphans = [t.id for t in (q.get(i) for i in ids) if t.status != "completed"]
    if orphans:
        time.sleep(2.5)
        last = spawn(processes, [sys.executable, "-m", "leaseq.cli", "worker", "replica_jobs:app", "--server", url,
                                 "--token-file", str(token_file), "--concurrency", "8", "--poll-interval", "0.05",
                                 "--until-idle", "--name", "remote-last"],
                     tmp_path / "worker-last.log", cwd=tmp_path, env=env)
        assert last.wait(45) == 0, (tmp_path / "worker-last.log").read_text()[-3000:]
        print(f"{len(orphans)} lease(s) orphaned by the kill were claimed again after expiring")

    # None lost, none completed twice.
    tasks = [q.get(i) for i in ids]
    assert Counter(t.status for t in tasks) == {"completed": TASKS}
    completions = Counter()
    for t in tasks:
        completions[t.id] = sum(1 for e in q.events(t.id) if e.type == "completed")
    assert set(completions.values()) == {1}, {k: v for k, v in completions.items() if v != 1}
    with sqlite3.connect(ledger) as db:
        runs = db.execute("SELECT task_id, generation FROM runs").fetchall()
    per_generation = Counter(runs)
    assert max(per_generation.values()) == 1, "a generation's handler ran twice"
    assert all((t.id, t.claim_generation) in per_generation for t in tasks), "a completion without its handler run"
    assert b.proc.poll() is None and metrics(b.url)[("leaseq_claims_total", (("queue", "default"),))] > 0

    # Maintenance moved to b, and runs there: an expired lease no claim will touch is routed.
    with q.store.transaction() as tx:
        leader = tx.row("leader_get", name="maintenance")
    assert leader["holder"] == b_id != a_id and leader["term"] >= 2
    m = metrics(b.url)
    assert m[("leaseq_maintenance_leader", (("replica", b_id),))] == 1
    sweeps = m[("leaseq_maintenance_passes_total", (("job", "sweep"), ("outcome", "ok")))]
    assert sweeps > 0
    w = q.register_worker("direct")
    orphan = q.enqueue("send", {}, queue="orphans", effect="side_effect", lease_seconds=0.5)
    [claim] = q.claim(w, queue="orphans")
    q.begin_effect(w, claim, "email.send")
    run_out(q, w, claim)
    wait_for(lambda: q.get(orphan.id).status == "needs_reconciliation", 10, "b's sweep routing the expired lease")
    balancer.send_signal(signal.SIGTERM)
    balancer.wait(10)
    q.close()
