"""Every surface re-checks authority: what a caller may name, read and decide, on both backends.

* A task named in a request is authorized for the caller, dependencies
  included: a queue-limited token may not wait for (``after=``) a task
  outside its queues (refused exactly as a task that does not exist), nor
  read such a task's result through ``dependency-results``.
* Digests of payloads (an approval's digest, a tool call's ``args_digest``)
  and idempotency keys are hidden from tokens without ``read_payloads``; a
  wrong digest is refused without the right one; approving needs
  ``read_payloads``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import socket

import httpx

import leaseq
from leaseq import auth
from leaseq.access import tokens
from leaseq.client import RemoteQueue
from snapshots import snapshot

from .conftest import Service, serve
from .support import dashboard_login, error_of


def _gated(svc: Service, token: str, payload: dict) -> dict:
    resp = svc.http(token).post("/v1/tasks", json={"kind": "payments.refund", "payload": payload,
                                                   "effect": "side_effect", "queue": "payments",
                                                   "approval": "required", "idempotency_key": "refund-73519"})
    assert resp.status_code == 201, resp.text
    return resp.json()


def test_no_digest_or_key_reaches_a_reader_without_payloads(svc: Service) -> None:
    operator, viewer = svc.token("operator", "olga"), svc.token("viewer", "vic")
    task = _gated(svc, svc.token("operator", "asker"), {"customer_id": 73519})
    digest = svc.q.approval(task["id"]).digest
    # a tool call with an args digest, in the action ledger of another task
    tool = svc.q.enqueue("lookup", {"customer_id": 73519}, effect="side_effect", idempotency_key="cust-73519")
    w = svc.q.register_worker("w")
    [claim] = svc.q.claim(w)
    args = hashlib.sha256(json.dumps({"customer_id": 73519}).encode()).hexdigest()
    svc.q.begin_effect(w, claim, "crm.lookup", key="crm-73519", effect="side_effect", args_digest=args)

    seen = [svc.http(viewer).get(path).text for path in (
        "/v1/approvals", f"/v1/tasks/{task['id']}/approval", f"/v1/tasks/{task['id']}",
        f"/v1/tasks/{task['id']}/events", f"/v1/tasks/{task['id']}/timeline", f"/v1/tasks/{tool.id}",
        f"/v1/tasks/{tool.id}/effects", f"/v1/tasks/{tool.id}/events", f"/v1/tasks/{tool.id}/timeline",
        "/v1/tasks")]
    for text in seen:
        for secret in (digest, digest.split(":")[-1], args, "73519"):
            assert secret not in text, (secret, text[:400])
    # a reader of payloads sees them all
    [shown] = svc.http(operator).get("/v1/approvals").json()["approvals"]
    assert shown["digest"] == digest and shown["task"]["idempotency_key"] == "refund-73519"
    [fx] = svc.http(operator).get(f"/v1/tasks/{tool.id}/effects").json()["effects"]
    assert (fx["args_digest"], fx["idempotency_key"]) == (args, "crm-73519")


def test_a_wrong_digest_is_refused_without_the_right_one(svc: Service) -> None:
    olga = svc.token("operator", "olga")
    task = _gated(svc, svc.token("operator", "asker"), {"customer_id": 73519})
    right = svc.q.approval(task["id"]).digest
    wrong = leaseq.approval_digest("payments.refund", {"customer_id": 1}, "payments", effect="side_effect")
    svc.http(olga).get("/v1/whoami")
    before = snapshot(svc.dsn)
    refused = svc.http(olga).post(f"/v1/tasks/{task['id']}/approve", json={"digest": wrong})
    assert refused.status_code == 409 and error_of(refused)["code"] == "approval_mismatch"
    assert right not in refused.text and right.split(":")[-1] not in refused.text
    remote = RemoteQueue(svc.url, token=olga)
    try:
        try:
            remote._call("POST", f"/v1/tasks/{task['id']}/approve", {"digest": wrong})  # the error, decoded
        except leaseq.ApprovalMismatch as exc:
            assert right not in str(exc) and exc.given == wrong
        else:
            raise AssertionError("approved with a wrong digest")
    finally:
        remote.close()
    assert snapshot(svc.dsn) == before


def test_approving_needs_read_payloads(svc: Service) -> None:
    blind = svc.token("operator", "blind", read_payloads=False)
    task = _gated(svc, svc.token("operator", "asker"), {"customer_id": 73519})
    right = svc.q.approval(task["id"]).digest  # even with the right digest, learnt elsewhere
    svc.http(blind).get("/v1/whoami")
    before = snapshot(svc.dsn)
    refused = svc.http(blind).post(f"/v1/tasks/{task['id']}/approve", json={"digest": right})
    assert refused.status_code == 403, refused.text
    assert "read payloads" in error_of(refused)["message"]
    assert "approve" not in svc.http(blind).get("/v1/whoami").json()["actions"]
    assert snapshot(svc.dsn) == before
    denied = svc.http(blind).post(f"/v1/tasks/{task['id']}/deny", json={"reason": "not mine to approve"})
    assert denied.status_code == 200 and denied.json()["status"] == "denied"  # refusing needs no payload


def _completed(q: leaseq.Queue, queue: str, result: object) -> leaseq.Task:
    task = q.enqueue("job", {"n": 1}, queue=queue)
    w = q.register_worker("owner")
    [claim] = q.claim(w, queue=queue)
    q.complete(w, claim, result)
    return task


def test_a_queue_limited_token_may_not_wait_for_a_task_outside_its_queues(svc: Service) -> None:
    victim = _completed(svc.q, "secret", {"customer_id": 73519})
    mine = _completed(svc.q, "mine", {"ok": True})
    scoped = svc.token("worker", "scoped", queues=["mine"])
    client = svc.http(scoped)
    client.get("/v1/whoami")
    missing = victim.id + 1000
    before = snapshot(svc.dsn)
    answers = {}
    for upstream in (victim.id, missing):
        resp = client.post("/v1/tasks", json={"kind": "job", "queue": "mine", "after": [upstream], "no_check": True})
        answers[upstream] = (resp.status_code, error_of(resp)["field"],
                             error_of(resp)["message"].replace(str(upstream), "N"))
    # the same answer for a task it may not name as for one that does not exist
    assert answers[victim.id] == answers[missing] == (422, "after", "after: task N does not exist"), answers
    assert snapshot(svc.dsn) == before  # nothing written
    ok = client.post("/v1/tasks", json={"kind": "job", "queue": "mine", "after": [mine.id], "no_check": True})
    assert ok.status_code == 201, ok.text
    # an unlimited token may still wait for a task on any queue
    anywhere = svc.http(svc.token("worker", "unlimited", all_queues=True)).post(
        "/v1/tasks", json={"kind": "job", "queue": "mine", "after": [victim.id], "no_check": True})
    assert anywhere.status_code == 201, anywhere.text


def test_dependency_results_hold_only_what_the_token_may_read(svc: Service) -> None:
    victim = _completed(svc.q, "secret", {"customer_id": 73519})
    mine = _completed(svc.q, "mine", {"ok": True})
    # an operator made a task on "mine" wait for both (a pipeline across queues)
    waiter = svc.q.enqueue("job", {"n": 2}, queue="mine", after=[victim.id, mine.id])
    scoped = svc.token("worker", "scoped", queues=["mine"])
    with RemoteQueue(svc.url, token=scoped) as remote:
        w = remote.register_worker("scoped-worker")
        [claim] = remote.claim(w, queue="mine")
        assert claim.task.id == waiter.id
        assert remote.dependency_results(waiter.id) == {mine.id: {"ok": True}}
        raw = svc.http(scoped).get(f"/v1/tasks/{waiter.id}/dependency-results")
        assert raw.status_code == 200 and "73519" not in raw.text and str(victim.id) not in raw.text
    unlimited = svc.token("worker", "unlimited", all_queues=True)
    with RemoteQueue(svc.url, token=unlimited) as remote:
        assert svc.http(unlimited).get(f"/v1/tasks/{waiter.id}/dependency-results").status_code == 403  # not held
    assert svc.q.dependency_results(waiter.id) == {victim.id: {"customer_id": 73519}, mine.id: {"ok": True}}


def test_a_flood_of_bogus_tokens_costs_no_lookup_each(q: leaseq.Queue, dsn: str, monkeypatch) -> None:
    """Well-formed bogus tokens (unknown ids, or a real id with a forged secret) are
    refused without a database lookup once they can be told bad without one; a valid
    token keeps getting in."""
    lookups: list[str] = []
    looked_up = tokens._looked_up
    monkeypatch.setattr(tokens, "_looked_up", lambda token: (lookups.append(token), looked_up(token))[1])
    with serve(q, failed_auth_burst=5, failed_auth_per_second=0.01) as (url, app):
        svc = Service(url, app, q, dsn)
        good = svc.token("viewer", "good")
        fresh = svc.token("viewer", "fresh")  # never presented before the flood
        assert svc.http(good).get("/v1/queues").status_code == 200
        good_id = good.split("_")[1]
        forged = [f"lq_{good_id}_{secrets.token_hex(32)}" for _ in range(50)]
        unknown = [f"lq_{secrets.token_hex(6)}_{secrets.token_hex(32)}" for _ in range(100)]
        lookups.clear()
        with httpx.Client(base_url=url, timeout=10) as client:
            codes = [client.get("/v1/queues", headers={"Authorization": f"Bearer {t}"}).status_code
                     for t in forged + unknown]
            worker = [client.post("/v1/workers", json={"name": "w"},
                                  headers={"Authorization": f"Bearer {t}"}).status_code for t in unknown[:20]]
        assert set(codes) <= {401, 429} and codes.count(429) >= 100, codes
        assert set(worker) == {429}, worker  # the worker API's transactions are guarded alike
        # a forged secret for a known id is told bad by its hash; unknown ids are looked up only
        # while the address has failures to spare (the burst of 5), never once per request
        assert not set(lookups) & set(forged) and len(lookups) <= 5, len(lookups)
        # the address is limited now, but a valid token still gets in
        assert svc.http(good).get("/v1/queues").status_code == 200
        assert svc.http(fresh).get("/v1/queues").status_code == 200  # and one never presented before
        svc.close()


def test_session_cookies_are_failure_limited(q: leaseq.Queue, dsn: str, monkeypatch) -> None:
    with serve(q, failed_auth_burst=5, failed_auth_per_second=0.01) as (url, app):
        svc = Service(url, app, q, dsn)
        browser = dashboard_login(url, svc.token("viewer", "vic"))
        assert browser.get("/").status_code == 200
        lookups: list[object] = []
        verify = tokens.verify_session
        monkeypatch.setattr(tokens, "verify_session", lambda q_, sid: (lookups.append(sid), verify(q_, sid))[1])
        codes = []
        with httpx.Client(base_url=url, timeout=10) as client:
            for _ in range(40):
                client.cookies.set("leaseq_session", f"lqs_{secrets.token_urlsafe(32)}")
                codes.append(client.get("/").status_code)
        assert codes[:5] == [303] * 5 and set(codes[5:]) == {429}, codes  # to the login form, then refused
        assert len(lookups) <= 6, len(lookups)  # refused before the lookup once the address has failed
        assert browser.get("/").status_code == 200  # a session verified before still gets in
        browser.close()
        svc.close()


def test_requests_naming_another_host_are_refused(q: leaseq.Queue, dsn: str) -> None:
    """DNS rebinding: a page on evil.example whose name now points at the service sends
    ``Host: evil.example``; the service answers only the names it was given."""
    with serve(q, trusted_hosts=("leaseq.internal.example", "*.svc.example")) as (url, app):
        svc = Service(url, app, q, dsn)
        token = svc.token("viewer", "vic")
        port = url.rsplit(":", 1)[1]
        with httpx.Client(base_url=url, timeout=10, headers={"Authorization": f"Bearer {token}"}) as client:
            for host in ("evil.example", f"evil.example:{port}", "leaseq.internal.example.evil.example",
                         "svc.example", "0x7f.1"):
                assert client.get("/v1/queues", headers={"Host": host}).status_code == 400, host
                assert client.get("/healthz", headers={"Host": host}).status_code == 400, host
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "leaseq.internal.example",
                         f"api.svc.example:{port}"):
                assert client.get("/v1/queues", headers={"Host": host}).status_code == 200, host
        # a load balancer's HTTP/1.0 health check names no host at all (HAProxy's option httpchk):
        # answered, as no browser sends a request without one
        with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as raw:
            raw.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert raw.makefile("rb").readline().split()[1] == b"200"
        svc.close()


def test_serve_refuses_a_malformed_trusted_host(dsn: str) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "leaseq.cli", "--dsn", dsn, "serve", "--port", "0",
                           "--trusted-host", "evil.*.example"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "trusted_hosts" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_dashboard_search_gives_no_hidden_key_away(svc: Service) -> None:
    task = svc.q.enqueue("lookup", {"customer_id": 73519}, idempotency_key="cust-73519")
    viewer = dashboard_login(svc.url, svc.token("viewer", "vic"))
    reader = dashboard_login(svc.url, svc.token("operator", "olga"))
    try:
        refused = viewer.get("/tasks", params={"q": "cust-7"})
        assert refused.status_code == 403 and "cust-73519" not in refused.text and "searches by task id" in refused.text
        by_id = viewer.get("/tasks", params={"q": str(task.id)})
        assert by_id.status_code == 303 and by_id.headers["location"] == f"/tasks/{task.id}"
        listed = viewer.get("/tasks")
        assert listed.status_code == 200 and "cust-73519" not in listed.text
        found = reader.get("/tasks", params={"q": "cust-7"})
        assert found.status_code == 200 and "cust-73519" in found.text
    finally:
        viewer.close()
        reader.close()
