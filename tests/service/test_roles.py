"""The role matrix: each role can do what it should and nothing more.

Run against a real server on both backends. Also: another worker's claim,
expired, revoked, forged and missing tokens, replayed requests, the
dashboard cookie on the API, and per-token rate limiting.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import httpx

import leaseq
from leaseq import auth

from .conftest import Service, serve
from .support import error_of, snapshot

ROLES = ("worker", "viewer", "operator", "admin")


def _side_effect_task(q: leaseq.Queue, end: str) -> int:
    """A task left ``needs_reconciliation``, ``blocked`` or ``dead`` by a direct worker."""
    w = q.register_worker("setup")
    queue = f"setup-{secrets.token_hex(4)}"  # its own queue, so the claim takes this very task
    t = q.enqueue("job", {"secret": "s3cr3t"}, effect="side_effect", queue=queue)
    [c] = q.claim(w, queue=queue)
    if end == "needs_reconciliation":
        q.begin_effect(w, c, "email.send")
        q.release(w, c, "setup")
    else:
        q.fail(w, c, "credential expired", block=end == "blocked", retry=end != "dead")
    assert q.get(t.id).status == end, [(e.type, e.detail) for e in q.events(t.id)]
    return t.id


def _cases(svc: Service, worker_ids: dict[str, str]) -> dict[str, tuple[set[str], Callable[[str, httpx.Client], Any]]]:
    """name -> (roles allowed, call(role, client) -> response). Each call sets up its own state."""
    q = svc.q

    def fresh() -> int:
        return q.enqueue("job", {"secret": "s3cr3t"}).id

    def own_worker(role: str) -> str:  # the worker token's own worker; other roles have none
        return worker_ids["worker"]

    return {
        "register worker": ({"worker"}, lambda r, c: c.post("/v1/workers", json={"name": "w"})),
        "claim": ({"worker"}, lambda r, c: c.post(f"/v1/workers/{own_worker(r)}/claim", json={"queue": "none"})),
        "renew": ({"worker"}, lambda r, c: c.post(f"/v1/workers/{own_worker(r)}/renew", json={"leases": []})),
        "enqueue": ({"worker", "operator", "admin"}, lambda r, c: c.post("/v1/tasks", json={"kind": "job"})),
        "get task": (set(ROLES), lambda r, c: c.get(f"/v1/tasks/{fresh()}")),
        "list tasks": ({"viewer", "operator", "admin"}, lambda r, c: c.get("/v1/tasks")),
        "events": ({"viewer", "operator", "admin"}, lambda r, c: c.get(f"/v1/tasks/{fresh()}/events")),
        "effects": ({"viewer", "operator", "admin"}, lambda r, c: c.get(f"/v1/tasks/{fresh()}/effects")),
        "timeline": ({"viewer", "operator", "admin"}, lambda r, c: c.get(f"/v1/tasks/{fresh()}/timeline")),
        "queues": ({"viewer", "operator", "admin"}, lambda r, c: c.get("/v1/queues")),
        "workers": ({"viewer", "operator", "admin"}, lambda r, c: c.get("/v1/workers")),
        "metrics": ({"viewer", "operator", "admin"}, lambda r, c: c.get("/metrics")),
        "cancel": ({"operator", "admin"}, lambda r, c: c.post(f"/v1/tasks/{fresh()}/cancel", json={"reason": "r"})),
        "reconcile": ({"operator", "admin"}, lambda r, c: c.post(
            f"/v1/tasks/{_side_effect_task(q, 'needs_reconciliation')}/reconcile",
            json={"outcome": "requeue", "note": "checked the mailbox: not sent"})),
        "unblock": ({"operator", "admin"}, lambda r, c: c.post(
            f"/v1/tasks/{_side_effect_task(q, 'blocked')}/unblock", json={"note": "key rotated"})),
        "requeue": ({"operator", "admin"}, lambda r, c: c.post(
            f"/v1/tasks/{_side_effect_task(q, 'dead')}/requeue", json={"note": "fixed"})),
        "pause": ({"operator", "admin"}, lambda r, c: c.post("/v1/queues/spare/pause")),
        "resume": ({"operator", "admin"}, lambda r, c: c.post("/v1/queues/spare/resume")),
        "revoke worker": ({"operator", "admin"}, lambda r, c: c.post(
            f"/v1/workers/{q.register_worker('victim').id}/revoke")),
        "list tokens": ({"admin"}, lambda r, c: c.get("/v1/tokens")),
        "create token": ({"admin"}, lambda r, c: c.post("/v1/tokens", json={"name": "x", "role": "viewer"})),
        "revoke token": ({"admin"}, lambda r, c: c.delete(
            f"/v1/tokens/{auth.create_token(q, name='spare', role='viewer')[1]['id']}")),
        "prune": ({"admin"}, lambda r, c: c.post("/v1/prune", json={"older_than_seconds": 86400})),
        "audit": ({"admin"}, lambda r, c: c.get("/v1/audit")),
    }


def test_role_matrix(svc: Service) -> None:
    tokens = {role: svc.token(role) for role in ROLES}
    clients = {role: svc.http(tokens[role]) for role in ROLES}
    worker_ids = {"worker": clients["worker"].post("/v1/workers", json={"name": "own"}).json()["id"]}
    wrong: list[str] = []
    for name, (allowed, call) in _cases(svc, worker_ids).items():
        for role in ROLES:
            resp = call(role, clients[role])
            if role in allowed and resp.status_code not in (200, 201):
                wrong.append(f"{role} {name}: expected success, got {resp.status_code} {resp.text[:200]}")
            if role not in allowed and (resp.status_code != 403 or error_of(resp)["code"] != "forbidden"):
                wrong.append(f"{role} {name}: expected 403 forbidden, got {resp.status_code} {resp.text[:200]}")
    assert wrong == []
    # Every operator and admin action above is in the audit log with the actor's identity...
    actions = {(e["action"], e["actor"].split(" ")[0]) for e in auth.audit_log(svc.q, 1000)}
    for action in ("cancel", "reconcile", "unblock", "requeue", "pause", "resume", "revoke_worker"):
        assert {(action, "operator-test"), (action, "admin-test")} <= actions, action
    for action in ("token_created", "token_revoked", "prune"):
        assert (action, "admin-test") in actions and (action, "operator-test") not in actions, action
    # ...and task actions are in the task's own evidence trail too.
    cancelled = svc.q.list(status="cancelled")
    assert {e.detail["by"].split(" ")[0] for t in cancelled for e in svc.q.events(t.id) if e.type == "cancelled"} \
        == {"operator-test", "admin-test"}


def test_viewer_sees_payloads_and_errors_only_when_granted(svc: Service) -> None:
    task_id = _side_effect_task(svc.q, "dead")
    plain = svc.http(svc.token("viewer")).get(f"/v1/tasks/{task_id}").json()
    assert plain["payload"] == "[redacted]" and plain["last_error"] == "[redacted]"
    events = svc.http(svc.token("viewer")).get(f"/v1/tasks/{task_id}/events").json()["events"]
    assert all(e["detail"].get("error") in (None, "[redacted]") for e in events)
    assert any(e["detail"].get("error") == "[redacted]" for e in events)
    granted = svc.http(svc.token("viewer", read_payloads=True)).get(f"/v1/tasks/{task_id}").json()
    assert granted["payload"] == {"secret": "s3cr3t"} and granted["last_error"] == "credential expired"


def test_another_workers_claim_is_refused(svc: Service) -> None:
    t1, t2 = svc.token("worker", "one"), svc.token("worker", "two")
    one, two = svc.http(t1), svc.http(t2)
    w1 = one.post("/v1/workers", json={"name": "one"}).json()["id"]
    w2 = two.post("/v1/workers", json={"name": "two"}).json()["id"]
    task = svc.q.enqueue("job")
    [claim] = one.post(f"/v1/workers/{w1}/claim", json={}).json()["claims"]
    before = snapshot(svc.dsn)
    # naming worker one's id with worker two's token: the identity is not two's to use
    for path, body in [(f"/v1/workers/{w1}/tasks/{task.id}/complete", {"generation": 1}),
                       (f"/v1/workers/{w1}/renew", {"leases": [{"task_id": task.id, "generation": 1}]}),
                       (f"/v1/workers/{w1}/claim", {})]:
        resp = two.post(path, json=body)
        assert resp.status_code == 403 and error_of(resp)["code"] == "forbidden", resp.text
    # with its own identity and one's generation: the lease guard refuses it
    resp = two.post(f"/v1/workers/{w2}/tasks/{task.id}/complete", json={"generation": claim["generation"]})
    assert resp.status_code == 409 and error_of(resp)["code"] == "lease_lost"
    resp = two.post(f"/v1/workers/{w2}/tasks/{task.id}/effects", json={"generation": 1, "action": "x"})
    assert resp.status_code == 409 and error_of(resp)["code"] == "lease_lost"
    # an owner named in the body is an unknown field, not an identity
    resp = two.post(f"/v1/workers/{w2}/tasks/{task.id}/complete", json={"generation": 1, "worker_id": w1})
    assert resp.status_code == 422 and error_of(resp)["field"] == "worker_id"
    assert snapshot(svc.dsn) == before


def test_missing_forged_expired_and_revoked_tokens(svc: Service) -> None:
    real = svc.token("operator")
    token_id = real.split("_")[1]
    expiring = svc.token("operator", expires_in=0.3)
    revoked = svc.token("operator")
    auth.revoke_token(svc.q, revoked.split("_")[1], by="test")
    svc.http(real).get("/v1/queues").raise_for_status()
    time.sleep(0.4)  # the expiry must really pass (judged by the database clock)
    before = snapshot(svc.dsn)
    attempts = {
        "missing": {},
        "empty bearer": {"Authorization": "Bearer"},
        "wrong scheme": {"Authorization": f"Basic {real}"},
        "garbage": {"Authorization": "Bearer not-a-token"},
        "unknown id": {"Authorization": f"Bearer lq_{secrets.token_hex(6)}_{secrets.token_hex(32)}"},
        "forged secret": {"Authorization": f"Bearer lq_{token_id}_{secrets.token_hex(32)}"},
        "truncated": {"Authorization": f"Bearer {real[:-1]}"},
        "expired": {"Authorization": f"Bearer {expiring}"},
        "revoked": {"Authorization": f"Bearer {revoked}"},
        "cookie on the API": {"Cookie": f"leaseq_session={real}"},
    }
    for name, headers in attempts.items():
        resp = httpx.post(f"{svc.url}/v1/tasks/1/cancel", json={"reason": "x"}, headers=headers)
        assert resp.status_code == 401, (name, resp.text)
        assert error_of(resp)["code"] == "unauthorized" and resp.headers["www-authenticate"].startswith("Bearer")
    assert "expired" in httpx.get(f"{svc.url}/v1/queues", headers=attempts["expired"]).json()["error"]["message"]
    assert "revoked" in httpx.get(f"{svc.url}/v1/queues", headers=attempts["revoked"]).json()["error"]["message"]
    assert snapshot(svc.dsn) == before


def test_replayed_requests_change_nothing(svc: Service) -> None:
    token = svc.token("worker")
    client = svc.http(token)
    wid = client.post("/v1/workers", json={"name": "w"}).json()["id"]
    first = client.post("/v1/tasks", json={"kind": "job", "idempotency_key": "order-1"})
    [claim] = client.post(f"/v1/workers/{wid}/claim", json={}).json()["claims"]
    complete = client.build_request("POST", f"/v1/workers/{wid}/tasks/{claim['task_id']}/complete",
                                    json={"generation": claim["generation"], "result": {"n": 1}})
    assert client.send(complete).status_code == 200
    before = snapshot(svc.dsn)
    # the captured completion, sent again: the lease it spoke for is gone
    again = client.send(client.build_request(complete.method, complete.url, headers=complete.headers,
                                             content=complete.content))
    assert again.status_code == 409 and error_of(again)["code"] == "lease_lost"
    # the captured enqueue, sent again: the same task, no duplicate
    replay = client.post("/v1/tasks", json={"kind": "job", "idempotency_key": "order-1"})
    assert replay.json()["id"] == first.json()["id"]
    assert snapshot(svc.dsn) == before
    # and once the token is revoked, nothing it sent before can be replayed
    auth.revoke_token(svc.q, token.split("_")[1], by="test")
    revoked = client.send(client.build_request(complete.method, complete.url, headers=complete.headers,
                                               content=complete.content))
    assert revoked.status_code == 401


def test_rate_limit_per_token(q: leaseq.Queue, dsn: str) -> None:
    with serve(q, rate_per_second=0.5, burst=3) as (url, app):
        svc = Service(url, app, q, dsn)
        busy, calm = svc.http(svc.token("viewer")), svc.http(svc.token("viewer"))
        codes = [busy.get("/v1/queues").status_code for _ in range(5)]
        assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]
        resp = busy.get("/v1/queues")
        assert error_of(resp)["code"] == "rate_limited" and int(resp.headers["retry-after"]) >= 1
        assert calm.get("/v1/queues").status_code == 200  # buckets are per token
        # RemoteQueue waits for Retry-After a few times, then raises RateLimited
        rq = svc.remote(svc.token("worker"))
        rq.rate_limit_retries = 0
        for _ in range(3):
            rq.register_worker("w")
        try:
            rq.register_worker("w")
        except auth.RateLimited as exc:
            assert exc.retry_after > 0
        else:
            raise AssertionError("the fourth request within the burst was not limited")
        svc.close()


def test_failed_logins_are_limited_without_refusing_valid_tokens(q: leaseq.Queue, dsn: str) -> None:
    with serve(q, failed_auth_per_second=0.1, failed_auth_burst=3) as (url, app):
        svc = Service(url, app, q, dsn)
        good = svc.token("viewer")
        bad = svc.http(f"lq_{secrets.token_hex(6)}_{secrets.token_hex(32)}")
        assert [bad.get("/v1/queues").status_code for _ in range(4)] == [401, 401, 401, 429]
        # failures are throttled for the address; a valid token from it still gets in
        assert svc.http(good).get("/v1/queues").status_code == 200
        svc.close()
