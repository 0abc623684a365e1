"""The role matrix: each role can do what it should and nothing more.

The matrix is derived from the action table (``leaseq.authz.ACTIONS``): every
action must have a case here, the roles expected to succeed are the table's,
and the operator actions' cases are built from the table too, so a new action
is covered (or fails this file) automatically.

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
from leaseq import auth, authz

from .conftest import Service, serve
from .support import error_of, snapshot

ROLES = ("worker", "viewer", "operator", "admin")
Call = Callable[[httpx.Client], Any]


def _task_in(q: leaseq.Queue, status: str) -> int:
    """A side-effect task left in ``status`` (queued, needs_reconciliation, blocked or dead) by a direct worker."""
    queue = f"setup-{secrets.token_hex(4)}"  # its own queue, so the claim takes this very task
    t = q.enqueue("job", {"secret": "s3cr3t"}, effect="side_effect", queue=queue,
                  approval="required" if status == "awaiting_approval" else None)
    if status in ("queued", "awaiting_approval"):
        return t.id
    w = q.register_worker("setup")
    [c] = q.claim(w, queue=queue)
    if status == "needs_reconciliation":
        q.begin_effect(w, c, "email.send")
        q.release(w, c, "setup")
    else:
        q.fail(w, c, "credential expired", block=status == "blocked", retry=status != "dead")
    assert q.get(t.id).status == status, [(e.type, e.detail) for e in q.events(t.id)]
    return t.id


def _operator_case(q: leaseq.Queue, spec: authz.Action) -> Call:
    """A valid request for an operator action, built from its table entry."""
    def call(c: httpx.Client) -> Any:
        target = {"task": lambda: str(_task_in(q, spec.statuses[0])), "queue": lambda: "spare",
                  "worker": lambda: q.register_worker("victim").id}[spec.target or ""]()
        # an approval names the digest of the very task it approves
        body = {f.name: (f.choices[0][0] if f.choices else q.approval(int(target)).digest if f.name == "digest"
                         else "checked the outside world") for f in spec.fields if f.required}
        if spec.target == "queue":
            body["create"] = True  # "spare" has had no task

        path = "/v1" + spec.route.replace("{task_id}", target).replace("{name}", target).replace(
            "{worker_id}", target)
        return c.post(path, json=body) if body else c.post(path)

    return call


def _cases(svc: Service, worker_id: str) -> dict[str, list[Call]]:
    """action name -> requests that need it (each sets up its own state)."""
    q = svc.q

    def fresh() -> int:
        return q.enqueue("job", {"secret": "s3cr3t"}).id

    def lease() -> leaseq.Claim:  # a lease of the worker token's own worker, taken directly
        queue = f"lease-{secrets.token_hex(4)}"
        q.enqueue("job", effect="side_effect", queue=queue)
        [c] = q.claim(worker_id, queue=queue)
        return c

    def on_lease(verb: str, body: Callable[[int, int], dict[str, Any]]) -> Call:
        def call(c: httpx.Client) -> Any:
            lc = lease()
            return c.post(f"/v1/workers/{worker_id}/tasks/{lc.task_id}/{verb}", json=body(lc.task_id, lc.generation))
        return call

    def asked() -> int:  # a task whose handler asked a question (ctx.ask) and waits for the answer
        queue = f"ask-{secrets.token_hex(4)}"
        task = q.enqueue("job", queue=queue)
        w = q.register_worker("asker")
        [c] = q.claim(w, queue=queue)
        q.wait_signal(w, c, f"ask-{task.id}:ask:0", "leaseq.answer",
                      ask={"question": "go ahead?", "schema": {"type": "boolean"}})
        return task.id

    def open_effect(c: httpx.Client) -> Any:
        lc = lease()
        fx = q.begin_effect(worker_id, lc, "email.send")
        return c.post(f"/v1/workers/{worker_id}/tasks/{lc.task_id}/effects/{fx.id}/response",
                      json={"generation": lc.generation, "response": {"ok": 1}})

    cases: dict[str, list[Call]] = {
        "register_worker": [lambda c: c.post("/v1/workers", json={"name": "w"})],
        "claim": [lambda c: c.post(f"/v1/workers/{worker_id}/claim", json={"queue": "none"})],
        "renew": [lambda c: c.post(f"/v1/workers/{worker_id}/renew", json={"leases": []})],
        "complete": [on_lease("complete", lambda t, g: {"generation": g})],
        "fail": [on_lease("fail", lambda t, g: {"generation": g, "error": "boom"})],
        "release": [on_lease("release", lambda t, g: {"generation": g})],
        "begin_effect": [on_lease("effects", lambda t, g: {"generation": g, "action": "email.send"})],
        "finish_effect": [open_effect],
        "report_loss": [on_lease("loss", lambda t, g: {"generation": g, "reason": "heartbeat refused"})],
        "intend": [on_lease("intents", lambda t, g: {"generation": g, "kind": "child", "key": f"k-{t}",
                                                     "approval": "required"})],
        "enqueue": [lambda c: c.post("/v1/tasks", json={"kind": "job"}),
                    lambda c: c.post("/v1/tasks/batch", json={"kind": "job", "payloads": [1, 2]})],
        "whoami": [lambda c: c.get("/v1/whoami")],
        "read": [lambda c: c.get("/v1/workers"), lambda c: c.get("/metrics"), lambda c: c.get("/v1/limits"),
                 lambda c: c.get("/v1/limits/spend")],
        "read_queues": [lambda c: c.get("/v1/tasks"), lambda c: c.get("/v1/queues"),
                        lambda c: c.get("/v1/approvals"), lambda c: c.get("/v1/asks")],
        "read_trail": [lambda c: c.get(f"/v1/tasks/{fresh()}/events"),
                       lambda c: c.get(f"/v1/tasks/{fresh()}/effects"),
                       lambda c: c.get(f"/v1/tasks/{fresh()}/timeline"),
                       lambda c: c.get(f"/v1/tasks/{q.enqueue('job', approval='required').id}/approval")],
        # a task no worker of the calling token ever held (see test_worker_tokens_read_only_their_own_tasks)
        "read_task": [lambda c: c.get(f"/v1/tasks/{fresh()}"),
                      lambda c: c.get(f"/v1/tasks/{fresh()}/stream", params={"follow": "false"})],
        "list_tokens": [lambda c: c.get("/v1/tokens")],
        "create_token": [lambda c: c.post("/v1/tokens", json={"name": "x", "role": "viewer"})],
        "revoke_token": [lambda c: c.delete(
            f"/v1/tokens/{auth.create_token(q, name='spare', role='viewer')[1]['id']}")],
        "prune": [lambda c: c.post("/v1/prune", json={"older_than_seconds": 86400})],
        "read_audit": [lambda c: c.get("/v1/audit")],
        "set_limit": [lambda c: c.put(f"/v1/limits/k-{secrets.token_hex(4)}", json={"max_running": 2})],
        "delete_limit": [lambda c: c.delete(f"/v1/limits/{q.set_limit(f'k-{secrets.token_hex(4)}', max_running=1)['key']}")],
    }
    for spec in authz.operator_actions():
        cases[spec.name] = [_operator_case(q, spec)]
    def wait_for_child(c: httpx.Client) -> Any:
        lc = lease()
        child = q.spawn(worker_id, lc, "child", key="child")
        return c.post(f"/v1/workers/{worker_id}/tasks/{lc.task_id}/children-wait",
                      json={"generation": lc.generation, "key": f"roles-{lc.task_id}:children:0",
                            "children": [child.id]})

    cases.update({
        "wait": [on_lease("sleep", lambda t, g: {"generation": g, "key": f"roles-{t}:sleep:0", "seconds": 60}),
                 wait_for_child],
        "spawn": [on_lease("children", lambda t, g: {"generation": g, "kind": "child", "key": f"k-{t}"})],
        "emit": [on_lease("stream", lambda t, g: {"generation": g, "item": {"progress": 1}})],
        "consume": [on_lease("consume", lambda t, g: {"generation": g, "key": f"roles-{t}:consume:tokens:0",
                                                      "limit_key": "tokens", "units": 10})],
        "signal": [lambda c: c.post(f"/v1/tasks/{fresh()}/signals/go", json={"payload": 1})],
        "read_signals": [lambda c: c.get(f"/v1/tasks/{fresh()}/signals")],
        "answer": [lambda c: c.post(f"/v1/tasks/{asked()}/answer", json={"answer": True})],
        "redrive": [lambda c: c.post("/v1/tasks/redrive", json={"queue": "nothing-here", "dry_run": True})],
        "cancel_where": [lambda c: c.post("/v1/tasks/cancel-where",
                                          json={"status": "queued", "queue": "nothing-here", "dry_run": True})],
    })
    return cases


def test_role_matrix(svc: Service) -> None:
    tokens = {role: svc.token(role, all_queues=True) for role in ROLES}
    clients = {role: svc.http(tokens[role]) for role in ROLES}
    worker_id = clients["worker"].post("/v1/workers", json={"name": "own"}).json()["id"]
    cases = _cases(svc, worker_id)
    assert set(cases) == set(authz.ACTIONS), "every action in the table needs a case here"
    wrong: list[str] = []
    for name, calls in cases.items():
        allowed = authz.ACTIONS[name].roles
        for i, call in enumerate(calls):
            for role in ROLES:
                resp = call(clients[role])
                if role in allowed and resp.status_code not in (200, 201, 202):
                    wrong.append(f"{role} {name}[{i}]: expected success, got {resp.status_code} {resp.text[:200]}")
                if role not in allowed and (resp.status_code != 403 or error_of(resp)["code"] != "forbidden"):
                    wrong.append(f"{role} {name}[{i}]: expected 403 forbidden, got {resp.status_code} "
                                 f"{resp.text[:200]}")
    assert wrong == []
    # The matrix is not vacuous: each role is refused something and allowed something.
    for role in ROLES:
        assert any(role in a.roles for a in authz.ACTIONS.values() if a.right is not None), role
        assert any(role not in a.roles for a in authz.ACTIONS.values()), role
    # Every operator and admin action above is in the audit log with the actor's identity...
    actions = {(e["action"], e["actor"].split(" ")[0]) for e in auth.audit_log(svc.q, 10_000)}
    for spec in authz.operator_actions():
        assert {(spec.name, "operator-test"), (spec.name, "admin-test")} <= actions, spec.name
        assert not {(spec.name, "viewer-test"), (spec.name, "worker-test")} & actions, spec.name
    for action in ("token_created", "token_revoked", "prune"):
        assert (action, "admin-test") in actions and (action, "operator-test") not in actions, action
    # ...and task actions are in the task's own evidence trail too.
    cancelled = svc.q.list_tasks(status="cancelled")
    assert {e.detail["by"].split(" ")[0] for t in cancelled for e in svc.q.events(t.id) if e.type == "cancelled"} \
        == {"operator-test", "admin-test"}


def test_viewer_sees_payloads_and_errors_only_when_granted(svc: Service) -> None:
    task_id = _task_in(svc.q, "dead")
    plain = svc.http(svc.token("viewer")).get(f"/v1/tasks/{task_id}").json()
    assert plain["payload"] == "[redacted]" and plain["last_error"] == "[redacted]"
    events = svc.http(svc.token("viewer")).get(f"/v1/tasks/{task_id}/events").json()["events"]
    assert all(e["detail"].get("error") in (None, "[redacted]") for e in events)
    assert any(e["detail"].get("error") == "[redacted]" for e in events)
    granted = svc.http(svc.token("viewer", read_payloads=True)).get(f"/v1/tasks/{task_id}").json()
    assert granted["payload"] == {"secret": "s3cr3t"} and granted["last_error"] == "credential expired"


def test_another_workers_claim_is_refused(svc: Service) -> None:
    t1, t2 = svc.token("worker", "one", all_queues=True), svc.token("worker", "two", all_queues=True)
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
    token = svc.token("worker", all_queues=True)
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
        rq = svc.remote(svc.token("worker", all_queues=True))
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


def test_a_client_refused_by_the_rate_waits_what_it_owes_not_a_whole_second(q: leaseq.Queue, dsn: str) -> None:
    """A 429's ``Retry-After`` header carries whole seconds; the error document's ``retry_after``
    says what the bucket owes to the millisecond. RemoteQueue waits that: at 20 requests a
    second past a burst of one, each refused request comes back 50 ms later, not 1 s."""
    with serve(q, rate_per_second=20, burst=1) as (url, app):
        svc = Service(url, app, q, dsn)
        rq = svc.remote(svc.token("worker", all_queues=True))
        rq.rate_limit_retries = 3
        started = time.monotonic()
        for _ in range(6):
            rq.register_worker("w")
        elapsed = time.monotonic() - started
        assert 5 * 0.04 <= elapsed < 2.0, elapsed  # five waits of about 50 ms (whole seconds: five and more)
