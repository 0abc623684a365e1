"""The design note's operational test, with real worker processes and real signals.

Each test starts `leaseq worker` processes against a real database (a SQLite
file, or a PostgreSQL schema) and freezes (SIGSTOP), kills (SIGKILL) or
stops (SIGTERM) them at chosen points.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import check_trails

import leaseq
from leaseq.fencing import FencedStore

from .support import wait_for

ROOT = Path(__file__).resolve().parents[2]


class Workers:
    """Starts and cleans up worker processes for one test."""

    def __init__(self, dsn: str, fault_dir: Path, *, fence_dsn: str | None = None):
        self.dsn = dsn
        self.fence_dsn = fence_dsn or dsn  # the downstream's database (its own credentials)
        self.fault_dir = fault_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *extra: str) -> subprocess.Popen:
        env = dict(os.environ, LEASEQ_DSN=self.dsn, FENCE_DSN=self.fence_dsn, FAULT_DIR=str(self.fault_dir),
                   PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))  # this checkout, not an installed copy
        log = open(self.fault_dir / f"{name}.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "leaseq.cli.main", "worker", "tests.fault.fault_app:app", "--name", name,
             "--concurrency", "2", "--poll-interval", "0.05", *extra],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.fault_dir / f"{name}.log").read_text()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(10)


@pytest.fixture
def workers(dsn: str, tmp_path: Path) -> Iterator[Workers]:
    FencedStore(dsn).migrate()
    running = Workers(dsn, tmp_path)
    yield running
    running.close()


@pytest.fixture
def queue(dsn: str, request: pytest.FixtureRequest) -> Iterator[leaseq.Queue]:
    q = leaseq.connect(dsn)
    q.migrate()
    yield q
    try:
        check_trails(q, request)  # every trail the worker processes left, replayed against the lease model
    finally:
        q.close()


def lease_expired(q: leaseq.Queue, task_id: int) -> bool:
    task = q.get(task_id)
    return task.lease_expires_at is not None and task.lease_expires_at < q.now()


def freeze_outside_a_write(pid: int, dsn: str) -> None:
    """SIGSTOP ``pid``; on SQLite, at a moment it holds no write transaction. SQLite has
    one write lock for the whole file: a process frozen inside a write (its lease renewal,
    say) holds it, and every other process waits for it to resume (a limit of SQLite,
    not of the lease: PostgreSQL's row locks leave other tasks free)."""
    for _ in range(100):
        os.kill(pid, signal.SIGSTOP)
        if not dsn.startswith("sqlite:"):
            return
        probe = sqlite3.connect(dsn.removeprefix("sqlite:///"), timeout=0.2)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.rollback()
            return
        except sqlite3.OperationalError:  # frozen mid-write: let it finish, and try again
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.02)
        finally:
            probe.close()
    raise AssertionError(f"process {pid} held the SQLite write lock at every one of 100 tries")


def test_frozen_worker_cannot_renew_complete_or_write_downstream(queue, workers, dsn) -> None:
    """A claims and records its intent; frozen before its downstream call, it loses
    the lease; B recovers the task and writes; A resumes and is refused everywhere."""
    task = queue.enqueue("fenced_write", {"resource": "account:7", "value": "from-b"}, effect="idempotent",
                         lease_seconds=1.0)
    a = workers.start("a")
    wait_for(lambda: (workers.fault_dir / "reached-fenced-1").exists(), what="A reached the downstream call")
    freeze_outside_a_write(a.pid, dsn)
    holder_a = queue.get(task.id).lease_owner
    wait_for(lambda: lease_expired(queue, task.id), what="A's lease expired")

    workers.start("b")
    wait_for(lambda: queue.get(task.id).status == "completed", what="B completed the task")
    (workers.fault_dir / "go-fenced-1").write_text("")
    os.kill(a.pid, signal.SIGCONT)

    wait_for(lambda: (workers.fault_dir / "stale-1").exists(), what="A's downstream write refused")
    assert not (workers.fault_dir / "applied-1").exists()
    final = queue.get(task.id)
    assert final.claim_generation == 2 and final.result == {"value": "from-b", "generation": 2}
    assert FencedStore(dsn).newest_generation("account:7", task.id) == 2
    # A found out through its own guarded calls, and said so in the evidence trail.
    events = wait_for(lambda: [e for e in queue.events(task.id) if e.type == "lease_lost"], what="A's loss recorded")
    assert events[0].worker_id == holder_a and events[0].generation == 1
    types = [(e.type, e.generation) for e in queue.events(task.id)]
    assert ("lease_expired", 1) in types and ("completed", 2) in types and ("completed", 1) not in types
    # Nothing A did after resuming changed the task.
    time.sleep(0.5)
    assert queue.get(task.id).result == {"value": "from-b", "generation": 2}
    assert "lease lost" in workers.log("a")


def test_killed_worker_tasks_are_recovered_or_sent_to_reconciliation(queue, workers) -> None:
    """kill -9 mid-task: the read-only task is retried; the one with an open intent waits for a person."""
    summary = queue.enqueue("summarize", {"doc": 3}, effect="read_only", lease_seconds=1.0)
    email = queue.enqueue("send_email", {"to": "ada@example.com"}, effect="side_effect", lease_seconds=1.0)
    a = workers.start("a")
    wait_for(lambda: (workers.fault_dir / "reached-summary-1").exists()
             and (workers.fault_dir / "reached-email-1").exists(), what="A is inside both tasks")
    os.kill(a.pid, signal.SIGKILL)
    a.wait(10)

    workers.start("b")
    wait_for(lambda: queue.get(summary.id).status == "completed", what="B recovered the read-only task")
    wait_for(lambda: queue.get(email.id).status == "needs_reconciliation", what="the email task was routed")
    assert queue.get(summary.id).result == {"doc": 3, "generation": 2}
    intents = queue.effects(email.id)
    assert [(fx.action, fx.status, fx.generation) for fx in intents] == [("email.send", "pending", 1)]
    time.sleep(1.5)  # past another lease length: nobody claims it again
    assert queue.get(email.id).status == "needs_reconciliation" and queue.get(email.id).claim_generation == 1


def test_sigterm_lets_short_tasks_finish_and_releases_long_ones(queue, workers) -> None:
    quick = queue.enqueue("quick", {"seconds": 0.5}, effect="read_only", lease_seconds=5.0)
    email = queue.enqueue("send_email", {"to": "bo@example.com"}, effect="side_effect", lease_seconds=5.0)
    a = workers.start("a", "--grace", "2")
    wait_for(lambda: (workers.fault_dir / "reached-quick-1").exists()
             and (workers.fault_dir / "reached-email-1").exists(), what="A is inside both tasks")
    started = time.monotonic()
    a.send_signal(signal.SIGTERM)
    assert a.wait(15) == 0
    assert time.monotonic() - started < 8, "shutdown took longer than the grace period allows"
    assert queue.get(quick.id).status == "completed"
    # Released through the recovery policy: an open intent is not simply requeued.
    assert queue.get(email.id).status == "needs_reconciliation"
    released = [e for e in queue.events(email.id) if e.type == "lease_released"]
    assert released and released[0].detail["routed_to"] == "needs_reconciliation"


def test_sigterm_gives_back_the_tasks_a_worker_leased_ahead_unstarted(queue, workers) -> None:
    """`leaseq worker --prefetch`: a real SIGTERM while tasks wait, leased, for a handler slot."""
    tasks = [queue.enqueue("quick", {"seconds": 1.5}, effect="read_only", lease_seconds=5.0) for _ in range(3)]
    a = workers.start("a", "--concurrency", "1", "--prefetch", "2", "--grace", "10")
    wait_for(lambda: (workers.fault_dir / "reached-quick-1").exists()
             and all(queue.get(t.id).status == "running" for t in tasks), what="one running, two leased ahead")
    a.send_signal(signal.SIGTERM)
    assert a.wait(15) == 0, workers.log("a")
    statuses = [queue.get(t.id).status for t in tasks]
    assert sorted(statuses) == ["completed", "queued", "queued"], statuses
    for t in tasks:
        task = queue.get(t.id)
        if task.status == "queued":  # never started: back with its attempt, marked unstarted
            assert task.attempts == 0 and task.result is None
            released = [e for e in queue.events(t.id) if e.type == "lease_released"]
            assert released and released[-1].detail["started"] is False
