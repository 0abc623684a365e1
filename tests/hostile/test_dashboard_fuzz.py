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
