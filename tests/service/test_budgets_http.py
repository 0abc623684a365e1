"""Budgets over HTTP: a fail with ``retry_after`` is a retry on request, enqueue
takes ``timeout`` and ``deadline``, and a worker runtime over RemoteQueue
honours Retry and timeouts, against a real service on both backends."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

import pytest

import leaseq

from .support import error_of, snapshot


def test_fail_with_retry_after_is_a_retry_on_request(svc) -> None:
    token = svc.token("worker", all_queues=True)
    rq, raw = svc.remote(token), svc.http(token)
    w = rq.register_worker("w")
    task = rq.enqueue("call.llm", max_attempts=1)
    [claim] = rq.claim(w)
    resp = raw.post(f"/v1/workers/{w.id}/tasks/{task.id}/fail",
                    json={"generation": claim.generation, "error": "429 from the provider", "retry_after": 30})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["status"], body["attempts"], body["snoozes"]) == ("queued", 0, 1)
    [asked] = [e for e in svc.q.events(task.id) if e.type == "retry_requested"]
    assert asked.detail["reason"] == "429 from the provider" and asked.detail["after"] == 30
    assert rq.claim(w) == []  # not before 30 s by the database's clock


def test_retry_after_with_bad_input_is_a_4xx_and_writes_nothing(svc) -> None:
    token = svc.token("worker", all_queues=True)
    rq, raw = svc.remote(token), svc.http(token)
    w = rq.register_worker("w")
    task = rq.enqueue("job")
    [claim] = rq.claim(w)
    before = snapshot(svc.dsn)
    for extra, field in [({"retry_after": -1}, "after"), ({"retry_after": 5, "block": True}, "retry_after"),
                         ({"retry_after": 5, "retry": False}, "retry_after"),
                         ({"retry_after": 5, "delay": 1}, "retry_after"), ({"retry_after": "soon"}, "retry_after")]:
        resp = raw.post(f"/v1/workers/{w.id}/tasks/{task.id}/fail",
                        json={"generation": claim.generation, "error": "later", **extra})
        assert 400 <= resp.status_code < 500, (extra, resp.status_code, resp.text)
        assert field in error_of(resp)["message"] or error_of(resp).get("field") == field, resp.text
    assert snapshot(svc.dsn) == before


def test_a_stale_generation_cannot_retry_over_http(svc) -> None:
    token = svc.token("worker", all_queues=True)
    rq, raw = svc.remote(token), svc.http(token)
    w = rq.register_worker("w")
    task = rq.enqueue("job")
    [claim] = rq.claim(w)
    before = snapshot(svc.dsn)
    resp = raw.post(f"/v1/workers/{w.id}/tasks/{task.id}/fail",
                    json={"generation": claim.generation - 1, "error": "later", "retry_after": 0})
    assert resp.status_code == 409 and error_of(resp)["code"] == "lease_lost", resp.text
    assert snapshot(svc.dsn) == before


def test_enqueue_over_http_takes_timeout_and_deadline(svc) -> None:
    raw = svc.http(svc.token("operator"))
    at = datetime.now(timezone.utc) + timedelta(hours=1)
    resp = raw.post("/v1/tasks", json={"kind": "job", "timeout": 2.5, "deadline": at.isoformat()})
    assert resp.status_code == 201, resp.text
    task = svc.q.get(resp.json()["id"])
    assert task.timeout_seconds == 2.5 and abs((task.deadline_at - at).total_seconds()) < 0.001
    before = snapshot(svc.dsn)
    for body, field in [({"timeout": 0}, "timeout"), ({"deadline": "2030-01-01T00:00:00"}, "deadline"),
                        ({"deadline": "tomorrow"}, "deadline"), ({"timeout": "long"}, "timeout")]:
        resp = raw.post("/v1/tasks", json={"kind": "job", **body})
        assert 400 <= resp.status_code < 500, (body, resp.text)
        assert field in resp.text
    assert snapshot(svc.dsn) == before


def test_remote_queue_enqueue_sends_a_datetime_or_timedelta_deadline(svc) -> None:
    # RemoteQueue.enqueue takes the deadline Queue.enqueue takes (it failed in json.dumps)
    token = svc.token("operator")
    rq, raw = svc.remote(token), svc.http(token)
    at = datetime.now(timezone.utc) + timedelta(hours=1)
    task = rq.enqueue("job", deadline=at)
    assert abs((svc.q.get(task.id).deadline_at - at).total_seconds()) < 0.001
    relative = rq.enqueue("job", deadline=timedelta(minutes=5), idempotency_key="in-5m")
    stored = svc.q.get(relative.id)
    assert abs((stored.deadline_at - stored.created_at).total_seconds() - 300) < 0.01
    # the relative deadline is compared by its length, as Queue.enqueue's is
    assert rq.enqueue("job", deadline=timedelta(minutes=5), idempotency_key="in-5m").id == relative.id
    with pytest.raises(leaseq.IdempotencyKeyConflict) as conflict:
        rq.enqueue("job", deadline=timedelta(minutes=6), idempotency_key="in-5m")
    assert conflict.value.fields == ("deadline",)
    before = snapshot(svc.dsn)
    with pytest.raises(leaseq.InvalidInput, match="timezone"):
        rq.enqueue("job", deadline=datetime(2030, 1, 1))
    for body in [{"deadline_in": -1}, {"deadline_in": 1e300}, {"deadline_in": 5, "deadline": at.isoformat()}]:
        resp = raw.post("/v1/tasks", json={"kind": "job", **body})
        assert resp.status_code == 422 and "deadline_in" in resp.text, (body, resp.text)
    assert snapshot(svc.dsn) == before


def test_a_remote_worker_honours_retry_and_timeouts(svc) -> None:
    app = leaseq.App(queue=svc.q)
    tries: list[int] = []

    @app.task("call.llm")
    async def call_llm(ctx) -> str:
        tries.append(ctx.generation)
        if len(tries) == 1:
            raise leaseq.Retry(after=0.2, reason="rate limited")
        return "ok"

    @app.task("runaway", timeout=1, max_attempts=1)
    async def runaway(ctx) -> None:
        await asyncio.sleep(10)

    snoozy, slow = call_llm.enqueue(), runaway.enqueue()
    started = time.monotonic()
    remote = svc.remote(svc.token("worker", all_queues=True))
    stats = app.run_worker(transport=remote, until_idle=True, install_signals=False,
                           concurrency=2, name="remote")
    assert time.monotonic() - started < 10
    assert (svc.q.get(snoozy.id).status, svc.q.get(snoozy.id).snoozes) == ("completed", 1)
    assert svc.q.get(slow.id).status == "dead"
    assert (stats.snoozed, stats.timed_out, stats.completed) == (1, 1, 1)
