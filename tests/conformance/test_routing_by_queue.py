"""Routing by queue, on every transport (sync, async, HTTP) and both backends.

Every row lock with SKIP LOCKED reads one queue (schema 41; see
tests/unit/test_queue_scope.py for the statements): a claim routes its own
queue's expired leases and due sleepers only, and is not held up by another
queue's; the sweep (``Queue.sweep``, ``leaseq sweep``, ``leaseq serve``'s
maintenance) routes those of every queue, one queue at a time, a queue that no
worker claims from as any other.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

import leaseq
from leaseq import engine
from leaseq.core.errors import Suspended
from leaseq.worker.context import TaskContext

from .support import run_out, wait_until
from .test_durable_waits import LOG
from .test_transports import transport  # noqa: F401  (the fixture: sync, async and HTTP transports)


def _expired_elsewhere(q: leaseq.Queue, t: Any, queue: str) -> tuple[leaseq.Task, leaseq.Worker]:
    """A task of ``queue`` whose lease ran out, left for whoever routes it."""
    w = t.register_worker(f"gone-from-{queue}")
    task = q.enqueue("job", {"in": queue}, queue=queue)
    [c] = t.claim(w, queue=queue)
    run_out(q, w, c)
    return task, w


def test_a_claim_routes_only_its_own_queue_and_the_sweep_routes_a_queue_nobody_claims_from(
        q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    lone, gone = _expired_elsewhere(q, transport, "lone")  # no worker claims from "lone" after this
    mine = q.enqueue("job", {"in": "default"})
    w = transport.register_worker("w")
    # another queue's expired lease neither holds this claim up nor is routed by it
    [c] = transport.claim(w)
    assert c.task_id == mine.id
    assert transport.claim(w) == []
    held = q.get(lone.id)
    assert (held.status, held.lease_owner, held.claim_generation) == ("running", gone.id, 1)
    assert "lease_expired" not in [e.type for e in q.events(lone.id)]
    # the sweep routes it, with no claim of its queue
    assert q.sweep() == 1
    routed = q.get(lone.id)
    assert (routed.status, routed.lease_owner) == ("queued", None)
    [expired] = [e for e in q.events(lone.id) if e.type == "lease_expired"]
    assert (expired.generation, expired.worker_id, expired.detail["routed_to"]) == (1, gone.id, "queued")
    assert q.sweep() == 0
    # and a claim of that queue takes it again
    [again] = transport.claim(w, queue="lone")
    assert (again.task_id, again.generation) == (lone.id, 2)


def test_a_claim_of_a_queue_routes_that_queues_expired_lease(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    lone, gone = _expired_elsewhere(q, transport, "lone")
    w = transport.register_worker("w")
    assert transport.claim(w) == []  # the default queue's claim: nothing of its own
    assert q.get(lone.id).status == "running"
    [c] = transport.claim(w, queue="lone")  # routed, then claimed
    assert (c.task_id, c.generation) == (lone.id, 2)


def test_the_claims_fast_path_is_not_sent_to_route_another_queues_lease(q: leaseq.Queue) -> None:
    """The claim's routing check reads what its routing routes: an expired lease of another
    queue leaves the one-statement claim able to settle (PostgreSQL; SQLite claims whole)."""
    _expired_elsewhere(q, q, "lone")
    mine = q.enqueue("job", {})
    w = q.register_worker("w")
    fast = q._run(engine.leases.try_claim(q.settings, w, queue="default"))
    if not q.capabilities.serial_writes:
        assert fast is not None and [c.task_id for c in fast] == [mine.id]
        assert q._run(engine.leases.try_claim(q.settings, w, queue="default")) == []


def _sleep(t: Any, w: leaseq.Worker, queue: str, seconds: float) -> int:
    [claim] = t.claim(w, queue=queue)
    with pytest.raises(Suspended):
        TaskContext(t, w, claim, LOG).sleep(seconds)
    return claim.task_id


def test_a_claim_wakes_only_its_own_queues_sleepers_and_the_sweep_wakes_every_queues(
        q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("w")
    q.enqueue("nap", {}, queue="lone", idempotency_key="lone-nap")
    lone = _sleep(transport, w, "lone", 0.3)
    q.enqueue("nap", {}, idempotency_key="own-nap")
    own = _sleep(transport, w, "default", 0.3)
    wait_until(q, max(q.get(lone).wake_at, q.get(own).wake_at))
    [c] = transport.claim(w)  # woken by its queue's claim, and claimed
    assert c.task_id == own
    assert q.get(lone).status == "waiting"
    assert q.sweep() == 0 and q.get(lone).status == "queued"  # woken: no lease was routed
    assert "woke" in [e.type for e in q.events(lone)]
    [again] = transport.claim(w, queue="lone")
    assert again.task_id == lone


def test_the_sweep_expires_overdue_tasks_of_every_queue(q: leaseq.Queue) -> None:
    tasks = [q.enqueue("job", {}, queue=name, deadline=timedelta(seconds=0.2)) for name in ("a", "lone", "z")]
    wait_until(q, max(q.get(t.id).deadline_at for t in tasks))
    time.sleep(0.01)
    q.sweep()
    assert [q.get(t.id).status for t in tasks] == ["expired"] * 3
