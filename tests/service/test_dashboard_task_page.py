"""The task page, the inbox and the approval cards, in a real headless Chromium, on both backends.

The evidence trail reads in time order (an approval above the run it
authorised), the approval is a fact beside the lease facts (who, when, note,
digest; the note hidden from a token that may not read payloads), a
handler's traceback starts at the user's frames and keeps its line breaks,
the reconcile form starts with no outcome chosen and takes a result, and
Cancel and Deny each say what they do beside their buttons.
"""

from __future__ import annotations

import re
from typing import Any

import leaseq
from leaseq.worker.completer import error_text

from .browser import browser, chromium, login, needs_browser, page  # noqa: F401  (fixtures)
from .conftest import Service
from .support import dashboard_login, page_csrf

pytestmark = needs_browser


def _approved_and_run(svc: Service) -> int:
    q = svc.q
    task = q.enqueue("pay", {"invoice": 7}, effect="side_effect", approval="required")
    approval = q.approval(task.id)
    q.approve(task.id, digest=approval.digest, note="invoice 7 checked against the order", by="alice")
    w = q.register_worker("payer")
    [c] = q.claim(w)
    q.complete(w, c, {"paid": True})
    return task.id


def _trail(page: Any) -> list[str]:
    """The timeline's entries, top to bottom: an event's type, or ``generation N``."""
    return page.eval_on_selector_all(
        "#timeline > .gen",
        "els => els.map(e => e.dataset.generation ? 'generation ' + e.dataset.generation : e.dataset.event)")


def test_the_approval_reads_above_the_run_it_authorised(page, svc: Service) -> None:
    task_id = _approved_and_run(svc)
    login(page, svc.token("operator", "olga"))
    page.goto(f"/tasks/{task_id}")
    assert _trail(page) == ["enqueued", "approval_requested", "approved", "generation 1"]
    fact = page.inner_text("#approval")
    assert "approved" in fact and "alice" in fact
    assert page.inner_text("#task-facts .approval-note") == "invoice 7 checked against the order"
    assert page.inner_text("#task-facts code.digest") == svc.q.approval(task_id).digest


def test_a_viewer_sees_the_approval_but_not_its_note(page, svc: Service) -> None:
    task_id = _approved_and_run(svc)
    login(page, svc.token("viewer", "vera"))
    page.goto(f"/tasks/{task_id}")
    assert "alice" in page.inner_text("#approval")
    assert "invoice 7" not in page.content()  # the note is free text, hidden like payloads


def _parse(text: str) -> int:
    return int(text)


def _handler(payload: dict[str, Any]) -> int:
    return _parse(payload["n"])


def test_a_traceback_starts_at_the_users_frames_and_keeps_its_lines(page, svc: Service) -> None:
    try:
        _handler({"n": "seven"})
    except ValueError as exc:
        text = error_text(exc)
    lines = text.splitlines()
    assert lines[0].startswith("ValueError: invalid literal")
    frames = [line for line in lines if line.startswith("  File ")]
    assert "_handler" in frames[-2] and "_parse" in frames[-1], text
    assert all("leaseq/" not in f.split('"')[1] for f in frames), text

    q = svc.q
    w = q.register_worker("w")
    task = q.enqueue("count", effect="side_effect")
    [c] = q.claim(w)
    q.begin_effect(w, c, "ledger.write", key="count:1")
    q.fail(w, c, text, retry=False)
    login(page, svc.token("operator", "olga"))
    page.goto(f"/tasks/{task.id}")
    shown = page.inner_text("#last-error")
    assert shown.splitlines()[0].startswith("ValueError") and "\n  File " in shown
    # the failed event's error keeps its line breaks too, and so does the inbox card
    assert "\n  File " in page.inner_text("#timeline .detail-text pre")
    if q.get(task.id).status == "needs_reconciliation":
        page.goto("/inbox")
        assert "\n  File " in page.inner_text(f'.inbox-item[data-task="{task.id}"] pre.last-error')


def _parked(q: leaseq.Queue) -> int:
    w = q.register_worker("mailer")
    task = q.enqueue("send_invoice", {"user": 5}, effect="side_effect")
    [c] = q.claim(w)
    q.begin_effect(w, c, "invoice.send", key="invoice:5")
    q.release(w, c, "worker stopped")
    assert q.get(task.id).status == "needs_reconciliation"
    return task.id


def test_the_reconcile_form_asks_for_an_outcome_and_takes_a_result(page, svc: Service) -> None:
    q = svc.q
    task_id = _parked(q)
    login(page, svc.token("operator", "olga"))
    page.goto("/inbox")
    form = page.locator(f'.inbox-item[data-task="{task_id}"] form.reconcile')
    assert form.locator("select[name=outcome]").input_value() == ""  # nothing chosen for the operator
    form.locator("input[name=note]").fill("provider log shows invoice 5 sent")
    form.locator("button").click()
    # the browser refuses the form with no outcome: still the same page, nothing written
    assert page.evaluate("document.querySelector('.inbox-item form.reconcile select').validity.valueMissing")
    assert q.get(task_id).status == "needs_reconciliation"
    form.locator("select[name=outcome]").select_option("completed")
    form.locator("textarea[name=result]").fill('{"invoice_id": "in_5"}')
    with page.expect_navigation(url=re.compile(r"/inbox$")):
        form.locator("button").click()
    assert f"task {task_id} reconciled" in page.inner_text("[role=status]")
    done = q.get(task_id)
    assert done.status == "completed" and done.result == {"invoice_id": "in_5"}


def test_a_result_that_is_not_json_is_refused_naming_the_field(svc: Service) -> None:
    q = svc.q
    task_id = _parked(q)
    client = dashboard_login(svc.url, svc.token("operator", "olga"))
    try:
        resp = client.post(f"/tasks/{task_id}/reconcile", data={
            "csrf": page_csrf(client, "/inbox"), "back": "/inbox", "outcome": "completed",
            "note": "checked", "result": "{not json"}, follow_redirects=False)
        assert resp.status_code == 303 and resp.headers["location"] == "/inbox"
        assert "result: not valid JSON" in client.get("/inbox").text
        assert q.get(task_id).status == "needs_reconciliation" and q.get(task_id).result is None
        # no outcome at all: refused naming it, nothing written
        resp = client.post(f"/tasks/{task_id}/reconcile", data={
            "csrf": page_csrf(client, "/inbox"), "back": "/inbox", "note": "checked"}, follow_redirects=False)
        assert resp.headers["location"] == "/inbox" and "outcome: " in client.get("/inbox").text
        assert q.get(task_id).status == "needs_reconciliation"
    finally:
        client.close()


def test_cancel_and_deny_say_what_sets_them_apart(page, svc: Service) -> None:
    task = svc.q.enqueue("pay", {"invoice": 8}, effect="side_effect", approval="required")
    login(page, svc.token("operator", "olga"))
    page.goto("/approvals")
    card = page.locator(f'.approval-item[data-task="{task.id}"]')
    cancel, deny = card.locator("form.cancel .hint").inner_text(), card.locator("form.deny .hint").inner_text()
    assert "ends cancelled" in cancel
    assert "ends denied" in deny and "unlike Cancel task" in deny and "approval decision" in deny
    assert "yes" in card.locator("form.approve .hint").inner_text()


def test_the_overview_fits_1280_px_and_shows_the_last_hour(page, svc: Service) -> None:
    q = svc.q
    w = q.register_worker("w")
    for i in range(9):
        q.enqueue("summarize", {"i": i}, queue="default" if i < 6 else ("mail", "notifications-eu-west")[i % 2])
    claims = q.claim(w, limit=6)
    for c in claims[:4]:
        q.complete(w, c, {"ok": True})
    q.fail(w, claims[4], "provider down", retry=False)  # dead
    q.enqueue("pay", {}, approval="required")
    _parked(q)  # needs_reconciliation
    login(page, svc.token("operator", "olga"))
    page.goto("/")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280  # no sideways scrolling
    assert page.inner_text("#glance-throughput .big") == "4"
    assert page.inner_text("#glance-failures .big") == "1"
    assert page.locator("#glance-throughput svg.spark rect").count() >= 1
    assert page.inner_text("#glance-depth .big") == "3"  # 9 enqueued, 6 claimed (the gated task awaits approval)
    for status, n in (("needs_reconciliation", "1"), ("awaiting_approval", "1"), ("blocked", "0"), ("dead", "1")):
        assert page.inner_text(f"#attention-{status}") == n, status
    # the counts beside the attention pages, on every page
    page.goto("/workers")
    assert page.inner_text("#count-inbox") == "1" and page.inner_text("#count-approvals") == "1"
