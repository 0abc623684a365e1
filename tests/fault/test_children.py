"""Child tasks in real worker processes killed with SIGKILL.

Killed between a spawn and its wait, the worker loses nothing and repeats nothing: the
parent's lease runs out, the next attempt (another process) replays the spawn from the
ledger (the same child, no second one), waits for it holding no lease, and gets its result.
"""

from __future__ import annotations

import os
import signal
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
    w = Workers("children_app", dsn, tmp_path)
    yield w
    w.close()


def test_killed_between_a_spawn_and_its_wait_the_parent_spawns_once_and_gets_the_result(
        queue: leaseq.Queue, workers: Workers, tmp_path: Path) -> None:
    parent = queue.enqueue("orchestrate", {"n": 4}, idempotency_key="orch-1", lease_seconds=LEASE, max_attempts=3)
    # the first process serves the parent's queue only: the child waits for the second
    first = workers.start("first", HOLD_AFTER_SPAWN="1", QUEUES="default")
    held = tmp_path / f"held-{parent.id}"
    wait_for(lambda: held.exists() or first.poll() is not None, 60, "the spawn committed")
    assert first.poll() is None, workers.log("first")
    child_id = int(held.read_text())
    os.kill(first.pid, signal.SIGKILL)  # between the spawn and the wait, the lease still held
    first.wait(10)
    child = queue.get(child_id)
    assert (child.parent_id, child.status) == (parent.id, "queued")
    workers.start("second")
    wait_for(lambda: queue.get(parent.id).status == "completed", 60, "the parent completed")
    done = queue.get(parent.id)
    assert done.result == {"piece": 40, "child": child_id}
    pieces = [t for t in queue.list_tasks(limit=100) if t.kind == "piece"]
    assert [t.id for t in pieces] == [child_id]  # the resumed parent spawned nothing more
    assert workers.count("spawned", parent.id) >= 2  # the spawn returned in both attempts: the second replayed
    assert workers.count("piece", child_id) == 1
    types = [e.type for e in queue.events(parent.id)]
    # the lease ran out (no holder ended it); the wait then found the child ended, or waited for it
    assert types.count("child_spawned") == 1 and "lease_expired" in types and types.count("children_awaited") == 1
    assert validate_queue(queue) == []
