"""Budgets settled after the call over HTTP: a remote worker's ``ctx.consume`` goes through the
worker API (the lease guard in the same code as directly), a budget arrives with an enqueue
(``POST /v1/tasks``, RemoteQueue), an operator raises it with the approval, windows are set with
``PUT /v1/limits/{key}``, and the spend is read from ``GET /v1/limits/spend`` and ``/metrics``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import leaseq
from leaseq.service.stats import OTHER_TENANT, SPEND_TENANTS
from leaseq.worker import WorkerRuntime
from leaseq_chaos.traces import validate_queue
from worker.conftest import RunningWorker, wait_for

from .conftest import Service
from .support import error_of, move_spend_back, settle_by_tenant

TOK = "llm-tokens"


def test_a_remote_worker_consumes_and_an_operator_raises_the_budget(svc: Service) -> None:
    app = leaseq.App(name="budgets-http")
    made: list[int] = []

    @app.task("agent", limits=[TOK], units=100)
    async def agent(ctx: leaseq.TaskContext, steps: int) -> list[int]:
        async def call(step: int) -> int:
            made.append(step)
            return step

        model = ctx.tool(call, action="llm.call", effect="read_only")
        for step in range(steps):
            await model(step)
            await ctx.consume(TOK, 100)
        return list(range(steps))

    q = svc.q
    ops = svc.http(svc.token("operator", "alice"))
    resp = ops.put(f"/v1/limits/{TOK}", json={"per_day": 1_000_000, "per_hour": 500_000, "counts": "units"})
    assert resp.status_code == 200 and (resp.json()["per_day"], resp.json()["per_hour"]) == (1_000_000, 500_000)
    producer = svc.remote(svc.token("admin"))
    task = producer.enqueue("agent", {"steps": 4}, limits=[TOK], units=100, budget={TOK: 150})
    assert task.budget == {TOK: 150}
    remote = svc.remote(svc.token("worker", all_queues=True))
    running = RunningWorker(WorkerRuntime(app, remote, concurrency=2, poll_interval=0.05, grace=20))
    try:
        wait_for(lambda: q.get(task.id).status == "awaiting_approval", timeout=30)
        assert made == [0, 1]
        listed = ops.get("/v1/approvals").json()
        [request] = listed if isinstance(listed, list) else listed["approvals"]
        assert request["reason"] == "budget" and request["detail"]["spent"] == 200
        bad = ops.post(f"/v1/tasks/{task.id}/approve", json={"digest": request["digest"],
                                                              "raise_budget": {"other": 5}})
        assert bad.status_code == 422 and error_of(bad)["field"] == "raise_budget"
        ok = ops.post(f"/v1/tasks/{task.id}/approve", json={"digest": request["digest"],
                                                             "raise_budget": {TOK: 300}})
        assert ok.status_code == 200, ok.text
        wait_for(lambda: q.get(task.id).status == "completed", timeout=30)
    finally:
        running.stop()
    done = q.get(task.id)
    assert done.result == [0, 1, 2, 3] and made == [0, 1, 2, 3] and done.spent == {TOK: 400}
    viewer = svc.http(svc.token("viewer"))
    assert viewer.get("/v1/limits/spend").json()["spend"][0]["units"] == 400
    assert svc.remote(svc.token("viewer")).limit_spend(TOK)[0]["units"] == 400
    [row] = viewer.get("/v1/limits").json()["limits"]
    assert (row["day_used"], row["hour_used"], row["spent_today"]) == (400, 400, 400)
    text = viewer.get("/metrics").text
    assert f'leaseq_limit_window_used{{limit="{TOK}",window="day"}} 400.0' in text
    assert f'leaseq_limit_window_total{{limit="{TOK}",window="hour"}} 500000.0' in text
    assert f'leaseq_limit_spent_today{{limit="{TOK}"}} 400.0' in text
    # and per tenant (the task named no fairness key) and UTC day
    [day] = viewer.get("/v1/limits/spend").json()["spend"]
    assert day["tenants"] == {"": 400}
    assert f'leaseq_limit_spend{{day="{day["day"]}",limit="{TOK}",tenant=""}} 400.0' in text
    assert running.runtime.stats.suspended == 1 and running.runtime.stats.lost == 0
    assert validate_queue(q) == []


def test_bad_budget_input_over_http_is_a_4xx_naming_the_field(svc: Service) -> None:
    admin = svc.http(svc.token("admin"))
    for body, field in (({"kind": "job", "budget": {"tokens": 0}}, "budget"),
                        ({"kind": "job", "budget": {"a b": 5}}, "budget")):
        resp = admin.post("/v1/tasks", json=body)
        assert 400 <= resp.status_code < 500, resp.text
        assert error_of(resp)["field"].startswith(field)
    for body, field in (({"per_minute": 0}, "per_minute"), ({"per_day": -5}, "per_day")):
        resp = admin.put("/v1/limits/k", json=body)
        assert 400 <= resp.status_code < 500 and error_of(resp)["field"] == field, resp.text
    assert svc.q.list_tasks() == [] and svc.q.limits() == []
    worker = svc.remote(svc.token("worker", all_queues=True))
    w = worker.register_worker("remote")
    svc.q.enqueue("job", {})
    [claim] = worker.claim(w)
    for limit_key, units, field in (("a b", 1, "limit_key"), (TOK, -1, "units")):
        try:
            worker.consume(w, claim, "job:consume:0", limit_key, units)
        except leaseq.InvalidInput as exc:
            assert exc.field == field
        else:
            raise AssertionError("a bad consume was accepted")
    assert [e for e in svc.q.effects(claim.task_id)] == []


def test_a_worker_token_consumes_only_under_its_own_live_lease(svc: Service) -> None:
    q = svc.q
    task = q.enqueue("job", {}, budget={TOK: 10})
    mine = svc.remote(svc.token("worker", all_queues=True))
    w = mine.register_worker("mine")
    [claim] = mine.claim(w)
    other = svc.http(svc.token("worker", all_queues=True))
    stolen = other.post(f"/v1/workers/{w.id}/tasks/{task.id}/consume",
                        json={"generation": claim.generation, "key": "k:0", "limit_key": TOK, "units": 5})
    assert stolen.status_code == 403
    answer: dict[str, Any] = mine.consume(w, claim, "k:0", TOK, 5)
    assert answer["state"] == "charged" and answer["spent"] == 5
    stale = svc.http(svc.token("worker", all_queues=True))
    assert stale.post(f"/v1/workers/{w.id}/tasks/{task.id}/consume",
                      json={"generation": claim.generation + 1, "key": "k:1", "limit_key": TOK,
                            "units": 5}).status_code in (403, 409)
    assert q.get(task.id).spent == {TOK: 5}


def _spend_series(text: str) -> dict[tuple[str, str, str], float]:
    """``leaseq_limit_spend``'s series of a scrape: (limit, day, tenant) -> units."""
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "leaseq_limit_spend"]
    series = {(s.labels["limit"], s.labels["day"], s.labels["tenant"]): s.value for s in family.samples}
    assert len(series) == len(family.samples)  # no two series share their labels
    return series


def test_the_spend_series_are_bounded_whatever_the_tenants(svc: Service) -> None:
    """A tenant is a fairness key, chosen by whoever may enqueue: /metrics shows the
    SPEND_TENANTS tenants that settled the most per limit and day, exactly, and sums the rest
    under tenant="(other)" (a tenant of that very name too), so a scrape holds at most
    SPEND_TENANTS + 1 series per limit and day. limit_spend (leaseq limits spend) gives all."""
    q, many = svc.q, SPEND_TENANTS + 10
    yesterday = {f"t{n:03d}": n + 1 for n in range(many)}  # t000 settled 1 unit ... t059 60
    settle_by_tenant(q, TOK, yesterday | {"": 7, OTHER_TENANT: 1000})
    move_spend_back(svc.dsn, 1)
    today = {"acme": 5, "globex": 3}
    settle_by_tenant(q, TOK, today)
    settle_by_tenant(q, "calls", {f"c{n:03d}": 2 for n in range(many)})  # ties: by name
    day0, day1 = str(q.now().date()), str(q.now().date() - timedelta(days=1))
    series = _spend_series(svc.http(svc.token("viewer")).get("/metrics").text)

    old = {t: v for (k, d, t), v in series.items() if (k, d) == (TOK, day1)}
    ranked = sorted(yesterday.items(), key=lambda kv: -kv[1])  # the empty tenant's 7 is folded too
    assert len(old) == SPEND_TENANTS + 1
    assert {t: v for t, v in old.items() if t != OTHER_TENANT} == dict(ranked[:SPEND_TENANTS])
    folded = sum(v for _, v in ranked[SPEND_TENANTS:]) + 7 + 1000
    assert old[OTHER_TENANT] == folded
    assert sum(old.values()) == sum(yesterday.values()) + 7 + 1000  # nothing lost
    assert {t: v for (k, d, t), v in series.items() if (k, d) == (TOK, day0)} == today  # nothing to fold
    calls = {t: v for (k, d, t), v in series.items() if k == "calls"}
    assert set(calls) == {f"c{n:03d}" for n in range(SPEND_TENANTS)} | {OTHER_TENANT}
    assert calls[OTHER_TENANT] == 2 * 10
    assert len(series) == 2 * (SPEND_TENANTS + 1) + 2

    # the API and leaseq limits spend are not capped (bounded by the days asked)
    spend = {(r["key"], r["day"]): r["tenants"] for r in q.limit_spend(days=2)}
    assert len(spend[(TOK, day1)]) == many + 2 and len(spend[("calls", day0)]) == many
    [remote] = svc.remote(svc.token("viewer")).limit_spend(TOK, days=2)[1:]
    assert remote["tenants"] == yesterday | {"": 7, OTHER_TENANT: 1000}
