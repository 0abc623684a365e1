"""What one token may hold waiting, and what wakes a wait (leaseq.service.wakeups).

* Past ``waits_per_token`` waiting requests (task waits, long-poll claims,
  live streams together) a token's next one is refused with 429 and
  ``Retry-After``; another token still gets through, until the process
  holds ``waits_per_process``.
* A task wait is woken by its own task's notification, not by every
  NOTIFY: each look after a wait's first is charged to its token's bucket
  of looks, so a token whose wait was never woken was charged none.
* The looks are paced by a bucket of their own: a worker whose long polls
  are woken by a busy queue still gets its completions through.
* However many requests wait, the service holds one listening connection
  for all of them (no connection per wait), the one the process's own waits
  (through the queue itself) share.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

import leaseq
from pg_modes import own_connection

from .conftest import Service, serve
from .support import dashboard_login


class Held(threading.Thread):
    """One waiting request in a thread; ``response`` once it answered."""

    def __init__(self, client: httpx.Client, method: str, path: str, **kwargs: Any):
        super().__init__(daemon=True)
        self.client, self.method, self.path, self.kwargs = client, method, path, kwargs
        self.response: httpx.Response | None = None

    def run(self) -> None:
        self.response = self.client.request(self.method, self.path, **self.kwargs)


def _until(predicate: Any, timeout: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _refused_past_the_cap(resp: httpx.Response) -> None:
    assert resp.status_code == 429, (resp.status_code, resp.text[:300])
    assert resp.json()["error"]["code"] == "rate_limited"
    assert int(resp.headers["Retry-After"]) >= 1


def test_a_token_past_its_cap_of_waits_and_claims_gets_429_with_retry_after(q: leaseq.Queue, dsn: str) -> None:
    with serve(q, waits_per_token=2, waits_per_process=3, claim_recheck=0.2) as (url, app):
        s = Service(url, app, q, dsn)
        try:
            signal = app.state.work_signal
            viewer, worker = s.token("viewer"), s.token("worker", all_queues=True)
            task = q.enqueue("idle", {})
            http = s.http(viewer)
            held = [Held(s.http(viewer), "GET", f"/v1/tasks/{task.id}/wait", params={"timeout": 8})]
            held[0].start()
            wid = s.remote(worker).register_worker("poller").id
            held.append(Held(s.http(worker), "POST", f"/v1/workers/{wid}/claim", json={"queue": "none", "wait": 8}))
            held[1].start()
            _until(lambda: signal.held == 2, what="two waiting requests")
            held.append(Held(s.http(viewer), "GET", f"/v1/tasks/{task.id}/wait", params={"timeout": 8}))
            held[2].start()
            _until(lambda: signal.held == 3, what="the viewer's second wait")
            # the viewer holds two: its third is refused at once, and so is a claim past the process's three
            started = time.monotonic()
            _refused_past_the_cap(http.get(f"/v1/tasks/{task.id}/wait", params={"timeout": 8}))
            _refused_past_the_cap(s.http(worker).post(f"/v1/workers/{wid}/claim", json={"queue": "none", "wait": 8}))
            _refused_past_the_cap(s.http(s.token("viewer")).get(f"/v1/tasks/{task.id}/wait", params={"timeout": 8}))
            assert time.monotonic() - started < 3
            # a refused claim leased nothing, and a wait that looks once (timeout 0) still answers
            assert http.get(f"/v1/tasks/{task.id}/wait", params={"timeout": 0}).status_code == 429
            q.cancel(task.id)  # the held waits end; the claim's time runs out
            for h in held:
                h.join(15)
                assert h.response is not None and h.response.status_code == 200, h.response
            _until(lambda: signal.held == 0, what="the slots given back")
            assert http.get(f"/v1/tasks/{task.id}/wait", params={"timeout": 1}).json()["settled"] is True
        finally:
            s.close()


def test_a_live_stream_past_the_cap_gets_429_with_retry_after(q: leaseq.Queue, dsn: str) -> None:
    with serve(q, waits_per_token=1, live_interval=0.1, live_stream_seconds=30) as (url, app):
        s = Service(url, app, q, dsn)
        token = s.token("viewer")
        browser = dashboard_login(url, token)
        try:
            with browser.stream("GET", "/live", params={"view": "overview"}) as first:
                assert first.status_code == 200
                _until(lambda: app.state.work_signal.held == 1, what="the stream holding its slot")
                second = browser.get("/live", params={"view": "overview"})
                _refused_past_the_cap(second)
                # the token's long poll counts against the same cap
                task = q.enqueue("idle", {})
                _refused_past_the_cap(s.http(token).get(f"/v1/tasks/{task.id}/wait", params={"timeout": 5}))
        finally:
            browser.close()
            s.close()


def _looks_taken(app: Any, token: str) -> float:
    """How much of its bucket of looks ``token``'s waiting requests have spent (the requests
    themselves spend from another)."""
    found = app.state.access.looks._buckets.get(token.split("_")[1])
    return 0.0 if found is None else app.state.access.looks.burst - float(found[0])


def test_a_wait_is_woken_by_its_own_task_not_by_every_notify(q: leaseq.Queue, dsn: str) -> None:
    if not q.capabilities.listen_notify:
        pytest.skip("SQLite cannot notify: its waits look again every re-check")
    # a bucket that does not refill in the test's time: each look a wait takes after its first is counted
    with serve(q, rate_per_second=0.001, burst=1000) as (url, app):
        s = Service(url, app, q, dsn)
        try:
            signal = app.state.work_signal
            mine, other = q.enqueue("mine", {}, queue="held"), q.enqueue("other", {}, queue="held")
            token_mine, token_other = s.token("viewer"), s.token("viewer")
            waits = [Held(s.http(token_mine), "GET", f"/v1/tasks/{mine.id}/wait", params={"timeout": 20}),
                     Held(s.http(token_other), "GET", f"/v1/tasks/{other.id}/wait", params={"timeout": 20})]
            for h in waits:
                h.start()
            _until(lambda: signal.held == 2 and len(signal._listened) == 2, what="both waits listened for")
            # notifications, but none of the other task's own: work enqueued, tasks ending, its neighbour's end
            noise = [q.enqueue("noise", {}) for _ in range(20)]
            w = q.register_worker("w")
            for c in q.claim(w, limit=20):
                q.complete(w, c)
            changed = time.monotonic()
            q.cancel(mine.id)
            waits[0].join(10)
            assert waits[0].response is not None and waits[0].response.json()["settled"] is True
            assert time.monotonic() - changed < 2.0  # woken by its task's channel: no re-check comes in 20 s
            assert signal.notifications >= 1
            # the other wait never looked again: its token was charged no look
            assert _looks_taken(app, token_other) < 0.5, _looks_taken(app, token_other)
            assert waits[1].is_alive()
            q.cancel(other.id)
            waits[1].join(10)
            assert waits[1].response is not None and waits[1].response.json()["settled"] is True
        finally:
            s.close()


def test_many_waits_hold_one_listening_connection(q: leaseq.Queue, dsn: str) -> None:
    if not q.capabilities.listen_notify:
        pytest.skip("SQLite has no server connections")
    with own_connection(dsn, autocommit=True) as conn:
        before = {r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()").fetchall()}
    with serve(q) as (url, app):
        s = Service(url, app, q, dsn)
        try:
            tasks = [q.enqueue("idle", {}) for _ in range(60)]
            token = s.token("viewer")
            waits = [Held(s.http(token), "GET", f"/v1/tasks/{t.id}/wait", params={"timeout": 20}) for t in tasks]
            for h in waits:
                h.start()
            # and the application's own wait in the same process, through the queue itself
            own = q.enqueue("own", {})
            own_wait = threading.Thread(target=q.wait, args=(own.id,), kwargs={"timeout": 20}, daemon=True)
            own_wait.start()
            _until(lambda: app.state.work_signal.held == 60, what="sixty waits")
            _until(lambda: len(app.state.work_signal._listened) == 60, what="sixty tasks listened for")
            with own_connection(dsn, autocommit=True) as conn:
                _until(lambda: conn.execute("SELECT watched FROM leaseq_tasks WHERE id = %s",
                                            (own.id,)).fetchone()[0], what="the application's own wait")
            with own_connection(dsn, autocommit=True) as conn:
                now = {r[0]: r[1] for r in conn.execute(
                    "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database()").fetchall()}
            listening = [pid for pid, query in now.items() if pid not in before and "LISTEN" in (query or "")]
            assert len(listening) == 1, listening
            # the test's own queue and the service share this process: the pools (blocking and asyncio,
            # 10 each) and the one listener are all the new connections sixty waits brought
            assert len(set(now) - before) <= 10 + 10 + 1, len(set(now) - before)
            for t in [*tasks, own]:
                q.cancel(t.id)
            for h in waits:
                h.join(10)
                assert h.response is not None and h.response.json()["settled"] is True
            own_wait.join(10)
            assert not own_wait.is_alive()
        finally:
            s.close()


def test_waits_end_when_the_listening_connection_is_terminated(q: leaseq.Queue, dsn: str) -> None:
    """The service's one listening connection is terminated while requests wait: a task that
    ends before it is back (its NOTIFY goes nowhere) and one that ends after both answer
    settled, woken (their re-check is an hour away), and one connection listens again."""
    if not q.capabilities.listen_notify:
        pytest.skip("SQLite has no server connections")
    with serve(q) as (url, app):
        s = Service(url, app, q, dsn)
        try:
            signal = app.state.work_signal
            early, late = q.enqueue("early", {}), q.enqueue("late", {})
            token = s.token("viewer")
            waits = {t.id: Held(s.http(token), "GET", f"/v1/tasks/{t.id}/wait", params={"timeout": 20})
                     for t in (early, late)}
            for h in waits.values():
                h.start()
            _until(lambda: len(signal._listened) == 2, what="both waits listened for")
            with own_connection(dsn, autocommit=True) as conn:
                [pid] = [r[0] for r in conn.execute(  # the queue's connections carry its schema's name
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND "
                    "application_name = current_setting('application_name') AND query ~ '^(UN)?LISTEN'"
                ).fetchall()]
                assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
            q.cancel(early.id)
            waits[early.id].join(10)
            assert waits[early.id].response is not None and waits[early.id].response.json()["settled"] is True
            _until(lambda: signal.listening.is_set(), what="the listener back")
            assert waits[late.id].is_alive()
            changed = time.monotonic()
            q.cancel(late.id)
            waits[late.id].join(10)
            assert waits[late.id].response is not None and waits[late.id].response.json()["settled"] is True
            assert time.monotonic() - changed < 2.0
        finally:
            s.close()


def test_a_client_that_honours_retry_after_finds_its_connection_still_open(tmp_path) -> None:
    """Sleeping the cap's ``Retry-After`` on a keep-alive connection, then asking again on it, is
    answered: the server keeps an idle connection open longer than it asks clients to wait
    (uvicorn's own 5 s equals the 5 s asked, and the close met the next request). The
    connection is the server's, whatever the backend: checked on one."""
    import socket
    from urllib.parse import urlsplit

    from leaseq.service.app import KEEP_ALIVE_SECONDS
    from leaseq.service.wakeups import CAP_RETRY_AFTER

    assert KEEP_ALIVE_SECONDS >= 2 * CAP_RETRY_AFTER + 5  # the longest a refusal asks for, and then some
    with leaseq.connect(f"sqlite:///{tmp_path / 'leaseq.db'}") as q:
        q.migrate()
        with serve(q) as (url, _app):
            where = urlsplit(url)
            request = f"GET /healthz HTTP/1.1\r\nHost: {where.netloc}\r\n\r\n".encode()
            with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
                for pause in (CAP_RETRY_AFTER + 0.5, 0):  # the keep-alive's old length, passed
                    sock.sendall(request)
                    answer = _one_response(sock)
                    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
                    time.sleep(pause)


def _one_response(sock) -> bytes:
    """One whole HTTP/1.1 response read off ``sock`` (its head, then the body its Content-Length
    gives): the server may send them in separate segments, and what is left unread would be
    taken for the next answer's start."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_workers_waiting_claims_never_spend_what_its_requests_may(q: leaseq.Queue, dsn: str) -> None:
    """Looks taken by a token's waiting claims are paced by a bucket of their own: a worker
    whose long polls keep being woken (a busy queue, tasks of kinds it has no handler for)
    still gets its renewals and completions through, where they used to find the token's
    bucket spent (429, and a second's wait in the client)."""
    with serve(q, rate_per_second=1, burst=10, looks_per_second=1, looks_burst=10,
               claim_recheck=0.05) as (url, app):
        s = Service(url, app, q, dsn)
        try:
            token = s.token("worker", queues=["own", "busy"])
            client = s.http(token)
            wid = client.post("/v1/workers", json={"name": "busy"}).json()["id"]
            task = q.enqueue("mine", {}, queue="own", lease_seconds=60)
            [claim] = client.post(f"/v1/workers/{wid}/claim", json={"queue": "own"}).json()["claims"]
            waits = [Held(s.http(token), "POST", f"/v1/workers/{wid}/claim",
                          json={"queue": "busy", "kinds": ["no-such-kind"], "wait": 20}) for _ in range(3)]
            for h in waits:
                h.start()
            _until(lambda: app.state.work_signal.waiting == 3, what="three waiting claims")
            for n in range(30):  # woken again and again by work none of them may take
                q.enqueue("other", {"n": n}, queue="busy")
            _until(lambda: _looks_taken(app, token) >= 9, what="the looks to spend their bucket")
            renew = {"leases": [{"task_id": task.id, "generation": claim["generation"]}]}
            answer = client.post(f"/v1/workers/{wid}/renew", json=renew)
            assert answer.status_code == 200, (answer.status_code, answer.text[:300])
            assert [r["task_id"] for r in answer.json()["renewed"]] == [task.id]
            assert client.post(f"/v1/workers/{wid}/claim/interrupt").status_code == 200
            for h in waits:
                h.join(10)
                assert h.response is not None and h.response.status_code == 200
        finally:
            s.close()


def test_a_refusal_past_the_cap_is_answered_before_routing(q: leaseq.Queue) -> None:
    """A waiting request past its token's cap is refused by the service's first layer
    (leaseq.service.app.WaitCapGate), before routing, validation, dependencies or the
    token's lookup: a flood of them costs the process little. A request that does not
    wait, or whose token has room, reaches its route, its body whole."""
    import asyncio
    import json

    from leaseq import auth
    from leaseq.service import create_app

    app = create_app(q, waits_per_token=1)
    token, record = auth.create_token(q, name="w", role="worker", created_by="test", all_queues=True)
    other, _ = auth.create_token(q, name="v", role="viewer", created_by="test")

    async def call(secret: str, method: str, path: str, query: bytes = b"", body: Any = None) -> dict[str, Any]:
        raw = b"" if body is None else json.dumps(body).encode()
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "",
            "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {secret}".encode()),
                        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
            "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 80)}
        given, out = [{"type": "http.request", "body": raw, "more_body": False}], {"body": b""}

        async def receive() -> dict[str, Any]:
            return given.pop(0) if given else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                out["status"], out["headers"] = message["status"], dict(message["headers"])
            else:
                out["body"] += message.get("body", b"")

        await app(scope, receive, send)
        return {**out, "routed": "endpoint" in scope}  # the router names the endpoint it matched

    async def check() -> None:
        async with app.router.lifespan_context(app):
            worker = q.register_worker("w", token_id=record["id"])
            with app.state.work_signal.slot(record["id"]):
                # past the cap: refused unrouted, even a claim whose body its route would refuse (limit 0)
                for method, path, query, body in (
                        ("GET", "/v1/tasks/1/wait", b"timeout=25", None),
                        ("GET", "/v1/tasks/1/stream", b"", None),
                        ("POST", f"/v1/workers/{worker.id}/claim", b"", {"queue": "bait", "wait": 30}),
                        ("POST", f"/v1/workers/{worker.id}/claim", b"", {"queue": "bait", "wait": 5, "limit": 0})):
                    answer = await call(token, method, path, query, body)
                    assert (answer["status"], answer["routed"]) == (429, False), (path, body, answer)
                    assert json.loads(answer["body"])["error"]["code"] == "rate_limited"
                    assert int(answer["headers"][b"retry-after"]) >= 5
                # a claim that does not wait reaches its route, body whole; so does another token's wait
                answer = await call(token, "POST", f"/v1/workers/{worker.id}/claim", body={"queue": "bait", "limit": 3})
                assert (answer["status"], answer["routed"]) == (200, True), answer
                answer = await call(other, "GET", "/v1/tasks/1/wait", b"timeout=0")
                assert answer["routed"] and answer["status"] == 404, answer  # routed: there is no task 1

    asyncio.run(check())
