"""Approval gates over HTTP and on the dashboard, on both backends.

Approve and deny are operator actions of the action table: a viewer is
refused, an operator's decision is recorded with its token's identity in the
approval request, the evidence trail and the audit log; a digest other than
the task's is a 409 ``approval_mismatch`` that decides nothing. The
maintenance leader denies requests whose deadline passed. Intents go through
the worker API under the calling task's lease. The approvals inbox is
driven in a real Chromium.
"""

from __future__ import annotations

import re

import pytest

import leaseq
from leaseq import auth
from snapshots import snapshot

from .browser import browser, chromium, login, needs_browser  # noqa: F401  (fixtures)
from .conftest import Service, serve
from .support import error_of


def _enqueue_gated(svc: Service, token: str, payload: dict, **extra: object) -> dict:
    resp = svc.http(token).post("/v1/tasks", json={"kind": "payments.refund", "payload": payload,
                                                   "effect": "side_effect", "queue": "payments",
                                                   "approval": "required", **extra})
    assert resp.status_code == 201, resp.text
    return resp.json()


def test_approve_and_deny_over_http(svc: Service) -> None:
    operator, viewer = svc.token("operator", "olga"), svc.token("viewer", "vic")
    agent = svc.token("worker", "agent-token", all_queues=True)
    task = _enqueue_gated(svc, agent, {"order": 7, "cents": 1250})
    assert task["status"] == "awaiting_approval"

    inbox = svc.http(viewer).get("/v1/approvals").json()["approvals"]
    [req] = inbox
    assert req["task_id"] == task["id"] and req["requested_by"].startswith("agent-token (worker token ")
    # a viewer sees neither the payload nor its (unsalted, so guessable) digest
    assert req["task"]["payload"] == req["digest"] == "[redacted]"
    [shown] = svc.http(operator).get("/v1/approvals").json()["approvals"]
    digest = shown["digest"]
    assert digest == leaseq.approval_digest("payments.refund", {"order": 7, "cents": 1250}, "payments", effect="side_effect")

    svc.http(operator).get("/v1/whoami")  # its first use is recorded (last_used_at) before the snapshot
    before = snapshot(svc.dsn)
    refused = svc.http(viewer).post(f"/v1/tasks/{task['id']}/approve", json={"digest": digest})
    assert refused.status_code == 403 and error_of(refused)["code"] == "forbidden"
    other = leaseq.approval_digest("payments.refund", {"order": 7, "cents": 999999}, "payments", effect="side_effect")
    mismatch = svc.http(operator).post(f"/v1/tasks/{task['id']}/approve", json={"digest": other})
    assert mismatch.status_code == 409
    err = error_of(mismatch)
    assert (err["code"], err["given"]) == ("approval_mismatch", other)
    assert digest not in mismatch.text  # a wrong digest is not answered with the right one
    missing = svc.http(operator).post(f"/v1/tasks/{task['id']}/approve", json={"note": "no digest"})
    assert missing.status_code == 422
    assert snapshot(svc.dsn) == before  # nothing decided

    done = svc.http(operator).post(f"/v1/tasks/{task['id']}/approve", json={"digest": digest, "note": "checked"})
    assert done.status_code == 200 and done.json()["status"] == "queued", done.text
    decided = svc.http(viewer).get(f"/v1/tasks/{task['id']}/approval").json()
    assert decided["decision"] == "approved" and decided["decided_via"] == "api"
    assert decided["decided_by"].startswith("olga (operator token ")
    [ev] = [e for e in svc.q.events(task["id"]) if e.type == "approved"]
    assert ev.detail["by"] == decided["decided_by"] and ev.detail["digest"] == digest
    [entry] = [e for e in auth.audit_log(svc.q) if e["action"] == "approve"]
    assert entry["actor"] == decided["decided_by"] and entry["detail"]["via"] == "api"

    second = _enqueue_gated(svc, agent, {"order": 8})
    denied = svc.http(operator).post(f"/v1/tasks/{second['id']}/deny", json={"reason": "duplicate"})
    assert denied.json()["status"] == "denied"
    again = svc.http(operator).post(f"/v1/tasks/{second['id']}/approve",
                                    json={"digest": svc.q.approval(second["id"]).digest})
    assert again.status_code == 409 and error_of(again)["code"] == "invalid_transition"
    assert svc.http(viewer).get("/v1/approvals").json()["approvals"] == []


def test_the_maintenance_leader_denies_at_the_deadline(q: leaseq.Queue, dsn: str) -> None:
    with serve(q, approvals_every=0.1, sweep_every=None) as (url, app):
        t = q.enqueue("job", {"x": 1}, approval="required", approval_deadline=0.2)
        assert app.state.maintenance.signals.wait("approvals", count=1, timeout=30)
        deadline = q.approval(t.id).deadline_at
        while q.now() <= deadline:
            pass
        # A pass that ends after this reading may have begun before the deadline (and rightly
        # denied nothing); the pass after it began after the deadline had passed.
        count = app.state.maintenance.signals.count("approvals")
        assert app.state.maintenance.signals.wait("approvals", count=count + 2, timeout=30)
    decided = q.approval(t.id)
    assert (decided.decision, decided.decided_by, q.get(t.id).status) == ("denied", "leaseq:deadline", "denied")


def test_the_token_that_asked_never_decides_over_http(svc: Service) -> None:
    olga, oscar = svc.token("operator", "olga"), svc.token("operator", "oscar")
    olga_id = olga.split("_")[1]
    task = _enqueue_gated(svc, olga, {"order": 7, "cents": 1250})
    req = svc.http(olga).get(f"/v1/tasks/{task['id']}/approval").json()
    assert (req["requested_token"], req["requested_worker"]) == (olga_id, None)
    assert req["requested_by"].startswith("olga (operator token ")
    svc.http(oscar).get("/v1/whoami")  # its first use is recorded (last_used_at) before the snapshot
    before = snapshot(svc.dsn)
    for verb, body in (("approve", {"digest": req["digest"], "note": "mine"}), ("deny", {"reason": "mine"})):
        refused = svc.http(olga).post(f"/v1/tasks/{task['id']}/{verb}", json=body)
        assert refused.status_code == 403, refused.text
        err = error_of(refused)
        assert err["code"] == "forbidden" and f"requested by token {olga_id}" in err["message"]
    assert snapshot(svc.dsn) == before  # nothing decided, nothing audited
    done = svc.http(oscar).post(f"/v1/tasks/{task['id']}/approve", json={"digest": req["digest"]})
    assert done.status_code == 200 and done.json()["status"] == "queued", done.text
    assert svc.q.approval(task["id"]).decided_by.startswith("oscar (operator token ")


def test_a_decision_after_the_deadline_over_http(svc: Service) -> None:
    olga, oscar = svc.token("operator", "olga"), svc.token("operator", "oscar")
    task = _enqueue_gated(svc, olga, {"order": 7}, approval_deadline=0.05)
    digest = svc.q.approval(task["id"]).digest
    deadline = svc.q.approval(task["id"]).deadline_at
    while svc.q.now() <= deadline:
        pass
    late = svc.http(oscar).post(f"/v1/tasks/{task['id']}/approve", json={"digest": digest})
    assert late.status_code == 409
    err = error_of(late)
    assert (err["code"], err["task_id"], err["decision"]) == ("approval_expired", task["id"], "approve")
    assert svc.q.get(task["id"]).status == "denied"
    assert svc.q.approval(task["id"]).decided_by == "leaseq:deadline"


def test_intents_over_the_worker_api(svc: Service) -> None:
    agent_token = svc.token("worker", "agent", queues=["agents"])
    agent = svc.remote(agent_token)
    svc.q.enqueue("agent.run", {"ticket": 1}, effect="idempotent", queue="agents", idempotency_key="ticket-1")
    w = agent.register_worker("agent")
    [c] = agent.claim(w, queue="agents")
    child = agent.intend(w, c, "payments.refund", {"order": 7}, key="refund", queue="payments",
                         approval="required")
    assert (child.status, child.queue, child.idempotency_key) == ("awaiting_approval", "payments",
                                                                  "ticket-1/intent/refund")
    assert child.parent_task_id == c.task_id
    req = svc.q.approval(child.id)
    assert (req.requested_worker, req.requested_token) == (w.id, agent_token.split("_")[1])
    with pytest.raises(leaseq.auth.AccessDenied):  # a decision on the agent worker's behalf
        svc.q.approve(child.id, req.digest, worker=w)
    assert agent.intend(w, c, "payments.refund", {"order": 7}, key="refund", queue="payments",
                        approval="required").id == child.id
    with pytest.raises(leaseq.auth.AccessDenied):  # the agent's token cannot claim its own intents
        agent.claim(w, queue="payments")
    before = snapshot(svc.dsn)
    with pytest.raises(leaseq.auth.AccessDenied, match="approval"):  # outside its queues: only gated
        agent.intend(w, c, "payments.refund", {"order": 8}, key="ungated", queue="payments")
    assert snapshot(svc.dsn) == before
    with pytest.raises(leaseq.auth.AccessDenied, match="intent/executor split"):  # inside: it would run it
        agent.intend(w, c, "agent.note", {"n": 1}, key="note", queue="agents")
    assert snapshot(svc.dsn) == before
    agent.complete(w, c, {"proposed": child.id})
    with pytest.raises(leaseq.LeaseLost):
        agent.intend(w, c, "payments.refund", {"order": 9}, key="late", queue="payments", approval="required")
    assert [t.id for t in svc.q.list_tasks(queue="payments")] == [child.id]
    assert svc.q.get(c.task_id).status == "completed"


@needs_browser
def test_the_approvals_inbox_in_a_browser(browser, q: leaseq.Queue) -> None:
    first = q.enqueue("payments.refund", {"order": 7, "cents": 1250}, queue="payments", effect="side_effect",
                      approval="required", by="agent-7")
    second = q.enqueue("payments.refund", {"order": 8, "cents": 90}, queue="payments", effect="side_effect",
                       approval="required", by="agent-8")
    operator = auth.create_token(q, name="olga", role="operator", created_by="test")[0]
    viewer = auth.create_token(q, name="vic", role="viewer", created_by="test")[0]
    with serve(q) as (url, _app):
        context = browser.new_context(base_url=url, viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(10_000)
        try:
            login(page, operator)
            page.click("text=Approvals")
            page.wait_for_url(re.compile(r"/approvals$"))
            card = page.locator(f'.approval-item[data-task="{first.id}"]')
            assert '"cents": 1250' in card.locator("pre.payload").inner_text()
            assert card.locator(".requested-by").inner_text() == "agent-7"
            assert card.locator("code.digest").inner_text() == q.approval(first.id).digest
            card.locator("form.approve input[name=note]").fill("refund checked against the order")
            with page.expect_navigation(url=re.compile(r"/approvals$")):
                card.locator("form.approve button").click()
            assert f"task {first.id} approved" in page.inner_text("[role=status]")
            decided = q.approval(first.id)
            assert decided.decision == "approved" and decided.decided_via == "dashboard"
            assert decided.decided_by.startswith("olga (operator token ")
            assert decided.note == "refund checked against the order"
            # a deny needs its reason; then the task ends denied
            card = page.locator(f'.approval-item[data-task="{second.id}"]')
            card.locator("form.deny input[name=reason]").fill("order 8 was never paid")
            with page.expect_navigation():
                card.locator("form.deny button").click()
            assert q.get(second.id).status == "denied"
            assert page.locator("#no-approvals").is_visible()
            # a viewer sees the inbox without the forms
            page.click("text=Log out")
            third = q.enqueue("payments.refund", {"order": 9}, queue="payments", approval="required")
            login(page, viewer)
            page.goto("/approvals")
            assert page.locator(f'.approval-item[data-task="{third.id}"]').is_visible()
            assert page.locator("form.approve").count() == 0 and page.locator("form.deny").count() == 0
        finally:
            context.close()
