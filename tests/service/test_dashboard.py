"""The dashboard in a real headless Chromium (Debian's chromium, driven by Playwright).

A login through the form, the queue overview, the task timeline (with a
screenshot saved under the test's tmp_path), and a reconciliation done
through the inbox page and checked in the database.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx

import leaseq
from leaseq import auth
from conformance.support import run_out

from .browser import browser, chromium, login, needs_browser, page, png_facts  # noqa: F401  (fixtures)
from .conftest import Service
from .support import dashboard_login, page_csrf, snapshot

pytestmark = needs_browser


def _two_generation_task(q: leaseq.Queue) -> int:
    """A's lease expires; B recovers, records an effect and completes."""
    a, b = q.register_worker("worker-a"), q.register_worker("worker-b")
    task = q.enqueue("summarize", {"doc": 7}, effect="idempotent")
    [ca] = q.claim(a)
    q.heartbeat(a, ca)
    run_out(q, a, ca)
    [cb] = q.claim(b)
    fx = q.begin_effect(b, cb, "search.query", key="doc-7")
    q.finish_effect(b, cb, fx, {"hits": 3})
    q.complete(b, cb, {"summary": "three hits"})
    return task.id


def session_cookie(page) -> dict | None:
    found = [c for c in page.context.cookies() if c["name"] == "leaseq_session"]
    return found[0] if found else None


def stored_sessions(dsn: str) -> int:
    return len(snapshot(dsn).get("leaseq_sessions", []))


def test_login_session_and_logout_rules(page, svc: Service) -> None:
    # bad and worker tokens are refused at the form, and no session is made
    page.goto("/login")
    page.fill("#token", "lq_000000000000_" + "0" * 64)
    page.click("#login")
    assert "invalid token" in page.inner_text("[role=alert]")
    page.fill("#token", svc.token("worker", all_queues=True))
    page.click("#login")
    assert "worker role cannot use the dashboard" in page.inner_text("[role=alert]")
    assert session_cookie(page) is None and stored_sessions(svc.dsn) == 0
    # a viewer logs in; the browser gets a session id, never the token
    svc.q.enqueue("job", queue="mail")
    token = svc.token("viewer", "vera")
    login(page, token)
    assert page.inner_text("header .who") == "vera · viewer"
    row = page.locator('#queues tr[data-queue="mail"]')
    assert row.locator("td").nth(1).inner_text() == "1"  # one queued
    cookie = session_cookie(page)
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"], cookie["secure"]) == (True, "Strict", "/", False)
    assert cookie["value"].startswith("lqs_") and token not in cookie["value"]
    assert cookie["expires"] > 0  # expires with the session, not at some later browser restart
    assert "leaseq_session" not in page.evaluate("document.cookie")
    assert stored_sessions(svc.dsn) == 1
    assert token.split("_")[2] not in str(snapshot(svc.dsn)["leaseq_sessions"])
    page.goto("/inbox")
    assert page.locator("form.reconcile").count() == 0  # viewers get no action forms
    # logout ends the session in the database: a copy of the cookie is worth nothing
    stolen = cookie["value"]
    page.click("header form button")
    page.wait_for_url(re.compile(r"/login"))
    assert session_cookie(page) is None and stored_sessions(svc.dsn) == 0
    replay = httpx.get(f"{svc.url}/", cookies={"leaseq_session": stolen})
    assert replay.status_code == 303 and replay.headers["location"].startswith("/login")
    # revoking the token ends its sessions at the next page
    login(page, token)
    auth.revoke_token(svc.q, token.split("_")[1], by="test")
    assert stored_sessions(svc.dsn) == 0
    page.goto("/tasks")
    assert page.url.split("?")[0].endswith("/login") and "session ended" in page.inner_text("[role=alert]")
    assert session_cookie(page) is None


def test_login_csrf_from_another_port_of_the_host_is_refused(page, svc: Service, browser) -> None:
    """An attacker's page on another port of the host (another origin, the same
    site) tries to log the victim's browser in as the attacker: with a tossed
    double-submit cookie, from a sandboxed frame (Origin: null) and directly."""
    import http.server
    import threading

    attacker_token = svc.token("viewer", "attacker")
    form = httpx.get(f"{svc.url}/login")
    pair = (form.cookies["leaseq_login"], re.search(r'name="csrf" value="([^"]+)"', form.text).group(1))
    target = f"{svc.url}/login"
    fields = (f'<input name="token" value="{attacker_token}"><input name="csrf" value="{pair[1]}">')
    pages = {
        "/direct": f'''<script>document.cookie = "leaseq_login={pair[0]}; path=/login";</script>
<form method="post" action="{target}">{fields}</form><script>document.forms[0].submit()</script>''',
        "/sandboxed": f'''<script>document.cookie = "leaseq_login={pair[0]}; path=/login";</script>
<iframe sandbox="allow-forms allow-scripts allow-top-navigation" srcdoc='<form method="post" target="_top"
 action="{target}">{fields}</form><script>document.forms[0].submit()</script>'></iframe>''',
    }

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages[self.path].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        for path in pages:
            context = browser.new_context(viewport={"width": 1000, "height": 700})
            victim = context.new_page()
            victim.set_default_timeout(10_000)
            try:
                victim.goto(f"http://127.0.0.1:{evil.server_address[1]}{path}")
                victim.wait_for_url(lambda url: url.startswith(svc.url))
                victim.wait_for_load_state()
                assert session_cookie(victim) is None, (path, victim.url)
                assert "form posted from another" in victim.inner_text("main"), victim.inner_text("main")
            finally:
                context.close()
    finally:
        evil.shutdown()
    assert stored_sessions(svc.dsn) == 0
    # the same token logs in from the dashboard's own form
    login(page, attacker_token)
    assert stored_sessions(svc.dsn) == 1


def test_task_timeline_screenshot(page, svc: Service, tmp_path: Path) -> None:
    task_id = _two_generation_task(svc.q)
    login(page, svc.token("operator", "olga"))
    page.goto(f"/tasks/{task_id}")
    gens = page.locator("#timeline .gen[data-generation]")
    assert gens.count() == 2
    first, second = gens.nth(0).inner_text(), gens.nth(1).inner_text()
    assert "worker-a" in first and "expired without renewal" in first and "Heartbeats: 1" in first
    assert "worker-b" in second and "search.query" in second and '"hits": 3' in second
    assert "completed by the holder" in second
    assert page.inner_text("#status") == "completed"
    shot = tmp_path / "timeline.png"
    page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    page.locator("#timeline").screenshot(path=str(shot))
    width, height, distinct_rows = png_facts(shot)
    assert width > 600 and height > 250, (width, height)
    assert distinct_rows > 40 and shot.stat().st_size > 10_000  # drawn text, not a blank box


def test_reconcile_through_the_inbox(page, svc: Service) -> None:
    q = svc.q
    w = q.register_worker("mailer")
    task = q.enqueue("send_welcome", {"user": 5}, effect="side_effect")
    [c] = q.claim(w)
    q.begin_effect(w, c, "email.send", key="welcome:5")
    q.release(w, c, "worker stopped")
    assert q.get(task.id).status == "needs_reconciliation"

    login(page, svc.token("operator", "olga"))
    page.goto("/inbox")
    item = page.locator(f'.inbox-item[data-task="{task.id}"]')
    assert "welcome:5" in item.inner_text() and "no response" in item.inner_text()
    item.locator("select[name=outcome]").select_option("completed")
    item.locator("input[name=note]").fill("provider log shows the mail was delivered")
    with page.expect_navigation(url=re.compile(r"/inbox$")):  # the message is in the session, not the URL
        item.locator("form.reconcile button").click()
    assert f"task {task.id} reconciled: completed" in page.inner_text("[role=status]")
    page.reload()
    assert page.locator("[role=status]").count() == 0  # shown once
    assert page.locator(f'.inbox-item[data-task="{task.id}"]').count() == 0

    done = q.get(task.id)
    assert done.status == "completed" and done.open_effects == 0
    [event] = [e for e in q.events(task.id) if e.type == "reconciled"]
    assert event.detail["by"].startswith("olga (operator token ")
    assert event.detail["note"] == "provider log shows the mail was delivered"
    assert event.detail["settled_intents"] == ["welcome:5"]
    assert [fx.status for fx in q.effects(task.id)] == ["reconciled"]
    [entry] = [e for e in auth.audit_log(q) if e["action"] == "reconcile"]
    assert entry["detail"]["via"] == "dashboard" and entry["actor"] == event.detail["by"]


def test_actions_need_csrf_and_the_operator_role(svc: Service) -> None:
    q = svc.q
    w = q.register_worker("w")
    task = q.enqueue("job", effect="side_effect")
    [c] = q.claim(w)
    q.fail(w, c, "token revoked upstream", block=True)
    viewer, operator = dashboard_login(svc.url, svc.token("viewer")), dashboard_login(svc.url, svc.token("operator"))
    csrf = {"viewer": page_csrf(viewer), "operator": page_csrf(operator)}
    before = snapshot(svc.dsn)
    attempts = [(operator, {"note": "fixed"}), (operator, {"note": "fixed", "csrf": "0" * 64}),
                (operator, {"note": "fixed", "csrf": csrf["viewer"]}),
                (operator, {"note": "fixed", "csrf": "\u00e9" * 64}),  # not ASCII: refused, not a 500
                (viewer, {"note": "fixed", "csrf": csrf["viewer"]})]
    for client, form in attempts:
        resp = client.post(f"/tasks/{task.id}/unblock", data=form)
        assert resp.status_code == 403, (form, resp.text)
    for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                    {"Origin": svc.url.rsplit(":", 1)[0] + ":1"},  # the same host on another port
                    {"Sec-Fetch-Site": "same-site", "Origin": svc.url}, {"Sec-Fetch-Site": "cross-site"}):
        resp = operator.post(f"/tasks/{task.id}/unblock", data={"note": "x", "csrf": csrf["operator"]},
                             headers=headers)
        assert resp.status_code == 403, (headers, resp.text)
    no_origin = httpx.post(f"{svc.url}/tasks/{task.id}/unblock", data={"note": "x", "csrf": csrf["operator"]},
                           cookies=dict(operator.cookies))
    assert no_origin.status_code == 403 and "Origin" in no_origin.text
    assert httpx.post(f"{svc.url}/tasks/{task.id}/unblock", data={"note": "x"}).status_code == 303  # to /login
    assert snapshot(svc.dsn) == before
    ok = operator.post(f"/tasks/{task.id}/unblock",
                       data={"note": "key rotated", "csrf": csrf["operator"], "back": "/\\evil.example"},
                       headers={"Origin": svc.url, "Sec-Fetch-Site": "same-origin"})
    assert ok.status_code == 303 and q.get(task.id).status == "queued"
    assert ok.headers["location"] == "/"  # never redirected off the service
