"""Fuzzing the dashboard's login, logout and forms: generated fields, cookies and origins.

The service runs for real (uvicorn on 127.0.0.1, both backends). Every
response must be below 500. A session is made only by a login that carries
a valid token, the login form's own CSRF pair and the dashboard's origin; a
refused post leaves every table as it was.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from hypothesis import given
from hypothesis import strategies as st

import leaseq
from leaseq import auth
from leaseq.service import create_app
from leaseq.service.app import server_config

from .support import ODD_TEXT, TEXT, fuzz_settings, snapshot

FUZZ = fuzz_settings(60)
HEADER_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)


class Dashboard:
    """The service, a real viewer token, and a genuine login-form CSRF pair."""

    def __init__(self, q: leaseq.Queue, dsn: str, url: str):
        self.q, self.dsn, self.url = q, dsn, url
        self.token = auth.create_token(q, name="fuzz-viewer", role="viewer", created_by="fuzz")[0]
        form = httpx.get(f"{url}/login")
        self.login_cookie = form.cookies["leaseq_login"]
        self.csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
        auth.verify_token(q, self.token)  # first use is recorded once; later requests write nothing

    def origins(self) -> list[str]:
        host = self.url.split("://")[1]
        port = int(host.rsplit(":", 1)[1])
        return [self.url, "null", "", "https://evil.example", f"http://127.0.0.1:{port + 1}", f"https://{host}",
                f"http://{host}@evil.example", "file://", f"http://localhost:{port}", f"{self.url}/"]


@pytest.fixture
def dashboard(q: leaseq.Queue, dsn: str) -> Iterator[Dashboard]:
    app = create_app(q, failed_auth_burst=1_000_000)  # the fuzz itself must not be throttled
    server = uvicorn.Server(server_config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="on",
                                          access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.005)
    yield Dashboard(q, dsn, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}")
    server.should_exit = True
    thread.join(10)


def _sessions(dsn: str) -> int:
    return len(snapshot(dsn).get("leaseq_sessions", []))


@FUZZ
@given(data=st.data())
def test_generated_dashboard_posts_never_break_it_nor_log_anyone_in_by_accident(dashboard, data):
    d = dashboard
    path = data.draw(st.sampled_from(["/login", "/logout", "/tasks/1/unblock", "/queues/default/pause"]), label="path")
    token = data.draw(st.one_of(st.just(d.token), TEXT, ODD_TEXT, st.just(d.token + "\n"), st.just(" " + d.token)),
                      label="token")
    csrf = data.draw(st.one_of(st.just(d.csrf), TEXT, ODD_TEXT, st.just("\u00e9" * 43)), label="csrf")
    cookie = data.draw(st.one_of(st.just(d.login_cookie), st.just(d.csrf), HEADER_TEXT, st.none()), label="cookie")
    session = data.draw(st.one_of(st.none(), HEADER_TEXT, st.just("lqs_" + "A" * 43)), label="session")
    origin = data.draw(st.one_of(st.none(), st.sampled_from(d.origins()), HEADER_TEXT), label="origin")
    site = data.draw(st.one_of(st.none(), st.sampled_from(["same-origin", "same-site", "cross-site", "none", ""])),
                     label="sec-fetch-site")
    headers = {}
    if origin is not None:
        headers["Origin"] = origin
    if site is not None:
        headers["Sec-Fetch-Site"] = site
    cookies = [f"leaseq_login={cookie}" if cookie is not None else "",
               f"leaseq_session={session}" if session is not None else ""]
    if any(cookies):
        headers["Cookie"] = "; ".join(c for c in cookies if c)
    before = snapshot(d.dsn)
    resp = httpx.post(f"{d.url}{path}", data={"token": token, "csrf": csrf, "note": "x"}, headers=headers)
    assert resp.status_code < 500, (path, headers, resp.status_code, resp.text[:300])
    made = _sessions(d.dsn) - len(before.get("leaseq_sessions", []))
    genuine = (path == "/login" and token.strip() == d.token and csrf == cookie == d.login_cookie
               and origin in (None, d.url, f"{d.url}/") and site in (None, "same-origin")
               and (origin is not None or site is not None))
    if genuine:
        assert made == 1 and resp.status_code == 303, (headers, resp.text[:300])
    else:
        assert made == 0, (path, token, csrf, cookie, headers)
        if path != "/login" or resp.status_code != 303:
            assert snapshot(d.dsn) == before


def _login(d: Dashboard, role: str) -> httpx.Client:
    secret = auth.create_token(d.q, name=f"fuzz-{role}", role=role, created_by="fuzz", all_queues=True)[0]
    client = httpx.Client(base_url=d.url, timeout=10, headers={"Origin": d.url})
    form = client.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    assert client.post("/login", data={"token": secret, "csrf": csrf}).status_code == 303
    return client


PARAM_TEXT = st.one_of(TEXT, ODD_TEXT, st.integers(-(2**70), 2**70).map(str), st.sampled_from(
    ["", "0", "1", "01", "1e3", "0x10", " 7", "7 ", "+7", str(2**63 - 1), str(2**63), "200", "201", "9" * 30,
     "queued", "dead", "needs_reconciliation", "15m", "kind", "queue", "overview", "tasks", "task"]))


@FUZZ
@given(data=st.data())
def test_generated_list_chart_and_live_parameters_get_a_page_or_a_4xx(dashboard, data):
    d = dashboard
    if not hasattr(d, "viewer"):
        d.viewer = _login(d, "viewer")
        d.q.enqueue("job", {"n": 1}, idempotency_key="order-1")
    path = data.draw(st.sampled_from(["/tasks", "/charts", "/live"]), label="path")
    names = {"/tasks": ["status", "kind", "queue", "q", "before", "after", "limit", "page"],
             "/charts": ["window", "by", "from"], "/live": ["view", "v", "id", "before", "limit", "status"]}[path]
    params = data.draw(st.dictionaries(st.sampled_from(names), PARAM_TEXT, max_size=4), label="params")
    before = snapshot(d.dsn)
    with d.viewer.stream("GET", path, params=params, headers={"Accept": "text/html"}) as resp:
        # a viewer without read_payloads searches by id only: a number goes to its task (303),
        # other text is refused (403), since what it matches would give hidden keys away
        searched = (303, 403) if path == "/tasks" and params.get("q", "").strip() else ()
        assert resp.status_code in (200, 204, 404, 422, *searched), (path, params, resp.status_code)
        if path == "/live" and resp.status_code == 200:
            assert resp.headers["content-type"].startswith("text/event-stream")
        else:
            resp.read()
            assert resp.status_code != 200 or "Traceback" not in resp.text
    assert snapshot(d.dsn) == before


@FUZZ
@given(data=st.data())
def test_generated_bulk_posts_change_nothing_unless_genuine(dashboard, data):
    d = dashboard
    if not hasattr(d, "operator"):
        d.operator = _login(d, "operator")
        d.operator_csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', d.operator.get("/tasks").text).group(1)
        w = d.q.register_worker("fuzz")
        d.q.enqueue("job", {"n": 2})
        [c] = d.q.claim(w)
        d.q.fail(w, c, "boom", retry=False)
    action = data.draw(st.sampled_from(["requeue", "cancel", "reconcile", "pause", "x"]), label="action")
    ids = data.draw(st.lists(PARAM_TEXT, max_size=5) | st.just([str(i) for i in range(1, 300)]), label="ids")
    csrf = data.draw(st.one_of(st.just(d.operator_csrf), TEXT, st.none()), label="csrf")
    origin = data.draw(st.one_of(st.none(), st.sampled_from(d.origins())), label="origin")
    site = data.draw(st.one_of(st.none(), st.sampled_from(["same-origin", "cross-site"])), label="site")
    note = data.draw(st.one_of(TEXT, ODD_TEXT), label="note")
    headers = {"Origin": origin or "", "Sec-Fetch-Site": site or ""}
    headers = {k: v for k, v in headers.items() if v}
    form = {"ids": ids, "note": note} | ({"csrf": csrf} if csrf is not None else {})
    before = snapshot(d.dsn)
    resp = httpx.post(f"{d.url}/bulk/{action}", data=form, headers=headers, cookies=dict(d.operator.cookies))
    assert resp.status_code < 500, (action, form, headers, resp.status_code, resp.text[:300])
    genuine = (csrf == d.operator_csrf and origin in (None, d.url, f"{d.url}/") and site in (None, "same-origin")
               and (origin is not None or site is not None))
    if not genuine:
        assert 400 <= resp.status_code < 500, (action, headers, resp.status_code)
    if resp.status_code != 303:
        assert snapshot(d.dsn) == before
