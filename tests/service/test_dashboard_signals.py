"""The task page's signal form, in a real headless Chromium, on both backends: an operator sends
a waiting task the signal it waits for (name and JSON payload), a bad payload is refused naming
the field and changes nothing, and a viewer gets no form and cannot post one."""

from __future__ import annotations

import re
from typing import Any

import leaseq
from leaseq import auth

from .browser import browser, chromium, login, needs_browser, page  # noqa: F401  (fixtures)
from .conftest import Service
from .support import dashboard_login, page_csrf, snapshot

pytestmark = needs_browser


def _waiting(q: leaseq.Queue, name: str = "go") -> leaseq.Task:
    """A task whose attempt ended waiting for the signal ``name``."""
    task = q.enqueue("review", {"doc": 7})
    w = q.register_worker("w")
    [c] = q.claim(w)
    assert q.wait_signal(w, c, f"{task.idempotency_key}:signal:{name}:0", name)["state"] == "suspended"
    assert q.get(task.id).status == "waiting"
    return task


def test_an_operator_signals_a_waiting_task_from_its_page(page: Any, svc: Service) -> None:
    q = svc.q
    task = _waiting(q)
    login(page, svc.token("operator", "olga"))
    page.goto(f"/tasks/{task.id}")
    form = page.locator("form.signal")
    assert form.locator("[name=name]").input_value() == "go"  # the signal the task waits for
    assert "waits for the signal go" in form.inner_text()
    before = snapshot(svc.dsn)
    form.locator("[name=payload]").fill('{"approved": tru')
    with page.expect_navigation(url=re.compile(rf"/tasks/{task.id}$")):
        form.locator("button").click()
    assert "payload: not valid JSON" in page.inner_text("[role=alert]")
    assert snapshot(svc.dsn) == before and q.signals(task.id) == []  # refused: nothing changed
    form = page.locator("form.signal")
    form.locator("[name=name]").fill("")
    form.locator("[name=name]").evaluate("e => e.removeAttribute('required')")  # past the browser's own check
    with page.expect_navigation(url=re.compile(rf"/tasks/{task.id}$")):
        form.locator("button").click()
    assert "name: must be a non-empty string" in page.inner_text("[role=alert]")
    assert snapshot(svc.dsn) == before
    form = page.locator("form.signal")
    form.locator("[name=payload]").fill('{"approved": true}')
    with page.expect_navigation(url=re.compile(rf"/tasks/{task.id}$")):
        form.locator("button").click()
    assert f"signal 'go' sent to task {task.id}: it runs again" in page.inner_text("[role=status]")
    assert q.get(task.id).status == "queued"
    [sent] = q.signals(task.id)
    assert sent["name"] == "go" and sent["payload"] == {"approved": True}
    assert sent["sent_by"].startswith("olga (operator token ")
    assert [e["detail"].get("via") for e in auth.audit_log(q, 100) if e["action"] == "signal"] == ["dashboard"]


def test_a_viewer_gets_no_signal_form_and_cannot_post_one(page: Any, svc: Service) -> None:
    q = svc.q
    task = _waiting(q)
    login(page, svc.token("viewer", "vera"))
    page.goto(f"/tasks/{task.id}")
    assert page.locator("#task-facts").count() == 1 and page.locator("form.signal").count() == 0
    viewer, operator = dashboard_login(svc.url, svc.token("viewer")), dashboard_login(svc.url, svc.token("operator"))
    before = snapshot(svc.dsn)
    refused = viewer.post(f"/tasks/{task.id}/signal",
                          data={"name": "go", "payload": "1", "csrf": page_csrf(viewer, f"/tasks/{task.id}")})
    assert refused.status_code == 403
    no_csrf = operator.post(f"/tasks/{task.id}/signal", data={"name": "go", "payload": "1"})
    assert no_csrf.status_code == 403
    assert snapshot(svc.dsn) == before and q.signals(task.id) == []


def test_each_generation_shows_what_it_streamed(page: Any, svc: Service) -> None:
    q = svc.q
    task = q.enqueue("agent")
    w = q.register_worker("w")
    [c] = q.claim(w)
    q.emit(w, c, {"step": 1})
    q.emit(w, c, {"step": 2}, key=f"{task.idempotency_key}:emit:0")
    login(page, svc.token("viewer", "vera"))
    page.goto(f"/tasks/{task.id}")
    assert page.inner_text('[data-generation="1"] .stream-size').startswith("Stream: 2 items (1 durable), seq ")
