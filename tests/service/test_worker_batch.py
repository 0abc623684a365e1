"""Batched worker calls over HTTP: one request, one transaction, the lease guard per task.

Each batch names many leases; the guard of the direct path decides each one,
a refused lease is reported in ``refused`` and the others go through. Bad
input refuses the whole request with 422 naming the field, and changes
nothing. Every request is one database transaction that also checks the
token (counted here at the store).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

import leaseq

from .support import error_of, snapshot, wait_until


def _worker(svc: Any, name: str = "agent", **options: Any) -> tuple[Any, Any, str]:
    token = svc.token("worker", name=f"{name}-token", all_queues=True, **options)
    rq = svc.remote(token)
    return rq, rq.register_worker(name), token


def _items(claims: list[leaseq.Claim], **extra: Any) -> list[dict[str, Any]]:
    return [{"task_id": c.task_id, "generation": c.generation, **extra} for c in claims]


def _spy_transactions(store: Any, monkeypatch: Any) -> tuple[list[str], list[str]]:
    """The threads the store's blocking and (where it has them) asyncio transactions open in,
    two lists filled as the service serves requests."""
    blocking: list[str] = []
    asyncio_side: list[str] = []
    real, areal = store.transaction, getattr(store, "atransaction", None)

    def spied(*args: Any, **kwargs: Any) -> Any:
        name = threading.current_thread().name
        if name != "leaseq-maintenance-runner":  # the service's own sweeps, in their thread, not a request's
            blocking.append(name)
        return real(*args, **kwargs)

    def aspied(*args: Any, **kwargs: Any) -> Any:
        asyncio_side.append(threading.current_thread().name)
        return areal(*args, **kwargs)

    monkeypatch.setattr(store, "transaction", spied)
    if store.capabilities.native_async:
        monkeypatch.setattr(store, "atransaction", aspied)
    return blocking, asyncio_side


def test_complete_many_completes_the_held_and_reports_the_refused(svc) -> None:
    rq, w, token = _worker(svc)
    other_rq, other, _ = _worker(svc, "other")
    ids = [svc.q.enqueue("job", {"n": i}).id for i in range(5)]
    mine = rq.claim(w, limit=3)
    [theirs] = other_rq.claim(other, limit=1)
    held, stale = mine[:2], mine[2]
    svc.q.cancel(stale.task_id, "operator stopped it")  # its lease ends: the guard refuses it
    body = {"tasks": [*_items(held, result={"ok": 1}),
                      {"task_id": stale.task_id, "generation": stale.generation, "result": "late"},
                      {"task_id": theirs.task_id, "generation": theirs.generation},  # another worker's lease
                      {"task_id": held[0].task_id + 1000, "generation": 1}]}  # no such task
    with svc.http(token) as http:
        resp = http.post(f"/v1/workers/{w.id}/complete", json=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert data["completed"] == sorted(c.task_id for c in held)
    assert [(r["task_id"], r["code"]) for r in data["refused"]] == [
        (stale.task_id, "lease_lost"), (theirs.task_id, "lease_lost"), (held[0].task_id + 1000, "lease_lost")]
    assert [svc.q.get(i).status for i in ids[:2]] == ["completed", "completed"]
    assert svc.q.get(stale.task_id).status == "cancelled" and svc.q.get(stale.task_id).result is None
    assert svc.q.get(theirs.task_id).status == "running"  # untouched: still the other worker's
    assert svc.q.get(held[0].task_id).result == {"ok": 1}


def test_complete_many_with_a_wrong_generation_changes_nothing_for_that_task(svc) -> None:
    rq, w, _ = _worker(svc)
    svc.q.enqueue("job", {}, lease_seconds=60)
    [old] = rq.claim(w, lease_seconds=0.3)  # a claim may ask for less than the task's lease, never more
    wait_until(svc.q, old.expires_at)
    [new] = rq.claim(w)  # the same worker, a newer generation (held through the test)
    assert new.generation == old.generation + 1
    assert rq.complete_many(w, [(old, "stale")]) == set()
    assert svc.q.get(new.task_id).status == "running"
    assert rq.complete_many(w, [(new, "fresh")]) == {new.task_id}
    assert svc.q.get(new.task_id).result == "fresh"


def test_fail_many_ends_the_held_attempts_and_reports_the_refused(svc) -> None:
    rq, w, _ = _worker(svc)
    other_rq, other, _ = _worker(svc, "other")
    for i in range(4):
        svc.q.enqueue("job", {"n": i}, max_attempts=3)
    a, b, c = rq.claim(w, limit=3)
    [theirs] = other_rq.claim(other)
    failed = rq.fail_many(w, [(a, "boom"), (b, "boom")], retry=False)
    assert set(failed) == {a.task_id, b.task_id} and {t.status for t in failed.values()} == {"dead"}
    stolen = leaseq.Claim(task_id=theirs.task_id, generation=theirs.generation, worker_id=w.id,
                          expires_at=theirs.expires_at, task=theirs.task)
    assert rq.fail_many(w, [(c, "retry me"), (stolen, "not mine")]) .keys() == {c.task_id}
    assert svc.q.get(c.task_id).status == "queued" and svc.q.get(c.task_id).last_error == "retry me"
    assert svc.q.get(theirs.task_id).status == "running" and svc.q.get(theirs.task_id).last_error is None
    assert rq.fail_many(w, [(a, "again")]) == {}  # already ended: refused, nothing written
    assert svc.q.get(a.task_id).last_error == "boom"


@pytest.mark.parametrize("route", ["complete", "fail", "renew", "end"])
def test_hostile_batches_are_refused_whole_and_change_nothing(svc, route: str) -> None:
    rq, w, token = _worker(svc)
    for i in range(3):
        svc.q.enqueue("job", {"n": i})
    claims = rq.claim(w, limit=3)
    key = {"renew": "leases", "end": "attempts"}.get(route, "tasks")
    extra: dict[str, Any] = {"fail": {"error": "x"}, "end": {"outcome": "complete"}}.get(route, {})
    limit = 10_000 if route == "renew" else 1000
    one = {"task_id": claims[0].task_id, "generation": claims[0].generation, **extra}
    cases = {
        "oversized": ({key: [one] * (limit + 1)}, key),
        "duplicated": ({key: [*_items(claims, **extra), one]}, f"{key}.3.task_id"),
        "string id": ({key: [{**one, "task_id": "1"}]}, f"{key}.0.task_id"),
        "negative generation": ({key: [{**one, "generation": -1}]}, f"{key}.0.generation"),
        "unknown field": ({key: [{**one, "holder": "me"}]}, f"{key}.0.holder"),
        "not a list": ({key: {"task_id": 1}}, key),
    }
    if route == "fail":
        cases["empty error"] = ({key: [{**one, "error": ""}]}, f"{key}.0.error")
        cases["negative delay"] = ({key: [{**one, "delay": -1.0}]}, f"{key}.0.delay")
    if route == "end":  # the first attempt fine, a later one not: neither ends
        good = {**one, "task_id": claims[1].task_id, "generation": claims[1].generation}
        cases["unknown outcome"] = ({key: [{**one, "outcome": "vanish"}]}, f"{key}.0.outcome")
        cases["another outcome's field"] = ({key: [good, {**one, "error": "x"}]}, f"{key}.1.error")
        cases["fail without an error"] = ({key: [good, {**one, "outcome": "fail"}]}, f"{key}.1.error")
        cases["empty reason"] = ({key: [good, {**one, "outcome": "release", "reason": " "}]}, f"{key}.1.reason")
        cases["negative after"] = ({key: [good, {**one, "outcome": "retry", "after": -1}]}, f"{key}.1.after")
        cases["started not a boolean"] = ({key: [good, {**one, "outcome": "release", "started": "no"}]},
                                          f"{key}.1.started")
    before = snapshot(svc.dsn)
    with svc.http(token) as http:
        for name, (body, field) in cases.items():
            resp = http.post(f"/v1/workers/{w.id}/{route}", json=body)
            assert resp.status_code == 422, (name, resp.status_code, resp.text[:300])
            assert error_of(resp)["field"] == field, (name, resp.json())
    assert snapshot(svc.dsn) == before


def test_end_ends_each_attempt_its_own_way_and_reports_the_refused(svc) -> None:
    """``POST /v1/workers/{id}/end``: one request ends attempts as completed, failed,
    retried and released (the engine's one end_attempts); a refused lease is reported
    in ``refused`` and the others go through."""
    rq, w, token = _worker(svc)
    other_rq, other, _ = _worker(svc, "other")
    ids = [svc.q.enqueue("job", {"n": i}, max_attempts=3).id for i in range(6)]
    done, failed, retried, released, stale = rq.claim(w, limit=5)
    [theirs] = other_rq.claim(other)
    svc.q.cancel(stale.task_id, "operator stopped it")
    body = {"attempts": [
        {**_items([done])[0], "outcome": "complete", "result": {"ok": True}},
        {**_items([failed])[0], "outcome": "fail", "error": "boom"},  # the queue's backoff
        {**_items([retried])[0], "outcome": "retry", "after": 30, "reason": "rate limited"},
        {**_items([released])[0], "outcome": "release", "started": False},
        {**_items([stale])[0], "outcome": "complete"},
        {**_items([theirs])[0], "outcome": "fail", "error": "not mine"}]}
    with svc.http(token) as http:
        resp = http.post(f"/v1/workers/{w.id}/end", json=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert [(e["task_id"], e["outcome"]) for e in data["ended"]] == [
        (done.task_id, "complete"), (failed.task_id, "fail"), (retried.task_id, "retry"),
        (released.task_id, "release")]
    assert data["ended"][0]["task"] is None
    assert [e["task"]["status"] for e in data["ended"][1:]] == ["queued", "queued", "queued"]
    assert [(r["task_id"], r["code"], r["reason"]) for r in data["refused"]] == [
        (stale.task_id, "lease_lost", "complete refused: lease no longer held"),
        (theirs.task_id, "lease_lost", "fail refused: lease no longer held")]
    assert svc.q.get(done.task_id).result == {"ok": True} and svc.q.get(done.task_id).status == "completed"
    f = svc.q.get(failed.task_id)
    assert f.last_error == "boom" and 0.5 - 1e-5 <= (f.available_at - f.updated_at).total_seconds() <= 1 + 1e-5
    assert svc.q.get(retried.task_id).snoozes == 1 and svc.q.get(retried.task_id).attempts == 0
    [event] = [e for e in svc.q.events(released.task_id) if e.type == "lease_released"]
    assert event.detail["reason"] == "released" and event.detail["started"] is False
    assert svc.q.get(stale.task_id).status == "cancelled"
    assert svc.q.get(theirs.task_id).status == "running" and svc.q.get(theirs.task_id).last_error is None
    assert len(ids) == 6


def test_batches_for_a_worker_of_another_token_are_forbidden(svc) -> None:
    rq, w, _ = _worker(svc)
    _, _, intruder = _worker(svc, "intruder")
    svc.q.enqueue("job", {})
    [claim] = rq.claim(w)
    before = snapshot(svc.dsn)
    with svc.http(intruder) as http:
        for route, key in (("complete", "tasks"), ("fail", "tasks"), ("renew", "leases"), ("claim", None),
                           ("end", "attempts")):
            extra = {"fail": {"error": "x"}, "end": {"outcome": "release"}}.get(route, {})
            body = {"queue": "default"} if key is None else {key: _items([claim], **extra)}
            resp = http.post(f"/v1/workers/{w.id}/{route}", json=body)
            assert resp.status_code == 403 and error_of(resp)["code"] == "forbidden", (route, resp.text)
    with svc.http("lq_000000000000_" + "0" * 64) as http:
        resp = http.post(f"/v1/workers/{w.id}/complete", json={"tasks": _items([claim])})
        assert resp.status_code == 401
    assert snapshot(svc.dsn) == before


def test_each_worker_request_is_one_transaction_with_the_token_check(svc, monkeypatch) -> None:
    rq, w, _ = _worker(svc)
    for i in range(4):
        svc.q.enqueue("job", {"n": i})
    store = svc.q.store
    opened = Counter()

    def counting(real: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            opened[threading.current_thread().name] += 1
            return real(*args, **kwargs)
        return counted

    # PostgreSQL serves claims and completions on the event loop (atransaction), SQLite in threads
    monkeypatch.setattr(store, "transaction", counting(store.transaction))
    if store.capabilities.native_async:
        monkeypatch.setattr(store, "atransaction", counting(store.atransaction))

    def transactions(call: Any) -> int:
        opened.clear()
        call()
        return sum(opened.values())

    claims: list[leaseq.Claim] = []
    assert transactions(lambda: claims.extend(rq.claim(w, limit=4))) == 1
    assert len(claims) == 4
    assert transactions(lambda: rq.renew_leases(w, claims)) == 1
    assert transactions(lambda: rq.complete_many(w, [(c, None) for c in claims[:2]])) == 1
    assert transactions(lambda: rq.fail_many(w, [(claims[2], "boom")])) == 1
    assert transactions(lambda: rq.complete(w, claims[3])) == 1
    assert {svc.q.get(c.task_id).status for c in claims} == {"completed", "queued"}


def test_every_lease_guarded_call_of_one_task_is_one_transaction_with_the_token_check(svc, monkeypatch) -> None:
    """The calls a handler makes while it runs (its tool calls, intents, the end of its
    attempt) are one transaction each with the token check, as the batched calls are; on
    PostgreSQL on the service's event loop, never in a thread (before, a tool call's token
    was checked in one transaction and its ledger entry written in another, each in a thread)."""
    rq, w, _ = _worker(svc, own_intents=True)  # its ungated intent goes to a queue it claims from
    for i in range(5):
        svc.q.enqueue("job", {"n": i}, effect="side_effect", actions=["crm.update", "intend:mail.send"],
                       resources=["crm:1"])
    claims = rq.claim(w, limit=5)
    store = svc.q.store
    blocking, asyncio_side = _spy_transactions(store, monkeypatch)

    def transactions(call: Any) -> tuple[Any, int]:
        blocking.clear()
        asyncio_side.clear()
        value = call()
        if store.capabilities.native_async:
            assert blocking == [], f"a blocking transaction on PostgreSQL, in {blocking}"
        return value, len(blocking) + len(asyncio_side)

    a, b, c, d, e = claims
    effect, n = transactions(lambda: rq.begin_effect(w, a, "crm.update", resource="crm:1"))
    assert n == 1 and effect.status == "pending"
    done, n = transactions(lambda: rq.finish_effect(w, a, effect, {"ok": True}))
    assert n == 1 and done.status == "done"
    child, n = transactions(lambda: rq.intend(w, a, "mail.send", {"to": "x"}, key="mail"))
    assert n == 1 and child.status == "queued"
    assert transactions(lambda: rq.complete(w, a, "done"))[1] == 1
    failed, n = transactions(lambda: rq.fail(w, b, "boom"))
    assert n == 1 and failed.status == "queued"
    retried, n = transactions(lambda: rq.retry(w, c, 30, "rate limited"))
    assert n == 1 and retried.status == "queued"
    released, n = transactions(lambda: rq.release(w, d, "shutting down"))
    assert n == 1 and released.status == "queued"
    assert transactions(lambda: rq.report_loss(w, e, "heartbeat refused"))[1] == 1
    with pytest.raises(leaseq.LeaseLost):  # refused by the guard: one transaction, nothing written
        transactions(lambda: rq.begin_effect(w, b, "crm.update"))
    assert len(blocking) + len(asyncio_side) == 1


def test_a_refused_token_in_the_same_transaction_writes_nothing(svc) -> None:
    from leaseq import auth

    rq, w, token = _worker(svc)
    svc.q.enqueue("job", {})
    [claim] = rq.claim(w)
    auth.revoke_token(svc.q, token.split("_")[1], by="test")
    before = snapshot(svc.dsn)
    with pytest.raises(leaseq.UnknownWorker):
        rq.complete_many(w, [(claim, "late")])
    assert snapshot(svc.dsn) == before


def test_claims_renewals_and_completions_on_postgresql_never_leave_the_event_loop(svc, monkeypatch) -> None:
    """On PostgreSQL the worker API's hot path (claim, renew, complete, complete with a claim) runs
    its transaction on the event loop with the asyncio driver: no blocking transaction, so
    no thread handing the interpreter lock back and forth at every statement."""
    if not svc.q.native_async:
        pytest.skip("SQLite has no asyncio driver: its requests run in threads")
    rq, w, _ = _worker(svc)
    for i in range(6):
        svc.q.enqueue("job", {"n": i})
    store = svc.q.store
    blocking, asyncio_side = _spy_transactions(store, monkeypatch)
    claims = rq.claim(w, limit=2)
    assert set(rq.renew_leases(w, claims)) == {c.task_id for c in claims}
    done, more = rq.complete_and_claim(w, [(c, None) for c in claims], limit=2)
    assert done == {c.task_id for c in claims} and len(more) == 2
    assert rq.complete_many(w, [(c, None) for c in more]) == {c.task_id for c in more}
    [c1, c2] = rq.claim(w, limit=2)
    assert set(rq.fail_many(w, [(c1, "boom")])) == {c1.task_id}
    assert rq.fail(w, c2, "boom").status == "queued"
    # the claims, the renewal, the completions with a claim, the completions, the failures
    assert blocking == [] and len(asyncio_side) == 7
    assert len(set(asyncio_side)) == 1 and "AnyIO" not in asyncio_side[0]  # the server's own loop thread


def test_a_renewal_refused_for_a_revoked_token_is_counted_and_loses_its_leases(svc) -> None:
    """Over HTTP the renewal of a worker whose token was revoked is refused whole
    (UnknownWorker): an answered call like any other, it counts in the worker's renewals
    (what the heartbeat benchmark reads), and the leases it carried are lost."""
    import asyncio
    import logging

    from leaseq.worker.context import TaskContext
    from leaseq.worker.renewer import Renewer

    from leaseq import auth

    rq, w, token = _worker(svc)
    svc.q.enqueue("job", {})
    [claim] = rq.claim(w)
    ctx = TaskContext(rq, w, claim, logging.LoggerAdapter(logging.getLogger("test"), {}))
    counted: list[int] = []
    lost: list[str] = []
    auth.revoke_token(svc.q, token.split("_")[1], by="test")

    async def renew() -> None:
        port = rq.worker_port()
        try:
            await Renewer(port, w, {ctx.key: ctx}, {ctx.key}, lambda c, reason, **_: lost.append(reason),
                          lambda: counted.append(1)).renew_now()
        finally:
            await port.close_async()

    asyncio.run(renew())
    assert counted == [1]
    assert len(lost) == 1 and lost[0].startswith("heartbeat refused: ")


def test_a_claim_routes_a_bounded_number_of_expired_leases_then_answers_and_the_next_goes_on(
        svc, monkeypatch) -> None:
    """A claim over HTTP that finds expired leases routes them a batch per transaction, at
    most ROUTING_PASSES batches, then answers (empty, if it got no further) rather than
    holding the request; the worker's next claim routes the rest and leases tasks."""
    if svc.q.store.dialect != "postgres":
        pytest.skip("SQLite claims whole in one transaction: its claim never stops to route")
    from leaseq import engine
    from leaseq.service import worker_batch
    from pg_modes import own_connection

    monkeypatch.setattr(engine.expiry, "ROUTE_BATCH", 2)
    passes = worker_batch.ROUTING_PASSES
    stalled = svc.q.register_worker("stalled")
    svc.q.enqueue_many("job", [{"n": n} for n in range(2 * passes + 1)], max_attempts=5)
    held = svc.q.claim(stalled, limit=2 * passes + 1)
    assert len(held) == 2 * passes + 1
    with own_connection(svc.dsn) as conn:  # every one of those leases runs out now
        conn.execute("SET LOCAL ROLE leaseq_owner")  # only the owner may move a lease (a trigger)
        conn.execute("UPDATE leaseq_tasks SET lease_expires_at = now() - interval '1 second' "
                     "WHERE status = 'running'")
    rq, w, _ = _worker(svc)

    def expired_routed() -> int:
        return sum(1 for c in held for e in svc.q.events(c.task_id) if e.type == "lease_expired")

    assert rq.claim(w, limit=5) == []  # five batches of two routed, one lease still waiting
    assert expired_routed() == 2 * passes
    claims = rq.claim(w, limit=5)
    assert expired_routed() == 2 * passes + 1 and len(claims) >= 1
