"""A remote worker (RemoteQueue through `leaseq serve`) under service faults, on both backends.

The service is a real uvicorn subprocess. Killed (SIGKILL) while the worker's
handlers run and restarted on the same port after they have succeeded: every
success is recorded by its first attempt once the service is back. A claim the
service refuses for good (403: a queue the token may not use) stops the
worker gracefully: running tasks get the grace period, then their leases are
released through the recovery policy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import leaseq
from leaseq import auth
from leaseq_chaos.pgserver import free_port
from leaseq.client import RemoteQueue
from leaseq.worker import WorkerRuntime

from .support import Gate, Runner, Service, first_attempt_completed, wait_for


@pytest.fixture
def service(q: leaseq.Queue, dsn: str, tmp_path: Path) -> Iterator[Service]:
    svc = Service(dsn, free_port(), tmp_path / "service.log").start()
    yield svc
    svc.close()


def remote_worker(q: leaseq.Queue, service: Service, gate: Gate, *, queues: list[str] | None = None,
                  token_queues: list[str] | None = None, **options) -> tuple[WorkerRuntime, RemoteQueue]:
    token, _ = auth.create_token(q, name="remote-worker", role="worker", queues=token_queues,
                                 all_queues=token_queues is None, created_by="test")
    rq = RemoteQueue(service.url, token, timeout=5)
    app = leaseq.App(name="remote")  # never connects: the worker goes through the service

    @app.task("job", effect="read_only", max_attempts=1, lease_seconds=30)
    def job(ctx: leaseq.TaskContext) -> dict:
        return gate.hold(ctx)

    return WorkerRuntime(app, rq, queues=queues, poll_interval=0.05, **options), rq


def test_service_restarted_under_a_remote_worker(q: leaseq.Queue, service: Service) -> None:
    gate = Gate()
    runtime, rq = remote_worker(q, service, gate, concurrency=3)
    ids = [q.enqueue("job", {}, max_attempts=1, lease_seconds=30).id for _ in range(3)]
    running = Runner(runtime)
    try:
        wait_for(lambda: len(gate.started) == 3, what="the handlers running")
        service.kill()
        gate.open.set()  # the handlers succeed while the service is down
        wait_for(lambda: len(gate.returned) == 3, what="the handlers returned")
        time.sleep(1.0)  # their completions meet a dead service, and are retried
        service.start()
        wait_for(lambda: runtime.stats.completed == 3, what="the completions recorded after the restart")
    finally:
        gate.open.set()
        running.stop()
        rq.close()
    first_attempt_completed(q, ids)
    stats = runtime.stats
    assert (stats.lost, stats.failed, stats.unconfirmed) == (0, 0, 0), stats


def test_a_refused_claim_stops_the_worker_and_releases_its_running_tasks(q: leaseq.Queue, service: Service) -> None:
    gate = Gate()
    # The token may use queue "a" only; the worker also asks for "b", which the
    # service refuses (403) once the claim on "a" has handed out the task.
    runtime, rq = remote_worker(q, service, gate, queues=["a", "b"], token_queues=["a"], concurrency=2, grace=1.0)
    task = q.enqueue("job", {}, queue="a", max_attempts=3, lease_seconds=30)
    running = Runner(runtime)
    try:
        wait_for(lambda: gate.started, what="the handler running")
        with pytest.raises(auth.AccessDenied):
            wait_for(lambda: not running.thread.is_alive(), 20, "the worker stopped")
            running.stop()
    finally:
        gate.open.set()
        rq.close()
    released = q.get(task.id)
    assert (released.status, released.lease_owner) == ("queued", None), released
    events = [e for e in q.events(task.id) if e.type == "lease_released"]
    assert events and events[0].detail["routed_to"] == "queued"
    assert runtime.stats.released == 1


def test_a_long_poll_cut_by_a_service_restart_resumes_and_picks_up_work(q: leaseq.Queue, service: Service) -> None:
    # An idle remote worker waits in the service (a long-poll claim). The service
    # dies under that wait; a task is enqueued while it is down; once it is back,
    # the worker's next long poll picks the task up on its first attempt.
    gate = Gate()
    gate.open.set()
    runtime, rq = remote_worker(q, service, gate, concurrency=2)
    running = Runner(runtime)
    try:
        time.sleep(1.0)  # the worker's claim is waiting in the service
        service.kill()
        task = q.enqueue("job", {}, max_attempts=1, lease_seconds=30)
        time.sleep(0.5)
        service.start()
        wait_for(lambda: q.get(task.id).status == "completed", 20, "the task completed after the restart")
        stopped = time.monotonic()
    finally:
        running.stop()
        rq.close()
    assert time.monotonic() - stopped < 5.0, "the stop waited out a long poll"
    first_attempt_completed(q, [task.id])
    assert runtime.stats.transient_errors >= 1  # the cut wait was seen, and retried
