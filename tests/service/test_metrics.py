"""/metrics scrapes in Prometheus format, from a registry of the app's own."""

from __future__ import annotations

import leaseq
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Service, serve
from .support import wait_until


def scrape(svc: Service, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = svc.http(token).get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def test_metrics_after_real_work(svc: Service) -> None:
    q = svc.q
    rq = svc.remote(svc.token("worker", all_queues=True))
    w = rq.register_worker("w")
    for n in range(2):
        rq.enqueue("job", {"n": n}, effect="side_effect", queue="mail")
    short = rq.claim(w, queue="mail", limit=2, lease_seconds=1.0)
    renewed = rq.heartbeat(w, short[0])
    rq.begin_effect(w, short[0], "email.send")    # an intent without a response
    rq.enqueue("job", {"n": 2}, queue="mail")
    [done] = rq.claim(w, queue="mail")
    rq.complete(w, done, {"ok": True})
    rq.enqueue("job", {"n": 3}, queue="mail")      # stays queued
    wait_until(q, max(renewed, short[1].expires_at))
    try:
        rq.complete(w, short[1])                    # refused: the lease ran out
    except leaseq.LeaseLost:
        pass
    else:
        raise AssertionError("an expired lease completed")
    q.sweep()                                       # short[0] -> needs_reconciliation, short[1] -> queued

    m = scrape(svc, svc.token("viewer"))
    assert m[("leaseq_database_up", ())] == 1
    assert m[("leaseq_tasks", (("queue", "mail"), ("status", "completed")))] == 1
    assert m[("leaseq_tasks", (("queue", "mail"), ("status", "needs_reconciliation")))] == 1
    assert m[("leaseq_tasks", (("queue", "mail"), ("status", "queued")))] == 2
    # statuses with no task read zero instead of vanishing
    for status in ("running", "cancelled", "dead", "blocked"):
        assert m[("leaseq_tasks", (("queue", "mail"), ("status", status)))] == 0, status
    assert m[("leaseq_expired_leases", (("queue", "mail"),))] == 0
    assert m[("leaseq_reconciliation_backlog", (("queue", "mail"), ("status", "blocked")))] == 0
    assert m[("leaseq_reconciliation_backlog", (("queue", "mail"), ("status", "needs_reconciliation")))] == 1
    assert m[("leaseq_effect_intents_open", (("queue", "mail"),))] == 1
    assert m[("leaseq_claims_total", (("queue", "mail"),))] == 3
    assert m[("leaseq_lease_losses_total", (("reason", "complete"),))] == 1
    assert m[("leaseq_claim_latency_seconds_count", ())] == 2
    assert m[("leaseq_heartbeat_latency_seconds_count", ())] == 1
    assert m[("leaseq_oldest_queued_seconds", (("queue", "mail"),))] >= 0
    route = "/v1/workers/{worker_id}/tasks/{task_id}/complete"
    assert m[("leaseq_http_requests_total", (("method", "POST"), ("route", route), ("status", "409")))] == 1


def test_metrics_need_a_reader_unless_public(q: leaseq.Queue, dsn: str, svc: Service) -> None:
    assert svc.http().get("/metrics").status_code == 401
    assert svc.http(svc.token("worker", all_queues=True)).get("/metrics").status_code == 403
    # a second app in the same process: its own registry, no clash with the first
    with serve(q, public_metrics=True) as (url, app):
        other = Service(url, app, q, dsn)
        assert other.http().get("/metrics").status_code == 200
        assert app.state.metrics.registry is not svc.app.state.metrics.registry
        other.close()
