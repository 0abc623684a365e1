"""``POST /v1/tasks/batch`` (``RemoteQueue.enqueue_many`` and its awaited twin): the library's
``Queue.enqueue_many`` over HTTP, the same engine operation in one transaction, on both
backends. Idempotency keys dedupe as they do in the library, each task gets its own budget,
a queue-limited token reaches its queues only, and a bad item (or too many) is refused with
a 422 naming its index and field, nothing written."""

from __future__ import annotations

import asyncio
import time

import pytest

import leaseq
from leaseq.core.checks import parse_traceparent
from leaseq.client import AsyncRemoteQueue
from leaseq.service.operator_api import MAX_BATCH
from worker.liveness_app import summarize

from .conftest import Service, serve
from .support import error_of, snapshot


def written(dsn: str) -> dict[str, list[tuple]]:
    """Every table but the tokens' (a request stamps its token's last use) and the leader's."""
    return {name: rows for name, rows in snapshot(dsn).items() if name not in ("leaseq_tokens", "leaseq_leader")}


def test_a_batch_adds_every_task_in_order_with_the_librarys_rules(svc: Service) -> None:
    q = svc.q
    remote = svc.remote(svc.token("operator", all_queues=True))
    ids = remote.enqueue_many("job", [{"n": n} for n in range(3)], queue="batch",
                              idempotency_keys=["a", None, "c"], budget={"tok": 500}, fairness_key="tenant-1",
                              priority=3, limits=None)
    tasks = [q.get(task_id) for task_id in ids]
    assert [t.payload for t in tasks] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert {(t.queue, t.kind, t.priority, t.fairness_key) for t in tasks} == {("batch", "job", 3, "tenant-1")}
    assert [t.budget for t in tasks] == [{"tok": 500}] * 3
    assert (tasks[0].idempotency_key, tasks[2].idempotency_key) == ("a", "c")
    # the same keys asking for the same tasks: the same ids, nothing new (as Queue.enqueue_many)
    again = remote.enqueue_many("job", [{"n": 0}, {"n": 2}], queue="batch", idempotency_keys=["a", "c"],
                                budget={"tok": 500}, fairness_key="tenant-1", priority=3)
    assert again == [ids[0], ids[2]] and len(q.list_tasks(queue="batch")) == 3
    # a key asking for another task: 409, nothing written
    before = written(svc.dsn)
    with pytest.raises(leaseq.IdempotencyKeyConflict):
        remote.enqueue_many("job", [{"n": 9}, {"n": 10}], queue="batch", idempotency_keys=["fresh", "a"],
                            budget={"tok": 500}, fairness_key="tenant-1", priority=3)
    assert written(svc.dsn) == before
    # the awaited twin
    async def twin() -> list[int]:
        async with AsyncRemoteQueue(svc.url, svc.token("operator", all_queues=True), timeout=10) as aq:
            return await aq.enqueue_many("job", [1, 2], queue="batch-async")
    added = asyncio.run(twin())
    assert [q.get(task_id).payload for task_id in added] == [1, 2]


def test_a_queue_limited_token_adds_a_batch_to_its_queues_only(svc: Service) -> None:
    http = svc.http(svc.token("operator", queues=["mine"]))
    before = written(svc.dsn)
    refused = http.post("/v1/tasks/batch", json={"kind": "job", "payloads": [1, 2], "queue": "theirs"})
    assert refused.status_code == 403 and error_of(refused)["code"] == "forbidden"
    assert written(svc.dsn) == before
    upstream = svc.q.enqueue("job", queue="theirs")
    waits = http.post("/v1/tasks/batch", json={"kind": "job", "payloads": [1], "queue": "mine",
                                               "after": [upstream.id]})
    # a task of another queue is not named: refused as the single enqueue refuses it
    single = http.post("/v1/tasks", json={"kind": "job", "payload": 1, "queue": "mine", "after": [upstream.id]})
    assert waits.status_code == single.status_code in (403, 404, 422), waits.text
    assert error_of(waits).get("field") == error_of(single).get("field")
    assert [t.id for t in svc.q.list_tasks(queue="mine")] == []
    ok = http.post("/v1/tasks/batch", json={"kind": "job", "payloads": [1, 2], "queue": "mine"})
    assert ok.status_code == 201, ok.text
    assert [svc.q.get(i).queue for i in ok.json()["task_ids"]] == ["mine", "mine"]


#: a W3C traceparent, as a traced caller sends it
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_batch_records_the_callers_traceparent_as_the_single_enqueue_does(svc: Service) -> None:
    """The ``traceparent`` header of a batch is stored with every task it adds (the claim hands
    it to the worker, whose spans join the caller's trace), as ``POST /v1/tasks`` stores it; an
    invalid one is ignored, as W3C Trace Context says a receiver must. RemoteQueue.enqueue_many
    sends ``trace_context`` as the header, and Queue.enqueue_many takes it too."""
    http = svc.http(svc.token("operator", all_queues=True))
    sent = http.post("/v1/tasks/batch", json={"kind": "job", "payloads": [1, 2]}, headers={"traceparent": CALLER})
    assert sent.status_code == 201, sent.text
    assert [svc.q.get(i).trace_context for i in sent.json()["task_ids"]] == [CALLER, CALLER]
    single = http.post("/v1/tasks", json={"kind": "job", "payload": 3}, headers={"traceparent": CALLER})
    assert single.json()["trace_context"] == CALLER
    ignored = http.post("/v1/tasks/batch", json={"kind": "job", "payloads": [4]},
                        headers={"traceparent": "00-zz-bad-01"})
    assert ignored.status_code == 201, ignored.text
    # not stored: none, or (when this process traces: a tracer provider is set) the context of
    # the service's own enqueue_many span, as POST /v1/tasks stores its enqueue span's
    stored = svc.q.get(ignored.json()["task_ids"][0]).trace_context
    assert stored is None or (stored != "00-zz-bad-01" and parse_traceparent(stored) == stored)
    remote = svc.remote(svc.token("operator", all_queues=True))
    ids = remote.enqueue_many("job", [5, 6], trace_context=CALLER)
    assert {svc.q.get(i).trace_context for i in ids} == {CALLER}
    assert {svc.q.get(i).trace_context for i in svc.q.enqueue_many("job", [7], trace_context=CALLER)} == {CALLER}
    with pytest.raises(leaseq.InvalidInput) as bad:
        remote.enqueue_many("job", [8], trace_context="nonsense")
    assert bad.value.field == "trace_context"
    with pytest.raises(leaseq.InvalidInput) as bad:
        svc.q.enqueue_many("job", [8], trace_context="nonsense")
    assert bad.value.field == "trace_context"
    w = svc.q.register_worker("reader")
    claimed = {c.task_id: c.task.trace_context for c in svc.q.claim(w, limit=10)}
    assert claimed[sent.json()["task_ids"][0]] == CALLER


@pytest.mark.parametrize("body, field", [
    ({"kind": "job", "payloads": []}, "payloads"),
    ({"kind": "job", "payloads": list(range(MAX_BATCH + 1))}, "payloads"),
    ({"kind": "job", "payloads": [1, 2, 3], "idempotency_keys": ["a", "b"]}, "idempotency_keys"),
    ({"kind": "job", "payloads": [1, 2, 3], "idempotency_keys": ["a", "b", "x" * 300]}, "idempotency_keys[2]"),
    ({"kind": "job", "payloads": [1, 2], "idempotency_keys": ["a", "a"]}, "idempotency_keys[1]"),
    ({"kind": "job", "payloads": [1], "budget": {"tok": 0}}, "budget['tok']"),
    ({"kind": "job", "payloads": [1], "queue": "has space"}, "queue"),
    ({"kind": "job", "payloads": [1], "fairness_weight": -1}, "fairness_weight"),
    ({"kind": "summarize", "payloads": [{"doc_id": 1}, {"doc_id": 2}, {"doc": 3}]}, "payloads[2].doc"),
])
def test_a_bad_item_is_refused_naming_its_index_and_field_and_nothing_is_written(svc: Service, body: dict,
                                                                                 field: str) -> None:
    svc.q.register_worker("w", kinds=summarize.app.registry.declarations(), heartbeat_seconds=60,
                          lease_seconds=120)
    http = svc.http(svc.token("operator", all_queues=True))
    before = written(svc.dsn)
    resp = http.post("/v1/tasks/batch", json=body)
    assert resp.status_code == 422, resp.text
    assert error_of(resp)["field"] == field, resp.text
    assert written(svc.dsn) == before


def test_a_batch_costs_the_tokens_request_rate_a_task_each(q: leaseq.Queue, dsn: str) -> None:
    """As an attacker with an operator token would: a batch is no way around the token's rate.
    With 10 requests a second and a burst of 10, a batch of 8 passes (8 of the 10), the next
    batch of 8 is refused (429, Retry-After, nothing written), and a batch larger than the
    burst costs the whole burst, so it passes once the bucket is full again."""
    with serve(q, rate_per_second=10.0, burst=10.0) as (url, app):
        svc = Service(url, app, q, dsn)
        try:
            http = svc.http(svc.token("operator"))
            ok = http.post("/v1/tasks/batch", json={"kind": "job", "payloads": list(range(8))})
            assert ok.status_code == 201, ok.text
            before = written(dsn)
            refused = http.post("/v1/tasks/batch", json={"kind": "job", "payloads": list(range(8))})
            assert refused.status_code == 429 and error_of(refused)["code"] == "rate_limited", refused.text
            assert float(refused.headers["Retry-After"]) > 0
            assert written(dsn) == before
            # a batch past the burst waits for a full bucket, then passes
            deadline = time.monotonic() + 5
            while True:
                big = http.post("/v1/tasks/batch", json={"kind": "job", "payloads": list(range(50))})
                if big.status_code != 429 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert big.status_code == 201, big.text
            assert len(big.json()["task_ids"]) == 50
        finally:
            svc.close()
