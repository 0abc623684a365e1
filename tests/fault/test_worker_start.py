"""A worker started while the queue is out of reach waits for it instead of dying.

Real faults: `leaseq serve` not running yet when a remote worker starts (both
backends), and a PostgreSQL connection path that stalls (the chaos proxy's
black hole) while a direct worker connects. Connecting and registering are
retried with backoff until the queue answers; a refusal (a token the service
does not know) ends the start at once; a stop request ends the wait.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

import leaseq
from leaseq import auth
from leaseq_chaos.pgserver import free_port
from leaseq_chaos.proxy import FaultyProxy
from leaseq.client import RemoteQueue
from leaseq.worker import WorkerRuntime
from pg_modes import direct_only

from .support import Gate, Runner, Service, first_attempt_completed, wait_for
from .test_presumed_loss import through


@pytest.fixture
def service(q: leaseq.Queue, dsn: str, tmp_path: Path) -> Iterator[Service]:
    svc = Service(dsn, free_port(), tmp_path / "service.log")  # not started: each test decides when
    yield svc
    svc.close()


def remote_runtime(service: Service, token: str, gate: Gate) -> tuple[WorkerRuntime, RemoteQueue]:
    rq = RemoteQueue(service.url, token, timeout=5)
    app = leaseq.App(name="remote")  # never connects: the worker goes through the service

    @app.task("job", effect="read_only", max_attempts=1, lease_seconds=30)
    def job(ctx: leaseq.TaskContext) -> dict:
        return gate.hold(ctx)

    return WorkerRuntime(app, rq, poll_interval=0.05), rq


def test_a_remote_worker_started_before_the_service_registers_once_it_is_up(q: leaseq.Queue,
                                                                            service: Service) -> None:
    gate = Gate()
    gate.open.set()
    token, _ = auth.create_token(q, name="early-worker", role="worker", created_by="test", all_queues=True)
    runtime, rq = remote_runtime(service, token, gate)
    task_id = q.enqueue("job", {}, max_attempts=1, lease_seconds=30).id
    running = Runner(runtime, wait_registered=False)
    try:
        wait_for(lambda: runtime.stats.transient_errors >= 2, 10, "registration retried while the service is down")
        assert running.thread.is_alive() and runtime.worker is None
        service.start()
        wait_for(lambda: runtime.stats.completed == 1, 30, "the task completed once the service is up")
    finally:
        running.stop()
        rq.close()
    first_attempt_completed(q, [task_id])


def test_a_refused_token_ends_the_start_at_once(q: leaseq.Queue, service: Service) -> None:
    service.start()
    runtime, rq = remote_runtime(service, "lq_" + uuid.uuid4().hex, Gate())
    running = Runner(runtime, wait_registered=False)
    try:
        wait_for(lambda: not running.thread.is_alive(), 10, "the worker gave up")
    finally:
        rq.close()
    assert isinstance(running.error, auth.AccessDenied), repr(running.error)
    assert runtime.worker is None and runtime.stats.transient_errors == 0


@direct_only("PgBouncer refuses a login it does not know itself, without the server's words naming the "
             "role", modes=("pgbouncer",))
def test_a_refused_login_ends_a_direct_worker_start_at_once(pg_schema_dsn: str) -> None:
    """A PostgreSQL server that answers but refuses the login (here: no such role) is no
    outage to wait out: the worker's start ends at once with ConfigError, tried once."""
    parts = urlsplit(pg_schema_dsn)
    app = leaseq.App(urlunsplit(parts._replace(netloc=f"leaseq_no_such_role@{parts.hostname}:{parts.port or 5432}")),
                     name="refused")

    @app.task("job")
    def job(ctx: leaseq.TaskContext) -> None:
        return None

    running = Runner(app.worker(poll_interval=0.05), wait_registered=False)
    wait_for(lambda: not running.thread.is_alive(), 10, "the worker gave up")
    assert isinstance(running.error, leaseq.ConfigError), repr(running.error)
    assert "refused the connection" in str(running.error) and "leaseq_no_such_role" in str(running.error)
    assert running.runtime.worker is None and running.runtime.stats.transient_errors == 0


def test_a_stop_request_ends_the_wait_for_an_unreachable_service(q: leaseq.Queue, service: Service) -> None:
    token, _ = auth.create_token(q, name="never", role="worker", created_by="test", all_queues=True)
    runtime, rq = remote_runtime(service, token, Gate())
    running = Runner(runtime, wait_registered=False)
    try:
        wait_for(lambda: runtime.stats.transient_errors >= 1, 10, "registration retried")
        started = time.monotonic()
        running.stop(10)  # returns normally: nothing was held, nothing to raise
        assert time.monotonic() - started < 5
    finally:
        rq.close()
    assert runtime.worker is None


def test_a_direct_worker_connects_through_a_stalled_network_once_it_heals(pg_schema_dsn: str) -> None:
    """The worker's path to PostgreSQL is a black hole when it starts: each connection
    attempt times out (BackendUnavailable) and is retried; once the path heals, the
    worker connects, migrates, registers and completes its task on the first attempt."""
    q = leaseq.connect(pg_schema_dsn)
    q.migrate()
    proxy = FaultyProxy(urlsplit(pg_schema_dsn).port or 5432)
    port = proxy.add_link("w")
    proxy.blackhole("w")
    app = leaseq.App(through(pg_schema_dsn, port), name="late", connect_timeout=1)
    gate = Gate()
    gate.open.set()

    @app.task("job", effect="read_only", max_attempts=1, lease_seconds=30)
    def job(ctx: leaseq.TaskContext) -> dict:
        return gate.hold(ctx)

    task_id = q.enqueue("job", {}, max_attempts=1, lease_seconds=30).id
    running = Runner(app.worker(poll_interval=0.05), wait_registered=False)
    try:
        wait_for(lambda: running.runtime.stats.transient_errors >= 2, 20, "connecting retried through the stall")
        assert running.thread.is_alive() and running.runtime.worker is None
        proxy.heal("w")
        wait_for(lambda: running.runtime.stats.completed == 1, 30, "the task completed after the heal")
        running.stop()
        first_attempt_completed(q, [task_id])
    finally:
        proxy.heal_all()
        if running.thread.is_alive():
            running.runtime.stop()
            running.thread.join(10)
        q.close()
        if app._queue is not None:
            app.queue.close()
        proxy.close()
