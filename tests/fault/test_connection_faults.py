"""A worker keeps working through dropped connections and a database restart.

Real faults on PostgreSQL: every connection of the worker is dropped with
``pg_terminate_backend`` from a separate admin connection (what a failover
or a pooler restart does), at a chosen moment: while completions are being
written, while leases are being renewed, while the worker is about to
claim. A private server (never the shared one) is stopped for a couple of
seconds and started again. Afterwards every task whose handler succeeded is
completed by its first attempt (``max_attempts=1``: one charged attempt
would make it ``dead``), and the worker lost no lease.

The worker's connections carry an ``application_name`` of their own, so
only they are dropped; the test reads the queue through another connection.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest
from conftest import check_trails

import leaseq
from leaseq_chaos.pgserver import ThrowawayPostgres
from pg_modes import direct_only
from system_tools import require_tool

from .support import Gate, GatedCompletions, Runner, backends, drop_connections, first_attempt_completed, wait_for

# The worker's own server connections are dropped: through PgBouncer they are PgBouncer's (which
# replaces them by itself), and a client's application_name names none of them for long.
pytestmark = direct_only("drops the worker's own server connections; through PgBouncer they are PgBouncer's",
                         modes=("pgbouncer",))

LEASE = 10.0  # generous: the faults below must cost no lease on a loaded machine


class Faulty:
    """A worker app whose connections can be dropped, and an observer queue."""

    def __init__(self, schema_dsn: str, admin_dsn: str):
        self.name = f"lqw_{uuid.uuid4().hex[:10]}"
        self.admin_dsn = admin_dsn
        self.app = leaseq.App(f"{schema_dsn}&application_name={self.name}", name="faulty", connect_timeout=5)
        self.app.queue  # connect and migrate
        self.q = leaseq.connect(schema_dsn)
        self.gate = Gate()

        @self.app.task("job", effect="read_only", max_attempts=1, lease_seconds=LEASE)
        def job(ctx: leaseq.TaskContext) -> dict:
            return self.gate.hold(ctx)

    def enqueue(self, n: int) -> list[int]:
        return [self.q.enqueue("job", {}, max_attempts=1, lease_seconds=LEASE).id for _ in range(n)]

    def drop(self) -> int:
        return drop_connections(self.admin_dsn, self.name)

    def close(self) -> None:
        self.gate.open.set()
        self.q.close()
        self.app.queue.close()


@pytest.fixture
def faulty(pg_schema_dsn: str, request: pytest.FixtureRequest) -> Iterator[Faulty]:
    f = Faulty(pg_schema_dsn, os.environ["LEASEQ_TEST_PG_DSN"])
    yield f
    try:
        check_trails(f.q, request)  # the trails the dropped connections left, replayed against the lease model
    finally:
        f.close()


def assert_no_lease_lost(runtime) -> None:
    stats = runtime.stats
    assert (stats.lost, stats.failed, stats.unconfirmed) == (0, 0, 0), stats


def test_every_connection_dropped_while_completions_are_written(faulty: Faulty) -> None:
    ids = faulty.enqueue(4)
    # Claims only at start and on notifications (no 30 s poll comes round), so
    # nothing but the completion meets the dropped connections first.
    transport = GatedCompletions(faulty.app.queue)
    running = Runner(faulty.app.worker(transport=transport, concurrency=4, poll_interval=30))
    try:
        wait_for(lambda: len(faulty.gate.started) == 4, what="all four handlers running")
        faulty.gate.open.set()  # the handlers succeed
        assert transport.held.wait(10), "no completion reached the queue"
        assert faulty.drop() >= 2  # every connection: the pools' and the listener's
        transport.gate.set()  # the completion goes out on a dropped connection
        wait_for(lambda: running.runtime.stats.completed == 4, what="the four completions recorded")
    finally:
        transport.gate.set()
        running.stop()
    first_attempt_completed(faulty.q, ids)
    assert_no_lease_lost(running.runtime)


def test_every_connection_dropped_while_leases_are_renewed(faulty: Faulty) -> None:
    ids = faulty.enqueue(2)
    running = Runner(faulty.app.worker(concurrency=2, poll_interval=30))
    runtime = running.runtime
    try:
        wait_for(lambda: len(faulty.gate.started) == 2, what="both handlers running")
        # Capacity is full and no poll comes round: the claim loop sends nothing;
        # the next call the worker makes is the renewal, due a third of a lease
        # after the claim. The completions later meet dropped connections too.
        deadlines = {t: faulty.q.get(t).lease_expires_at for t in ids}
        renewals = runtime.stats.renewals
        assert faulty.drop() >= 2
        wait_for(lambda: runtime.stats.renewals >= renewals + 2 and all(
            faulty.q.get(t).lease_expires_at > deadlines[t] for t in ids), LEASE * 2,
            "the leases renewed after the drop")
        assert_no_lease_lost(runtime)
        faulty.gate.open.set()
        wait_for(lambda: runtime.stats.completed == 2, what="both completions recorded")
    finally:
        running.stop()
    first_attempt_completed(faulty.q, ids)
    assert_no_lease_lost(runtime)


@direct_only("an idle worker waiting for a notification: the portable mode has none")
def test_every_connection_dropped_before_a_claim(faulty: Faulty) -> None:
    """An idle worker waiting for a notification (polling only every 30 s) loses
    every connection, its listener's included; work enqueued then is still
    claimed at once, and completed by its first attempt."""
    faulty.gate.open.set()
    running = Runner(faulty.app.worker(concurrency=2, poll_interval=30))
    try:
        wait_for(lambda: len(backends(faulty.admin_dsn, faulty.name)) >= 2, what="the worker connected")
        time.sleep(0.3)  # its first (empty) claim is done; it waits for a notification
        assert faulty.drop() >= 2
        ids = faulty.enqueue(2)
        wait_for(lambda: running.runtime.stats.completed == 2, 10, "the tasks claimed long before the 30 s poll")
    finally:
        running.stop()
    first_attempt_completed(faulty.q, ids)
    assert_no_lease_lost(running.runtime)


@pytest.fixture
def private_server() -> Iterator[ThrowawayPostgres]:
    require_tool("pg_ctl")  # initdb and pg_ctl for a private server: a skip naming them (CI: a failure)
    with ThrowawayPostgres(max_connections=50) as server:
        yield server


def test_database_restarted_mid_run(private_server: ThrowawayPostgres) -> None:
    dsn = private_server.create_database("restart")
    app = leaseq.App(dsn, name="restart", connect_timeout=3)
    gate = Gate()

    @app.task("job", effect="read_only", max_attempts=1, lease_seconds=30)
    def job(ctx: leaseq.TaskContext) -> dict:
        return gate.hold(ctx)

    ids = [job.enqueue().id for _ in range(3)]
    running = Runner(app.worker(concurrency=3, poll_interval=0.05))
    try:
        wait_for(lambda: len(gate.started) == 3, what="the handlers running")
        private_server._pg_ctl("stop", "-m", "fast")  # every connection closed; the server is gone
        gate.open.set()  # the handlers succeed while the database is down
        time.sleep(2.0)
        private_server._pg_ctl("start")
        wait_for(lambda: running.runtime.stats.completed == 3, 45, "the completions recorded after the restart")
    finally:
        gate.open.set()
        running.stop(60)
    q = leaseq.connect(dsn)
    try:
        first_attempt_completed(q, ids)
    finally:
        q.close()
        app.queue.close()
    assert_no_lease_lost(running.runtime)
