"""The dashboard's redrive page, on both backends: an operator filters (status, kind, queue, error
text, age), sees the dry run's count, then requeues or cancels the matching tasks in bulk, audited
as the API's redrive is; bad input is refused naming the field and changes nothing; a viewer gets
no page and cannot post; forms posted without the session's CSRF token or from another origin are
refused. A queue-limited token reaches only its queues (the rule the API and the page share)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

import leaseq
from leaseq import auth
from leaseq.service.redrive import Where, act_where

from .browser import browser, chromium, login, needs_browser, page  # noqa: F401  (fixtures)
from .conftest import Service
from .support import age_tasks, dashboard_login, page_csrf, snapshot


def _dead(q: leaseq.Queue, w: leaseq.Worker, error: str, *, queue: str = "default", kind: str = "mail") -> int:
    t = q.enqueue(kind, queue=queue, max_attempts=1)
    [c] = q.claim(w, queue=queue)
    q.fail(w, c, error, retry=False)
    return t.id


def _count(client: httpx.Client, **params: Any) -> httpx.Response:
    return client.get("/redrive", params={"action": "redrive", **params})


def _matched(html: str) -> int:
    return int(re.search(r'<span id="matched">(\d+)</span>', html).group(1))


def _post(client: httpx.Client, action: str, data: dict[str, Any]) -> httpx.Response:
    return client.post(f"/redrive/{action}", data=data, follow_redirects=False)


def _follow(client: httpx.Client, resp: httpx.Response) -> str:
    assert resp.status_code == 303, (resp.status_code, resp.text[:300])
    return client.get(resp.headers["location"]).text


def test_an_operator_counts_then_redrives_and_cancels_by_filter(svc: Service) -> None:
    q = svc.q
    w = q.register_worker("w")
    throttled = [_dead(q, w, "HTTP 429 Too Many Requests") for _ in range(2)]
    other = _dead(q, w, "HTTP 500")
    elsewhere = _dead(q, w, "HTTP 429", queue="batch")
    op = dashboard_login(svc.url, svc.token("operator", "olga"))
    before = snapshot(svc.dsn)
    html = _count(op, status="dead", queue="default", error="429").text
    assert _matched(html) == 2 and all(f'href="/tasks/{i}"' in html for i in throttled)
    assert f'href="/tasks/{other}"' not in html and f'href="/tasks/{elsewhere}"' not in html
    assert "Requeue 2 tasks" in html
    assert snapshot(svc.dsn) == before  # a dry run changes nothing
    csrf = page_csrf(op, "/redrive")
    text = _follow(op, _post(op, "redrive", {"csrf": csrf, "expected": "2", "status": "dead", "queue": "default",
                                            "error": "429", "note": "provider is back"}))
    assert f"redrive: 2 of 2 matching tasks requeued ({throttled[0]}, {throttled[1]})" in text
    assert _matched(text) == 0  # back on the page, counted again
    assert [q.get(i).status for i in throttled] == ["queued", "queued"]
    assert q.get(other).status == "dead" and q.get(elsewhere).status == "dead"
    assert q.events(throttled[0])[-1].type == "requeued"
    [entry] = [e for e in auth.audit_log(q, 100) if e["action"] == "redrive"]
    assert entry["actor"].startswith("olga (operator token ") and entry["detail"]["via"] == "dashboard"
    assert entry["detail"]["filter"]["error"] == "429" and entry["detail"]["moved"] == 2
    # cancel by filter: the reason is required, and recorded in each trail
    html = op.get("/redrive", params={"action": "cancel_where", "status": ["queued", "dead"],
                                      "older_than": "0s"}).text
    assert _matched(html) == 4 and "Cancel 4 tasks" in html
    before = snapshot(svc.dsn)
    text = _follow(op, _post(op, "cancel_where", {"csrf": csrf, "expected": "4", "status": ["queued", "dead"]}))
    assert "note: required field is missing" in text and snapshot(svc.dsn) == before
    text = _follow(op, _post(op, "cancel_where", {"csrf": csrf, "expected": "4", "status": ["queued", "dead"],
                                                  "note": "campaign withdrawn"}))
    assert "cancel_where: 4 of 4 matching tasks cancelled" in text
    assert {q.get(i).status for i in (*throttled, other, elsewhere)} == {"cancelled"}
    assert q.events(other)[-1].detail["reason"] == "campaign withdrawn"
    assert [e["detail"]["via"] for e in auth.audit_log(q, 100) if e["action"] == "cancel_where"] == ["dashboard"]


def test_the_action_takes_at_most_as_many_tasks_as_were_counted(svc: Service) -> None:
    """Tasks that died after the count wait for the next one: the action moves at most the
    number the operator saw, oldest first; and the age filter leaves recent ones alone."""
    q = svc.q
    w = q.register_worker("w")
    old = [_dead(q, w, "timeout") for _ in range(2)]
    age_tasks(svc.dsn, old, 3600)
    recent = _dead(q, w, "timeout")
    op = dashboard_login(svc.url, svc.token("operator"))
    assert _matched(_count(op, status="dead", older_than="30m").text) == 2
    assert _matched(_count(op, status="dead").text) == 3
    late = _dead(q, w, "timeout")  # dies between the count and the click
    csrf = page_csrf(op, "/redrive")
    text = _follow(op, _post(op, "redrive", {"csrf": csrf, "expected": "3", "status": "dead"}))
    assert "redrive: 3 of 3 matching tasks requeued" in text
    assert [q.get(i).status for i in (*old, recent, late)] == ["queued", "queued", "queued", "dead"]


@pytest.mark.parametrize("params, field", [
    ({"older_than": "soon"}, "older_than"),
    ({"limit": "many"}, "limit"),
    ({"limit": "0"}, "limit"),
    ({"status": "completed"}, "status"),
    ({"queue": "bad queue"}, "queue"),
    ({"frobnicate": "1"}, "frobnicate"),
    ({"action": "delete"}, "action"),
])
def test_a_bad_filter_is_refused_naming_the_field(svc: Service, params: dict[str, str], field: str) -> None:
    q = svc.q
    dead = _dead(q, q.register_worker("w"), "boom")
    op = dashboard_login(svc.url, svc.token("operator"))
    before = snapshot(svc.dsn)
    resp = _count(op, **params)
    assert resp.status_code == 422, resp.text[:300]
    assert re.search(rf'role="alert">{field}: ', resp.text), resp.text[-1500:]
    form = {"csrf": page_csrf(op, "/redrive"), "expected": "1", "status": "dead", **params}
    if field == "action":  # no such route
        assert _post(op, form.pop("action"), form).status_code == 422
    else:
        assert f"{field}: " in _follow(op, _post(op, "redrive", form))
    assert snapshot(svc.dsn) == before and q.get(dead).status == "dead"


def test_a_viewer_gets_no_page_and_a_forged_post_changes_nothing(svc: Service) -> None:
    q = svc.q
    dead = _dead(q, q.register_worker("w"), "boom")
    viewer = dashboard_login(svc.url, svc.token("viewer"))
    assert "redrive-link" not in viewer.get("/tasks").text
    resp = _count(viewer, status="dead")
    assert resp.status_code == 403 and 'id="where"' not in resp.text and 'id="matched"' not in resp.text
    assert "the viewer role cannot redrive" in resp.text
    op = dashboard_login(svc.url, svc.token("operator"))
    assert "redrive-link" in op.get("/tasks").text
    before = snapshot(svc.dsn)
    form = {"expected": "1", "status": "dead"}
    assert _post(viewer, "redrive", {**form, "csrf": page_csrf(viewer, "/tasks")}).status_code == 403
    assert _post(op, "redrive", form).status_code == 403  # no CSRF token
    assert _post(op, "redrive", {**form, "csrf": "0" * 64}).status_code == 403
    foreign = op.post("/redrive/redrive", data={**form, "csrf": page_csrf(op, "/redrive")},
                      headers={"Origin": "http://evil.example"}, follow_redirects=False)
    assert foreign.status_code == 403
    text = _follow(op, _post(op, "redrive", {**form, "csrf": page_csrf(op, "/redrive"), "expected": "0"}))
    assert "expected: count the matching tasks first" in text
    assert snapshot(svc.dsn) == before and q.get(dead).status == "dead"
    assert "redrive" not in [e["action"] for e in auth.audit_log(q, 100)]


def test_a_queue_limited_token_reaches_only_its_queues(svc: Service) -> None:
    """The rule the API's redrive and the dashboard's page share: the token names one of its
    queues, another queue is refused as is naming none, and only its queue's tasks move."""
    q = svc.q
    w = q.register_worker("w")
    mine, theirs = _dead(q, w, "x", queue="mine"), _dead(q, w, "x", queue="theirs")
    scoped = auth.verify_token(q, svc.token("operator", "sam", queues=["mine"]))
    for where in (Where(status="dead"), Where(status="dead", queue="theirs")):
        for dry_run in (True, False):
            with pytest.raises(auth.AccessDenied):
                act_where(q, scoped, "redrive", where, dry_run=dry_run, via="dashboard")
    counted = act_where(q, scoped, "redrive", Where(status="dead", queue="mine"), dry_run=True, via="dashboard")
    assert counted["task_ids"] == [mine]
    done = act_where(q, scoped, "cancel_where", Where(status="dead", queue="mine", note="gone"), dry_run=False,
                     via="dashboard")
    assert done["task_ids"] == [mine] and q.get(theirs).status == "dead"
    viewer = auth.verify_token(q, svc.token("viewer"))
    with pytest.raises(auth.AccessDenied):
        act_where(q, viewer, "redrive", Where(status="dead"), dry_run=True, via="dashboard")


@needs_browser
def test_an_operator_redrives_from_the_task_list_in_a_browser(page: Any, svc: Service) -> None:
    q = svc.q
    w = q.register_worker("w")
    throttled = [_dead(q, w, "HTTP 429 Too Many Requests") for _ in range(3)]
    other = _dead(q, w, "HTTP 500")
    login(page, svc.token("operator", "olga"))
    page.goto("/tasks?status=dead")
    with page.expect_navigation(url=re.compile(r"/redrive\?")):
        page.click("#redrive-link a")
    assert page.locator("#where input[name=status][value=dead]").is_checked()
    page.fill("#where-error", "429")
    with page.expect_navigation(url=re.compile(r"/redrive\?action=redrive")):
        page.click("#count")
    assert page.inner_text("#matched") == "3"
    assert page.inner_text("#act-button") == "Requeue 3 tasks"
    assert {q.get(i).status for i in throttled} == {"dead"}  # counted, nothing moved
    page.fill("#act input[name=note]", "provider is back")
    with page.expect_navigation(url=re.compile(r"/redrive\?action=redrive")):
        page.click("#act-button")
    assert "redrive: 3 of 3 matching tasks requeued" in page.inner_text("[role=status]")
    assert page.inner_text("#matched") == "0" and page.locator("#act").count() == 0
    assert {q.get(i).status for i in throttled} == {"queued"} and q.get(other).status == "dead"
    # a cancel asks for its reason in the browser itself
    page.select_option("#where-action", "cancel_where")
    page.uncheck("#where input[name=status][value=dead]")
    page.check("#where input[name=status][value=queued]")
    page.fill("#where-error", "")
    with page.expect_navigation(url=re.compile(r"/redrive\?action=cancel_where")):
        page.click("#count")
    assert page.inner_text("#act-button") == "Cancel 3 tasks"
    page.fill("#act input[name=note]", "campaign withdrawn")
    with page.expect_navigation():
        page.click("#act-button")
    assert "cancel_where: 3 of 3 matching tasks cancelled" in page.inner_text("[role=status]")
    assert {q.get(i).status for i in throttled} == {"cancelled"}
    assert [e["action"] for e in auth.audit_log(q, 100)].count("cancel") == 3
