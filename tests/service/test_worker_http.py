"""Workers over HTTP: RemoteQueue against a real service, under the same guards.

The guard story of the design note, over the wire: A claims, A's lease
expires, B claims a newer generation; every call A makes is refused with
409 ``lease_lost`` (RemoteQueue raises LeaseLost) and changes nothing.
"""

from __future__ import annotations

import threading

import pytest

import leaseq
from leaseq import auth
from conformance.support import run_out

from .support import error_of, snapshot


def test_remote_worker_runs_a_side_effect_task(svc) -> None:
    rq = svc.remote(svc.token("worker", all_queues=True))
    w = rq.register_worker("agent")
    assert w.id.startswith("agent-")
    task = rq.enqueue("send", {"to": "ada"}, effect="side_effect", idempotency_key="welcome-ada")
    assert rq.enqueue("send", {"to": "ada"}, effect="side_effect", idempotency_key="welcome-ada").id == task.id
    [claim] = rq.claim(w, queue="default", limit=5)
    assert (claim.task_id, claim.generation, claim.worker_id) == (task.id, 1, w.id)
    assert claim.task.payload == {"to": "ada"} and claim.task.lease_seconds == 30
    deadline = rq.heartbeat(w, claim)
    assert deadline >= claim.expires_at
    fx = rq.begin_effect(w, claim, "email.send")
    assert (fx.status, fx.generation, fx.idempotency_key) == ("pending", 1, "welcome-ada:email.send")
    done = rq.finish_effect(w, claim, fx, {"message_id": "m-1"})
    assert done.status == "done" and done.response == {"message_id": "m-1"}
    rq.complete(w, claim, {"sent": True})
    stored = svc.q.get(task.id)
    assert (stored.status, stored.result, stored.claim_generation) == ("completed", {"sent": True}, 1)
    assert rq.get(task.id).status == "completed"
    types = [e.type for e in svc.q.events(task.id)]
    assert types == ["enqueued", "claimed", "effect_intent", "effect_response", "completed"]
    assert all(e.worker_id == w.id for e in svc.q.events(task.id)[1:])


def test_replayed_effect_is_returned_not_repeated(svc) -> None:
    rq = svc.remote(svc.token("worker", all_queues=True))
    w = rq.register_worker("agent")
    task = rq.enqueue("send", None, effect="idempotent")
    [c1] = rq.claim(w, lease_seconds=5)
    fx = rq.begin_effect(w, c1, "charge", key="order-9")
    rq.finish_effect(w, c1, fx, {"charged": 10})
    rq.release(w, c1, "worker shutting down")
    [c2] = rq.claim(w)
    assert c2.generation == 2
    again = rq.begin_effect(w, c2, "charge", key="order-9")
    assert again.replayed and again.response == {"charged": 10}
    assert rq.finish_effect(w, c2, again, {"charged": 99}) is again  # nothing sent, nothing written
    rq.complete(w, c2)
    assert [f.response for f in svc.q.effects(task.id)] == [{"charged": 10}]


def test_guard_story_over_http(svc) -> None:
    token_a, token_b = svc.token("worker", "a", all_queues=True), svc.token("worker", "b", all_queues=True)
    a, b = svc.remote(token_a), svc.remote(token_b)
    wa, wb = a.register_worker("a"), b.register_worker("b")
    task = a.enqueue("job", {"n": 1}, effect="idempotent")  # read_only tasks may begin no action
    [ca] = a.claim(wa)
    fx = a.begin_effect(wa, ca, "lookup")
    run_out(svc.q, wa, ca)
    [cb] = b.claim(wb)
    assert (cb.task_id, cb.generation) == (task.id, 2)
    before = snapshot(svc.dsn)

    raw = svc.http(token_a)
    base = f"/v1/workers/{wa.id}/tasks/{task.id}"
    for path, body in [("/complete", {"generation": 1, "result": {"stale": True}}),
                       ("/fail", {"generation": 1, "error": "boom"}),
                       ("/release", {"generation": 1}),
                       ("/effects", {"generation": 1, "action": "email.send"}),
                       (f"/effects/{fx.id}/response", {"generation": 1, "response": {"late": True}})]:
        resp = raw.post(base + path, json=body)
        assert resp.status_code == 409, (path, resp.text)
        err = error_of(resp)
        assert (err["code"], err["task_id"], err["generation"]) == ("lease_lost", task.id, 1)
    renew = raw.post(f"/v1/workers/{wa.id}/renew", json={"leases": [{"task_id": task.id, "generation": 1}]})
    assert renew.status_code == 200 and renew.json() == {"renewed": []}

    for call in (lambda: a.heartbeat(wa, ca), lambda: a.complete(wa, ca, {"stale": True}),
                 lambda: a.fail(wa, ca, "boom"), lambda: a.release(wa, ca, "late"),
                 lambda: a.begin_effect(wa, ca, "email.send"), lambda: a.finish_effect(wa, ca, fx, {"late": 1})):
        with pytest.raises(leaseq.LeaseLost) as info:
            call()
        assert (info.value.task_id, info.value.generation) == (task.id, 1)
    assert snapshot(svc.dsn) == before

    # A cannot borrow B's generation either: the guard checks owner and generation together.
    forged = raw.post(base + "/complete", json={"generation": 2, "result": {"stale": True}})
    assert forged.status_code == 409 and error_of(forged)["code"] == "lease_lost"
    b.complete(wb, cb, {"by": "b"})
    final = svc.q.get(task.id)
    assert (final.status, final.result, final.claim_generation) == ("completed", {"by": "b"}, 2)


def test_revoking_a_token_stops_its_leases_renewing_at_once(svc) -> None:
    token = svc.token("worker", all_queues=True)
    rq = svc.remote(token)
    w = rq.register_worker("doomed")
    rq.enqueue("job")
    [claim] = rq.claim(w)
    assert list(rq.renew_leases(w, [claim])) == [claim.task_id]
    admin = svc.http(svc.token("admin"))
    token_id = token.split("_")[1]
    resp = admin.delete(f"/v1/tokens/{token_id}")
    assert resp.status_code == 200 and resp.json()["revoked_workers"] == [w.id]
    with pytest.raises(auth.Unauthorized):
        rq.renew_leases(w, [claim])
    with pytest.raises(leaseq.UnknownWorker):  # what the worker runtime sees: a revoked identity
        rq.claim(w)
    # The worker itself is revoked in the database: even a direct renewal is refused.
    assert svc.q.renew_leases(w, [claim]) == {}
    entries = auth.audit_log(svc.q)
    assert entries[0]["action"] == "token_revoked" and "admin" in entries[0]["actor"]


def test_a_worker_token_limited_to_queues(svc) -> None:
    rq = svc.remote(svc.token("worker", queues=["mail"]))
    w = rq.register_worker("mailer")
    other = svc.q.enqueue("job", queue="billing")
    with pytest.raises(auth.AccessDenied):
        rq.claim(w, queue="billing")
    with pytest.raises(auth.AccessDenied):
        rq.enqueue("job", queue="billing")
    with pytest.raises(auth.AccessDenied):
        rq.get(other.id)
    mine = rq.enqueue("job", queue="mail")
    assert [c.task_id for c in rq.claim(w, queue="mail")] == [mine.id]
    assert svc.q.get(other.id).status == "queued"


def test_a_release_whose_started_field_is_not_a_boolean_is_refused_and_changes_nothing(svc) -> None:
    """``started`` gives an attempt back: only a JSON boolean may say so (no "false", 0 or null
    read as one), and a refusal names the field and writes nothing."""
    token = svc.token("worker", all_queues=True)
    rq = svc.remote(token)
    w = rq.register_worker("w")
    task = svc.q.enqueue("job", max_attempts=1)
    [claim] = rq.claim(w)
    before = snapshot(svc.dsn)
    raw = svc.http(token)
    path = f"/v1/workers/{w.id}/tasks/{task.id}/release"
    for hostile in ("false", "no", 0, 1, None, [], {}):
        resp = raw.post(path, json={"generation": claim.generation, "started": hostile})
        assert resp.status_code == 422, (hostile, resp.text)
        assert "started" in error_of(resp)["message"], resp.text
    assert snapshot(svc.dsn) == before
    back = rq.release(w, claim, "stopping", started=False)
    assert (back.status, back.attempts) == ("queued", 0)


def test_fail_and_release_go_through_the_recovery_policy(svc) -> None:
    rq = svc.remote(svc.token("worker", all_queues=True))
    w = rq.register_worker("w")
    t1 = rq.enqueue("job", effect="side_effect")
    t2 = rq.enqueue("job", max_attempts=1)
    claims = {c.task_id: c for c in rq.claim(w, limit=2)}
    rq.begin_effect(w, claims[t1.id], "crm.update")
    released = rq.release(w, claims[t1.id], "shutting down")
    assert released.status == "needs_reconciliation"
    failed = rq.fail(w, claims[t2.id], "ValueError: nope")
    assert failed.status == "dead" and failed.last_error == "ValueError: nope"
    with pytest.raises(leaseq.InvalidTransition, match="ended by its holder"):
        rq.report_loss(w, claims[t1.id], "worker saw: heartbeat refused")  # released, not lost
    assert "lease_lost" not in [e.type for e in svc.q.events(t1.id)]


def test_paused_queue_refuses_new_effects_over_http(svc) -> None:
    rq = svc.remote(svc.token("worker", all_queues=True))
    w = rq.register_worker("w")
    rq.enqueue("job", effect="side_effect")
    [claim] = rq.claim(w)
    svc.http(svc.token("operator")).post("/v1/queues/default/pause").raise_for_status()
    with pytest.raises(leaseq.QueuePaused):
        rq.begin_effect(w, claim, "email.send")
    assert rq.claim(w) == []


def test_undeclared_actions_are_refused_over_http(svc) -> None:
    token = svc.token("worker", all_queues=True)
    rq, raw = svc.remote(token), svc.http(token)
    w = rq.register_worker("w")
    declared = svc.q.enqueue("job", effect="side_effect", actions=["orders.pay"], resources=["order:1"])
    svc.q.enqueue("job", effect="read_only")
    [claim] = rq.claim(w, lease_seconds=30)
    assert claim.task_id == declared.id
    resp = raw.post(f"/v1/workers/{w.id}/tasks/{declared.id}/effects",
                    json={"generation": claim.generation, "action": "orders.refund"})
    assert resp.status_code == 422 and error_of(resp)["code"] == "invalid", resp.text
    assert "orders.refund" in error_of(resp)["message"]
    with pytest.raises(leaseq.InvalidInput, match="orders.refund"):
        rq.begin_effect(w, claim, "orders.refund")
    assert svc.q.effects(declared.id) == []
    fx = rq.begin_effect(w, claim, "orders.pay", resource="order:1")
    assert fx.action == "orders.pay" and [e.action for e in svc.q.effects(declared.id)] == ["orders.pay"]
    [claim_ro] = rq.claim(w, lease_seconds=30)
    with pytest.raises(leaseq.InvalidInput, match="read_only"):
        rq.begin_effect(w, claim_ro, "orders.pay")


def test_worker_runtime_runs_real_tasks_through_the_service(svc) -> None:
    app = leaseq.App(queue=svc.q)
    seen: list[int] = []
    lock = threading.Lock()

    @app.task("square", effect="side_effect", lease_seconds=5)
    def square(ctx, n: int) -> dict:
        with ctx.effect("ledger.write", key=f"sq-{n}") as fx:
            fx.record({"n": n})
        with lock:
            seen.append(n)
        return {"square": n * n}

    tasks = [square.enqueue(n=n) for n in range(6)]
    rq = svc.remote(svc.token("worker", all_queues=True))
    stats = app.run_worker(transport=rq, until_idle=True, install_signals=False, concurrency=3, name="remote")
    assert stats.completed == 6 and sorted(seen) == list(range(6))
    for t in tasks:
        done = svc.q.get(t.id)
        assert done.status == "completed" and done.result == {"square": done.payload["n"] ** 2}
        assert [fx.status for fx in svc.q.effects(t.id)] == ["done"]


def test_remote_claim_limited_to_kinds(svc) -> None:
    rq = svc.remote(svc.token("worker", all_queues=True))
    w = rq.register_worker("agent")
    mail = rq.enqueue("mail", {}).id
    other = rq.enqueue("resize", {}).id
    assert [c.task_id for c in rq.claim(w, limit=5, kinds=["mail"])] == [mail]
    assert svc.q.get(other).status == "queued"
    before = snapshot(svc.dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        rq.claim(w, kinds=[""])
    assert info.value.field == "kinds[0]"
    assert snapshot(svc.dsn) == before
