"""Limits over HTTP: operators set and delete them (audited), viewers read them,
workers claim under them, and /metrics and the dashboard show their usage."""

from __future__ import annotations

import leaseq
from leaseq import auth

from .conftest import Service
from .support import dashboard_login, error_of


def test_an_operator_sets_and_deletes_a_limit_and_a_viewer_reads_it(svc: Service) -> None:
    ops = svc.http(svc.token("operator", "alice"))
    resp = ops.put("/v1/limits/openai", json={"max_running": 2, "per_second": 5, "burst": 2})
    assert resp.status_code == 200, resp.text
    assert resp.json()["max_running"] == 2 and resp.json()["tokens"] == 2.0
    [entry] = [e for e in auth.audit_log(svc.q) if e["action"] == "set_limit"]
    assert entry["target"] == "limit:openai" and entry["actor"].startswith("alice (operator token ")
    viewer = svc.http(svc.token("viewer"))
    [row] = viewer.get("/v1/limits").json()["limits"]
    assert (row["key"], row["running"], row["available"]) == ("openai", 0, 2)
    assert ops.delete("/v1/limits/openai").json() == {"key": "openai", "deleted": True}
    assert viewer.get("/v1/limits").json() == {"limits": []}
    missing = ops.delete("/v1/limits/openai")
    assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"


def test_only_operators_change_limits(svc: Service) -> None:
    for role in ("viewer", "worker"):
        client = svc.http(svc.token(role, all_queues=True))
        assert client.put("/v1/limits/k", json={"max_running": 1}).status_code == 403
        assert client.delete("/v1/limits/k").status_code == 403
    assert svc.http().get("/v1/limits").status_code == 401
    assert svc.q.limits() == []


def test_bad_limit_input_is_a_4xx_naming_the_field(svc: Service) -> None:
    ops = svc.http(svc.token("operator"))
    for body, field in (({"max_running": 0}, "max_running"), ({"burst": 2}, "burst"),
                        ({"max_running": 1, "counts": "bytes"}, "counts"), ({}, "max_running")):
        resp = ops.put("/v1/limits/k", json=body)
        assert 400 <= resp.status_code < 500, resp.text
        assert field in error_of(resp)["message"]
    bad_key = ops.put("/v1/limits/a%20b", json={"max_running": 1})
    assert 400 <= bad_key.status_code < 500 and "key" in error_of(bad_key)["message"]
    assert svc.q.limits() == []


def test_remote_workers_claim_under_a_limit_and_remote_enqueue_names_it(svc: Service) -> None:
    rq = svc.remote(svc.token("operator"))
    assert rq.set_limit("api", max_running=1)["max_running"] == 1
    enq = svc.remote(svc.token("admin"))
    first = enq.enqueue("job", {"n": 1}, limits=["api"], units=2)
    assert (first.limits, first.units) == (["api"], 2)
    enq.enqueue("job", {"n": 2}, limits=["api"])
    worker_client = svc.remote(svc.token("worker", all_queues=True))
    w = worker_client.register_worker("remote")
    [c] = worker_client.claim(w, limit=5)
    assert worker_client.claim(w, limit=5) == []
    assert [r["running"] for r in rq.limits()] == [1]
    worker_client.complete(w, c)  # a completion over HTTP gives the slot back
    assert [r["running"] for r in rq.limits()] == [0]
    assert len(worker_client.claim(w, limit=5)) == 1
    rq.delete_limit("api")
    assert rq.limits() == []


def test_an_empty_bucket_tells_a_remote_worker_when_to_look_again(svc: Service) -> None:
    svc.q.set_limit("rate", per_second=2, burst=1)
    for i in range(3):
        svc.q.enqueue("job", {"i": i}, limits=["rate"])
    client = svc.remote(svc.token("worker", all_queues=True))
    w = client.register_worker("remote")
    assert len(client.claim(w, limit=5)) == 1
    empty = client.claim(w, limit=5)
    assert empty == [] and empty.limit_wait is not None and 0 <= empty.limit_wait <= 0.5 + 1e-6


def test_metrics_and_the_dashboard_show_limit_usage(svc: Service) -> None:
    q = svc.q
    q.set_limit("openai", max_running=3)
    q.set_limit("rate", per_second=1, burst=4)
    q.enqueue("job", limits=["openai"])
    w = q.register_worker("w")
    assert len(q.claim(w)) == 1
    text = svc.http(svc.token("viewer")).get("/metrics").text
    assert 'leaseq_limit_running{limit="openai"} 1.0' in text
    assert 'leaseq_limit_max_running{limit="openai"} 3.0' in text
    assert 'leaseq_limit_tokens{limit="rate"} 4.0' in text
    client = dashboard_login(svc.url, svc.token("viewer"))
    try:
        page = client.get("/").text
    finally:
        client.close()
    assert 'id="limits"' in page and 'data-limit="openai"' in page and 'data-limit="rate"' in page
