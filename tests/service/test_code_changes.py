"""Code changes under replay with real workers, on both backends, in process and over HTTP
(`leaseq serve`, RemoteQueue): App(version=...) workers serve only the versions they declare
compatible, and a deployed handler whose tool calls no longer match the recorded run leaves its
task in needs_reconciliation, naming the entry, instead of failing it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import leaseq
from leaseq.worker import WorkerRuntime
from leaseq_chaos.traces import validate_queue
from worker.conftest import RunningWorker, wait_for

VIA = ["direct", "http"]


def _start(svc: Any, via: str, app: leaseq.App) -> RunningWorker:
    transport = svc.q if via == "direct" else svc.remote(svc.token("worker", all_queues=True))
    return RunningWorker(WorkerRuntime(app, transport, concurrency=2, poll_interval=0.05, grace=10))


def _trip_app(version: str, made: list[str], shape: Callable[[str], str], **options: Any) -> leaseq.App:
    app = leaseq.App(name=f"trips-{version}", version=version, **options)

    def lookup(city: str) -> dict[str, str]:
        made.append(city)
        return {"city": city}

    @app.task("trip", max_attempts=1)
    def trip(ctx: leaseq.TaskContext, city: str) -> Any:
        found = ctx.tool(lookup, action="weather.get", effect="read_only")(shape(city))
        ctx.sleep(0.3)  # the attempt ends here; the next one replays the lookup
        return found

    return app


@pytest.mark.parametrize("via", VIA)
def test_a_deployed_handler_whose_tool_calls_changed_leaves_its_task_to_reconciliation(svc: Any, via: str) -> None:
    q = svc.q
    made: list[str] = []
    old = _trip_app("1", made, lambda city: city)
    # the new code asks the recorded lookup for something else, and declares it can replay 1
    new = _trip_app("2", made, str.upper, compatible_versions=["1"])
    task = q.enqueue("trip", {"city": "oslo"}, max_attempts=1)
    running = _start(svc, via, old)
    try:
        wait_for(lambda: q.get(task.id).status == "waiting", timeout=30)
    finally:
        running.stop()
    assert q.get(task.id).code_version == "1" and made == ["oslo"]
    running = _start(svc, via, new)
    try:
        wait_for(lambda: q.get(task.id).status == "needs_reconciliation", timeout=30)
    finally:
        running.stop()
    held = q.get(task.id)
    key = f"{task.idempotency_key}:weather.get:0"
    # not failed and no attempt burnt: with max_attempts=1 a failure would have made it dead
    assert (held.status, held.attempts, held.lease_owner) == ("needs_reconciliation", 0, None)
    assert key in (held.last_error or "") and made == ["oslo"]  # the changed call was never made
    assert running.runtime.stats.failed == 0 and running.runtime.stats.lost == 0
    types = [e.type for e in q.events(task.id)]
    assert "failed" not in types and types[-2:] == ["diverged", "needs_reconciliation"]
    [diverged] = [e for e in q.events(task.id) if e.type == "diverged"]
    assert diverged.detail["idempotency_key"] == key and diverged.detail["code_version"] == "1"
    assert diverged.detail["recorded"]["args_digest"] != diverged.detail["requested"]["args_digest"]
    # a token that may not read payloads sees that the run diverged, not where nor with what
    events = svc.http(svc.token("viewer")).get(f"/v1/tasks/{task.id}/events")
    assert events.status_code == 200
    [hidden] = [e["detail"] for e in events.json()["events"] if e["type"] == "diverged"]
    assert {hidden[k] for k in ("idempotency_key", "recorded", "requested", "error")} == {"[redacted]"}
    # a person resolves it with the existing operator action
    assert q.reconcile(task.id, "cancel", "the run cannot be replayed by the new code", by="ann").status == "cancelled"
    assert validate_queue(q) == []


@pytest.mark.parametrize("via", VIA)
def test_a_worker_serves_only_the_versions_it_declares(svc: Any, via: str) -> None:
    q = svc.q
    made: list[str] = []
    started = q.enqueue("trip", {"city": "rome"}, max_attempts=1)
    running = _start(svc, via, _trip_app("1", made, lambda city: city))
    try:
        wait_for(lambda: q.get(started.id).status == "waiting", timeout=30)
    finally:
        running.stop()
    fresh = q.enqueue("trip", {"city": "bern"}, max_attempts=1)
    strict = _start(svc, via, _trip_app("2", made, lambda city: city))  # serves 2 only
    try:
        wait_for(lambda: q.get(fresh.id).status == "completed", timeout=30)  # not started: any worker's
        time.sleep(0.5)  # the sleeper woke long ago: a worker that served it would have run it
        assert q.get(started.id).status == "queued" and q.get(started.id).code_version == "1"
    finally:
        strict.stop()
    assert q.get(fresh.id).code_version == "2"
    reader = _start(svc, via, _trip_app("2", made, lambda city: city, compatible_versions=["1"]))
    try:
        wait_for(lambda: q.get(started.id).status == "completed", timeout=30)
    finally:
        reader.stop()
    assert q.get(started.id).result == {"city": "rome"} and q.get(started.id).code_version == "1"
    assert made == ["rome", "bern"]  # the lookup replayed, not made again
    assert validate_queue(q) == []
