"""Durable waits over HTTP: a remote worker's sleeps and signal waits end its attempts through
the worker API (the lease guard in the same code as directly), and signals are sent with
`POST /v1/tasks/{id}/signals/{name}` by operators only, within their queues, recorded with the
token's principal as the sender."""

from __future__ import annotations

import time
from typing import Any

import pytest

import leaseq
from leaseq.core.errors import AccessDenied
from leaseq.worker import WorkerRuntime
from leaseq_chaos.traces import validate_queue
from worker.conftest import RunningWorker, wait_for


def test_a_remote_worker_sleeps_and_waits_for_signals_holding_no_lease(svc: Any) -> None:
    app = leaseq.App(name="waits-http")
    woke: list[int] = []

    @app.task("nap", max_attempts=1)
    async def nap(ctx: leaseq.TaskContext, n: int) -> int:
        await ctx.sleep(1.0)
        woke.append(n)
        return n

    @app.task("review")
    def review(ctx: leaseq.TaskContext, doc: str) -> Any:
        return {"doc": doc, "verdict": ctx.wait_for_signal("verdict", timeout=60)}

    q = svc.q
    naps = q.enqueue_many("nap", [{"n": n} for n in range(40)])
    asked = q.enqueue("review", {"doc": "d-1"})
    remote = svc.remote(svc.token("worker", all_queues=True))
    running = RunningWorker(WorkerRuntime(app, remote, concurrency=4, poll_interval=0.05, grace=20))
    try:
        wait_for(lambda: q.get(asked.id).status == "waiting", timeout=30)
        peak_waiting = 0
        counts: dict[str, int] = {}
        while counts.get("completed", 0) < len(naps):  # the review waits for its signal meanwhile
            counts = {r["status"]: r["count"] for r in q.stats()}
            peak_waiting = max(peak_waiting, counts.get("waiting", 0))
            assert all(t.lease_owner is None for t in q.list_tasks(status="waiting", limit=50))
            time.sleep(0.05)
        assert peak_waiting > 2 * 4 and sorted(woke) == list(range(40))
        assert q.get(asked.id).status == "waiting" and q.get(asked.id).lease_owner is None
        sent = svc.remote(svc.token("operator", name="ann")).signal(asked.id, "verdict", {"ok": True})
        assert sent["woke"] is True and sent["sent_by"].startswith("ann (operator token ")
        wait_for(lambda: q.get(asked.id).status == "completed", timeout=30)
    finally:
        running.stop()
    assert q.get(asked.id).result == {"doc": "d-1", "verdict": {"ok": True}}
    assert running.runtime.stats.suspended == 41 and running.runtime.stats.lost == 0
    [received] = [e for e in q.events(asked.id) if e.type == "signal_received"]
    assert received.detail["sent_by"] == sent["sent_by"]  # the token's principal
    assert validate_queue(q) == []


def test_who_may_signal(svc: Any) -> None:
    q = svc.q
    task = q.enqueue("job", {}, queue="alpha")
    other = q.enqueue("job", {}, queue="beta")
    operator = svc.http(svc.token("operator", name="ops-alpha", queues=["alpha"]))
    ok = operator.post(f"/v1/tasks/{task.id}/signals/go", json={"payload": [1]})
    assert ok.status_code == 200 and ok.json()["sent_by"].startswith("ops-alpha (operator token ")
    assert operator.post(f"/v1/tasks/{other.id}/signals/go", json={}).status_code == 403  # not its queue
    viewer = svc.http(svc.token("viewer"))
    assert viewer.post(f"/v1/tasks/{task.id}/signals/go", json={}).status_code == 403
    worker = svc.http(svc.token("worker", all_queues=True))
    assert worker.post(f"/v1/tasks/{task.id}/signals/go", json={}).status_code == 403
    listed = svc.http(svc.token("viewer", name="reader", read_payloads=True)).get(f"/v1/tasks/{task.id}/signals")
    assert listed.status_code == 200 and [s["payload"] for s in listed.json()["signals"]] == [[1]]
    # a token that may not read payloads (a viewer's default) sees that a signal came, and from
    # whom, not what it carries
    blind = viewer.get(f"/v1/tasks/{task.id}/signals")
    assert blind.status_code == 200
    assert [(s["payload"], s["sent_by"]) for s in blind.json()["signals"]] == [("[redacted]", ok.json()["sent_by"])]
    bad = operator.post(f"/v1/tasks/{task.id}/signals/go", json={"payload": 1, "extra": 2})
    assert bad.status_code == 422
    missing = svc.http(svc.token("operator")).post("/v1/tasks/999999/signals/go", json={})
    assert missing.status_code == 404
    q.cancel(task.id, "done with it")
    ended = operator.post(f"/v1/tasks/{task.id}/signals/go", json={})
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "invalid_transition"
    with pytest.raises(AccessDenied):
        svc.remote(svc.token("viewer")).signal(other.id, "go")
    assert [e.detail["by"] for e in q.events(task.id) if e.type == "signal_sent"] == [ok.json()["sent_by"]]


def test_a_waits_ledger_key_is_hidden_from_a_token_that_may_not_read_payloads(svc: Any) -> None:
    """A durable wait's events name its ledger key, made from the task's idempotency key (which
    a caller may have built from user data): shown to a token that may read payloads, hidden
    from one that may not, as idempotency keys are everywhere else."""
    import logging

    from leaseq.core.errors import Suspended
    from leaseq.worker.context import TaskContext

    q = svc.q
    task = q.enqueue("job", {}, idempotency_key="customer-73519-refund")
    w = q.register_worker("w")
    [claim] = q.claim(w)
    with pytest.raises(Suspended):
        TaskContext(q, w, claim, logging.LoggerAdapter(logging.getLogger("test"), {})).wait_for_signal("go")

    def suspended(token: str) -> dict[str, Any]:
        answer = svc.http(token).get(f"/v1/tasks/{task.id}/events")
        assert answer.status_code == 200
        [event] = [e for e in answer.json()["events"] if e["type"] == "suspended"]
        return event["detail"]

    assert suspended(svc.token("viewer", name="reader", read_payloads=True))["key"].startswith("customer-73519-refund")
    hidden = suspended(svc.token("viewer"))
    assert hidden["key"] == "[redacted]" and hidden["signal"] == "go"
