"""The worker runtime when its renewals stall (its connection black-holed), found designing the chaos runs.

The database's guards keep both cases below safe: nothing stale is
accepted. The tests check that the runtime also neither throws away a new
attempt's work nor goes on acting past its lease. The stall is made real by holding renewal calls at a gate in
front of a real queue, as the chaos proxy's black hole does to a connection.
PostgreSQL only: there the runtime's claims and renewals are awaited on the
loop over separate pooled connections, so a stalled renewal does not also stall the claims.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import leaseq
from leaseq.worker.transport import worker_port

LEASE = 0.4


class GatedRenewals:
    """A real queue whose lease renewals wait while the gate is closed."""

    def __init__(self, queue: leaseq.Queue):
        self._queue = worker_port(queue)
        self.gate = threading.Event()

    def __getattr__(self, name):
        return getattr(self._queue, name)

    async def renew_leases(self, worker, claims):
        deadline = time.monotonic() + 30
        while not self.gate.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return await self._queue.renew_leases(worker, claims)


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what} not met within {timeout}s"
        time.sleep(0.01)
    return value


def test_a_stale_attempt_does_not_cancel_the_new_attempt_of_the_same_worker(pg_schema_dsn):
    app = leaseq.App(pg_schema_dsn)
    started = {1: threading.Event(), 2: threading.Event()}
    release = threading.Event()

    @app.task("job", effect="read_only", lease_seconds=LEASE)
    def job(ctx):
        if ctx.generation in started:
            started[ctx.generation].set()
            release.wait(10)  # generation 1 stalls; generation 2 waits for the test
        return {"generation": ctx.generation}

    transport = GatedRenewals(app.queue)
    q = app.queue
    task = job.enqueue()
    runtime = app.worker(transport=transport, concurrency=2, poll_interval=0.02, grace=2)
    thread = threading.Thread(target=lambda: asyncio.run(runtime.run()), daemon=True)
    thread.start()
    try:
        assert started[1].wait(10)
        first = q.get(task.id)
        wait_for(lambda: q.now() > first.lease_expires_at, what="generation 1's lease ran out")
        assert started[2].wait(10), "the worker should reclaim the task as generation 2"
        transport.gate.set()  # the stalled renewal goes through: generation 1 is refused
        wait_for(lambda: runtime.stats.lost >= 1, what="the runtime saw generation 1 lost")
        release.set()
        done = wait_for(lambda: q.get(task.id).status == "completed" and q.get(task.id), what="completion")
        assert done.result == {"generation": 2}, f"generation 2's work was thrown away: {done.result}"
        assert done.claim_generation == 2
    finally:
        release.set()
        transport.gate.set()
        runtime.stop()
        thread.join(10)
        app.queue.close()


def test_a_stalled_renewal_still_ends_the_lease_locally_within_its_length(pg_schema_dsn):
    app = leaseq.App(pg_schema_dsn)
    noticed = threading.Event()

    @app.task("job", effect="read_only", lease_seconds=LEASE)
    def job(ctx):
        deadline = time.monotonic() + 10 * LEASE
        while time.monotonic() < deadline:
            if ctx.lost:
                noticed.set()
                return None
            time.sleep(0.01)
        return None

    transport = GatedRenewals(app.queue)
    job.enqueue()
    runtime = app.worker(transport=transport, concurrency=1, poll_interval=0.02, grace=1)
    thread = threading.Thread(target=lambda: asyncio.run(runtime.run()), daemon=True)
    thread.start()
    try:
        assert noticed.wait(3 * LEASE), "the handler was never told its lease was gone"
    finally:
        transport.gate.set()
        runtime.stop()
        thread.join(10)
        app.queue.close()
