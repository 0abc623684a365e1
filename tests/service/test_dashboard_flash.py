"""The dashboard's banner says only what the service itself said, on both backends.

A link to the real dashboard carrying ``?msg=`` or ``?err=`` shows none of its
text, on any page or the login form. An action's outcome travels in a cookie
signed for the session that acted: the redirect's URL carries no text, the
next page shows the message once, a reload shows nothing, and another
session (or a cookie tossed in from elsewhere) never sees it. The login page
shows only its own fixed notices, each once.
"""

from __future__ import annotations

import re

import httpx

from leaseq import auth

from .conftest import Service
from .support import dashboard_login, page_csrf

LIE = "Your token was revoked: log in at evil.example"
CRAFTED = {"msg": LIE, "err": LIE + " (err)"}


def _banner(html: str) -> list[str]:
    """The texts of the page's flash messages."""
    return re.findall(r'<div class="flash [a-z]+" role="(?:status|alert)">(.*?)</div>', html, re.S)


def _get(client: httpx.Client, path: str, **params: str) -> httpx.Response:
    resp = client.get(path, params=params, follow_redirects=False)
    assert resp.status_code == 200, (path, resp.status_code, resp.text[:300])
    return resp


def _toss(client: httpx.Client, name: str, value: str, path: str = "/") -> None:
    """Put a cookie in the client's jar as the service would have set it (replacing its own)."""
    client.cookies.set(name, value, domain=client.base_url.host, path=path)


def test_a_crafted_link_shows_none_of_its_text(svc: Service) -> None:
    task = svc.q.enqueue("job", {"n": 1}, queue="mail")
    client = dashboard_login(svc.url, svc.token("operator", "olga"))
    try:
        for path in ("/", "/tasks", f"/tasks/{task.id}", "/inbox", "/approvals", "/workers", "/limits",
                     "/fairness", "/redrive"):
            html = _get(client, path, **CRAFTED).text
            assert "evil.example" not in html and _banner(html) == [], path
        refused = client.get("/charts", params=CRAFTED)  # the charts page takes no unknown parameter
        assert refused.status_code == 422 and "evil.example" not in refused.text
        # nor on the login page, with or without a session
        for who in (client, httpx.Client(base_url=svc.url, timeout=10)):
            html = _get(who, "/login", **CRAFTED).text
            assert "evil.example" not in html and _banner(html) == []
    finally:
        client.close()


def test_an_outcome_shows_once_to_the_session_that_acted(svc: Service) -> None:
    task = svc.q.enqueue("job", {"n": 1})
    olga = dashboard_login(svc.url, svc.token("operator", "olga"))
    omar = dashboard_login(svc.url, svc.token("operator", "omar"))
    try:
        resp = olga.post(f"/tasks/{task.id}/cancel", follow_redirects=False, data={
            "csrf": page_csrf(olga, f"/tasks/{task.id}"), "back": f"/tasks/{task.id}", "reason": "not wanted"})
        assert resp.status_code == 303 and resp.headers["location"] == f"/tasks/{task.id}"  # no text in the URL
        assert svc.q.get(task.id).status == "cancelled"
        flash = olga.cookies["leaseq_flash"]
        # another browser's session never sees it, even holding a copy of the cookie
        _toss(omar, "leaseq_flash", flash)
        assert _banner(_get(omar, f"/tasks/{task.id}").text) == []
        # the session that acted sees it on the page it was sent to, once
        assert _banner(_get(olga, f"/tasks/{task.id}").text) == [f"task {task.id} cancelled"]
        assert "leaseq_flash" not in olga.cookies
        assert _banner(_get(olga, f"/tasks/{task.id}").text) == []  # a reload: gone
        # a tampered cookie shows nothing
        _toss(olga, "leaseq_flash", "x" + flash[1:])
        assert _banner(_get(olga, "/").text) == []
        # a refusal is carried the same way, as an alert
        resp = olga.post(f"/tasks/{task.id}/reconcile", follow_redirects=False, data={
            "csrf": page_csrf(olga, "/inbox"), "back": "/inbox", "outcome": "completed", "note": "x",
            "result": "{not json"})
        assert resp.status_code == 303 and resp.headers["location"] == "/inbox"
        [refusal] = _banner(_get(olga, "/inbox").text)
        assert "result: not valid JSON" in refusal
        assert _banner(_get(olga, "/inbox").text) == []
    finally:
        olga.close()
        omar.close()


def test_a_session_does_not_see_the_flash_of_its_predecessor(svc: Service) -> None:
    """A new login in the same browser is a new session: an unshown message of the old one stays unshown."""
    token = svc.token("operator", "olga")
    task = svc.q.enqueue("job", {"n": 1})
    client = dashboard_login(svc.url, token)
    try:
        client.post(f"/tasks/{task.id}/cancel", follow_redirects=False, data={
            "csrf": page_csrf(client), "back": "/", "reason": "not wanted"})
        flash = client.cookies["leaseq_flash"]
        again = dashboard_login(svc.url, token)
        _toss(again, "leaseq_flash", flash)
        assert _banner(_get(again, "/").text) == []
        again.close()
    finally:
        client.close()


def test_the_login_page_shows_only_its_own_notices_once(svc: Service) -> None:
    token = svc.token("viewer", "vera")
    client = dashboard_login(svc.url, token)
    try:
        resp = client.post("/logout", data={"csrf": page_csrf(client)}, follow_redirects=False)
        assert resp.status_code == 303 and resp.headers["location"] == "/login"
        assert _banner(_get(client, "/login").text) == ["logged out"]
        assert _banner(_get(client, "/login").text) == []  # a reload: gone
        # a notice cookie tossed in from elsewhere names a notice or shows nothing
        _toss(client, "leaseq_notice", LIE, "/login")
        assert _banner(_get(client, "/login").text) == []
        # a session ended by revoking its token says so, once
        client = dashboard_login(svc.url, token)
        auth.revoke_token(svc.q, token.split("_")[1], by="test")
        resp = client.get("/tasks", follow_redirects=False)
        assert resp.status_code == 303 and resp.headers["location"] == "/login"
        [notice] = _banner(_get(client, "/login").text)
        assert "session ended" in notice and "revoked" in notice  # the revocation deleted it
        assert _banner(_get(client, "/login").text) == []
    finally:
        client.close()


def test_a_flash_cookie_fits_a_browser_and_goes_stale() -> None:
    """A long bulk refusal is cut to fit a cookie; a flash older than its lifetime, or of another
    session, reads as nothing."""
    from leaseq.service import dashboard

    session = "lqs_" + "a" * 43
    long = {"msg": "requeue: " + "é" * 5000, "err": "refused: " + "x" * 5000}
    value = dashboard.flash_value(session, long, now=1000.0)
    assert len(value) <= dashboard.FLASH_MAX_CHARS
    shown = dashboard.read_flash(session, value, now=1000.0)
    assert shown["msg"].startswith("requeue: é") and shown["msg"].endswith("…") and shown["err"].endswith("…")
    assert dashboard.read_flash(session, value, now=1000.0 + dashboard.FLASH_SECONDS + 1) == {}
    assert dashboard.read_flash("lqs_" + "b" * 43, value, now=1000.0) == {}
    assert dashboard.read_flash(session, "not.a-flash", now=1000.0) == {}
