"""``leaseq serve --processes N``: serving processes on one port under a supervisor; and a
worker's interrupt reaching its claim waiting on another process.

Everything is a real process: the supervisor, its serving processes, a
``leaseq worker --server`` process and the signals. A serving process is
SIGKILLed under load (the one leading maintenance): the supervisor starts a
replacement, the worker's work is neither lost nor done twice, and the
leadership moves. SIGTERM stops the whole group cleanly; a supervisor that is
itself SIGKILLed takes its serving processes with it.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from psycopg import connect as psycopg_connect
from prometheus_client.parser import text_string_to_metric_families

from pg_modes import direct_only

import leaseq
from leaseq import auth
from leaseq.client import RemoteQueue
from leaseq_chaos.pgserver import free_port

from .support import ROOT, Service, wait_for
from .test_replicas import ledger_jobs, processes, spawn  # noqa: F401 - processes is a fixture

TASKS = 200


def serving(url: str, connections: int = 30) -> dict[str, float]:
    """The serving processes seen over ``connections`` new connections (the kernel hands each
    to one of them): replica id -> its maintenance-leader gauge."""
    seen: dict[str, float] = {}
    for _ in range(connections):
        try:
            with httpx.Client(timeout=5) as client:  # a new connection each time
                text = client.get(f"{url}/metrics").text
        except httpx.HTTPError:
            continue
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "leaseq_maintenance_leader":
                    seen[s.labels["replica"]] = s.value
    return seen


def pid_of(replica: str) -> int:
    """A replica id is ``host:pid:random``."""
    return int(replica.split(":")[1])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def two_processes_one_leader(url: str) -> dict[str, float] | None:
    seen = serving(url)
    return seen if len(seen) == 2 and sorted(seen.values()) == [0.0, 1.0] else None


def test_a_serving_process_killed_under_load_is_replaced_and_loses_nothing(
        pg_schema_dsn: str, tmp_path: Path, processes: list[subprocess.Popen]) -> None:  # noqa: F811
    dsn = pg_schema_dsn
    q = leaseq.connect(dsn)
    q.migrate()
    ledger, token_file = ledger_jobs(q, tmp_path)

    service = Service(dsn, free_port(), tmp_path / "service.log",
                      ("--processes", "2", "--public-metrics", "--leader-lease", "1s", "--sweep-every", "0.3s"))
    service.start()
    processes.append(service.proc)
    assert "2 processes" in (tmp_path / "service.log").read_text()
    first = wait_for(lambda: two_processes_one_leader(service.url), 30, "two serving processes, one leading")
    [leader] = [r for r, v in first.items() if v == 1.0]

    ids = q.enqueue_many("job", [{"n": n} for n in range(TASKS)], effect="idempotent", lease_seconds=2,
                         max_attempts=10)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT / 'src'}"}
    worker_args = [sys.executable, "-m", "leaseq.cli", "worker", "replica_jobs:app", "--server", service.url,
                   "--token-file", str(token_file), "--concurrency", "8", "--poll-interval", "0.05", "--until-idle"]
    worker = spawn(processes, [*worker_args, "--name", "remote"], tmp_path / "worker.log", cwd=tmp_path, env=env)

    def completed() -> int:
        return sum(r["count"] for r in q.stats() if r["status"] == "completed")

    wait_for(lambda: completed() >= TASKS // 3, 60, "a third of the tasks done")
    os.kill(pid_of(leader), signal.SIGKILL)
    assert completed() < TASKS, "the run ended before the kill; make the tasks slower"

    # The supervisor replaces the killed process; the other takes over maintenance.
    after = wait_for(lambda: (lambda seen: seen if seen and leader not in seen else None)(
        two_processes_one_leader(service.url)), 30, "a replacement serving and a new leader")
    assert pid_of(leader) not in {pid_of(r) for r in after} and not alive(pid_of(leader))
    assert service.proc.poll() is None

    assert worker.wait(90) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    # A claim whose answer the kill cut leaves a lease nobody knows of: it expires (2 s)
    # and one more run claims it again (by then the sweep may have queued it again).
    if any(t.status != "completed" for t in (q.get(i) for i in ids)):
        time.sleep(2.5)
        last = spawn(processes, [*worker_args, "--name", "remote-last"], tmp_path / "worker-last.log",
                     cwd=tmp_path, env=env)
        assert last.wait(60) == 0, (tmp_path / "worker-last.log").read_text()[-3000:]

    tasks = [q.get(i) for i in ids]
    assert Counter(t.status for t in tasks) == {"completed": TASKS}
    assert {sum(1 for e in q.events(t.id) if e.type == "completed") for t in tasks} == {1}
    with sqlite3.connect(ledger) as db:
        per_generation = Counter(db.execute("SELECT task_id, generation FROM runs").fetchall())
    assert max(per_generation.values()) == 1, "a generation's handler ran twice"

    # SIGTERM stops the whole group: each serving process shuts down, the supervisor exits 0.
    children = [pid_of(r) for r in after]
    service.proc.send_signal(signal.SIGTERM)
    assert service.proc.wait(30) == 0, (tmp_path / "service.log").read_text()[-3000:]
    wait_for(lambda: not any(alive(p) for p in children), 10, "the serving processes gone")
    assert "leaseq service stopped" in (tmp_path / "service.log").read_text()
    with q.store.transaction() as tx:  # the leader resigned on its way out
        assert tx.row("leader_get", name="maintenance")["expires_at"] <= q.now()
    q.close()


def test_serving_processes_do_not_outlive_a_killed_supervisor(tmp_path: Path,
                                                               processes: list[subprocess.Popen]) -> None:  # noqa: F811
    dsn = f"sqlite:///{tmp_path / 'served.db'}"
    leaseq.connect(dsn).migrate()
    service = Service(dsn, free_port(), tmp_path / "service.log", ("--processes", "2", "--public-metrics")).start()
    processes.append(service.proc)
    seen = wait_for(lambda: (lambda s: s if len(s) == 2 else None)(serving(service.url)), 30,
                    "two serving processes")
    service.kill()  # SIGKILL: no chance to stop its children itself
    children = [pid_of(r) for r in seen]
    wait_for(lambda: not any(alive(p) for p in children), 15, "the serving processes exiting with it")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{service.url}/healthz", timeout=2)


@direct_only("waits for the replica's LISTEN, which a queue that cannot notify never sends")
def test_a_stopping_worker_ends_its_claim_waiting_on_another_replica(
        pg_schema_dsn: str, tmp_path: Path, processes: list[subprocess.Popen]) -> None:  # noqa: F811
    """A worker shutting down asks the service to end its waiting claim; behind a balancer
    (or with --processes) the request may reach another process than the one the claim
    waits on. On PostgreSQL the interrupt is notified to every process."""
    dsn = pg_schema_dsn
    q = leaseq.connect(dsn)
    q.migrate()
    token, _ = auth.create_token(q, name="stopping", role="worker", created_by="test", all_queues=True)
    a = Service(dsn, free_port(), tmp_path / "a.log").start()
    processes.append(a.proc)
    b = Service(dsn, free_port(), tmp_path / "b.log").start()
    processes.append(b.proc)
    on_a, on_b = RemoteQueue(a.url, token), RemoteQueue(b.url, token)
    worker = on_a.register_worker("stopping")
    outcome: dict = {}

    def claim_waiting_on_a() -> None:
        started = time.monotonic()
        outcome["claims"] = on_a.claim(worker, wait=20)
        outcome["seconds"] = time.monotonic() - started

    waiting = threading.Thread(target=claim_waiting_on_a)
    waiting.start()
    # a's listener is up once its connection has listened for interrupts and for work (the
    # notifier LISTENs on the channels it wants in name order: work is the last of the two)
    with psycopg_connect(dsn, autocommit=True) as conn:
        wait_for(lambda: conn.execute("SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND query = 'LISTEN leaseq_work'").fetchall(), 15,
                 "replica a listening while the claim waits")
    time.sleep(0.3)  # the claim's first attempt found nothing and waits
    assert waiting.is_alive()
    on_b.interrupt_claims(worker)  # reaches b, not a
    waiting.join(10)
    assert not waiting.is_alive(), "the claim waiting on replica a was not ended"
    assert outcome["claims"] == [] and outcome["seconds"] < 10
    q.enqueue("job")  # nothing was leased on the way out
    assert q.stats() and all(r["status"] == "queued" for r in q.stats())
    on_a.close()
    on_b.close()
    q.close()


def test_serving_processes_get_the_dsn_in_a_private_file_not_their_environment(
        pg_schema_dsn: str, tmp_path: Path, processes: list[subprocess.Popen]) -> None:  # noqa: F811
    # trust authentication ignores the password; it stands for a real one
    dsn = pg_schema_dsn.replace("postgresql://postgres@", "postgresql://postgres:hunter2-secret@", 1)
    assert "hunter2-secret" in dsn
    leaseq.connect(dsn).migrate()
    service = Service(dsn, free_port(), tmp_path / "service.log", ("--processes", "2", "--public-metrics")).start()
    processes.append(service.proc)
    seen = wait_for(lambda: (lambda s: s if len(s) == 2 else None)(serving(service.url)), 30,
                    "two serving processes")
    files = set()
    for pid in map(pid_of, seen):
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"hunter2-secret" not in environ  # neither the DSN given nor any setting of leaseq's
        [name] = [v.split(b"=", 1)[1] for v in environ.split(b"\0") if v.startswith(b"LEASEQ_SERVING_PROCESS_FILE=")]
        files.add(Path(name.decode()))
    [settings] = files
    assert settings.stat().st_mode & 0o777 == 0o600 and settings.parent.stat().st_mode & 0o777 == 0o700
    assert "hunter2-secret" in settings.read_text()  # where the password is, for the service's user only
    service.proc.send_signal(signal.SIGTERM)
    service.proc.wait(30)
    assert not settings.parent.exists()  # removed when the service stops
