"""Durable waits in real worker processes killed with SIGKILL.

Killed after a signal wait consumed its signal and before the next step, the
worker repeats nothing: the next attempt (another process) replays the signal
from the ledger, consumes no other, and makes the next step once. Killed while
its tasks sleep, it loses nothing: a sleeping task holds no lease, and another
process finishes it once it is due.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import leaseq
from leaseq_chaos.traces import validate_queue

from .support import AppWorkers, wait_for

LEASE = 2.0


Workers = AppWorkers


@pytest.fixture
def queue(dsn: str) -> Iterator[leaseq.Queue]:
    q = leaseq.connect(dsn)
    q.migrate()
    yield q
    q.close()


@pytest.fixture
def workers(dsn: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers("waits_app", dsn, tmp_path)
    yield w
    w.close()


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def test_killed_after_consuming_a_signal_the_next_attempt_repeats_nothing(queue: leaseq.Queue, workers: Workers,
                                                                         tmp_path: Path) -> None:
    task = queue.enqueue("approve_refund", {"amount": 5}, effect="side_effect", idempotency_key="refund-9",
                         lease_seconds=LEASE, max_attempts=3)
    first = workers.start("first", HOLD_AFTER_SIGNAL="1")
    wait_for(lambda: queue.get(task.id).status == "waiting" or first.poll() is not None, 60, "the wait began")
    assert first.poll() is None, workers.log("first")
    assert queue.get(task.id).lease_owner is None  # waiting: no lease
    queue.signal(task.id, "verdict", {"approved": True}, by="ann")
    wait_for(lambda: (tmp_path / f"held-{task.id}").exists() or first.poll() is not None, 60,
             "the signal was consumed")
    assert first.poll() is None, workers.log("first")
    _kill(first)  # between the signal's consumption and the next step
    [consumed] = queue.signals(task.id)
    held = consumed["consumed_generation"]
    assert consumed["consumed_key"] == "refund-9:signal:verdict:0"
    workers.start("second")
    wait_for(lambda: queue.get(task.id).status == "completed", 60, "the task completed")
    done = queue.get(task.id)
    assert done.result == {"verdict": {"approved": True}, "refunded": 5}
    assert workers.count("refunded", task.id) == 1  # the next step, once
    assert workers.count("received", task.id) == 2  # the wait returned in both attempts: the second replayed
    [signal_] = queue.signals(task.id)
    assert signal_["consumed_generation"] == held  # consumed once, by the killed attempt
    events = queue.events(task.id)
    assert [e.type for e in events].count("signal_received") == 1
    assert done.claim_generation == held + 1 and "lease_expired" in [e.type for e in events]
    assert validate_queue(queue) == []


def test_killed_while_its_tasks_sleep_another_worker_finishes_them(queue: leaseq.Queue, workers: Workers) -> None:
    naps = queue.enqueue_many("nap", [{"seconds": 1.5} for _ in range(6)], lease_seconds=LEASE)
    first = workers.start("first")
    wait_for(lambda: all(queue.get(i).status == "waiting" for i in naps) or first.poll() is not None, 60,
             "every task fell asleep")
    assert first.poll() is None, workers.log("first")
    _kill(first)
    workers.start("second")
    wait_for(lambda: all(queue.get(i).status == "completed" for i in naps), 60, "every sleeper completed")
    for i in naps:
        assert workers.count("woke", i) == 1 and queue.get(i).claim_generation == 2
        assert "lease_expired" not in [e.type for e in queue.events(i)]  # no lease was left to expire
    assert validate_queue(queue) == []
