"""Fuzzing the HTTP service: generated bodies, parameters and paths for every endpoint.

tests/service/test_hostile.py holds the hand-picked cases; here hypothesis
makes them up. The service runs for real (uvicorn on 127.0.0.1, both
backends). Every response must be below 500; an error must be a JSON
``{"error": {"code", "message"}}``; and a refused request must leave every
table as it was.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
import uvicorn
from hypothesis import given
from hypothesis import strategies as st

import leaseq
from leaseq import auth
from leaseq.service import create_app

from .support import JSONISH, NUMBERS, ODD_TEXT, TEXT, fuzz_settings, snapshot

FUZZ = fuzz_settings(60)
#: Everything JSON can carry, NUL and lone surrogates included (the service validates those itself).
JSON_VALUE = st.one_of(JSONISH, ODD_TEXT, NUMBERS.filter(lambda v: v == v and abs(v) != float("inf")),
                       st.sampled_from(["a\x00b", "\ud800", {"k\x00": 1}, ["\udc00"], 2**64, -(2**63) - 1]))
FIELDS = ["kind", "payload", "effect", "queue", "idempotency_key", "priority", "delay", "max_attempts",
          "lease_seconds", "limit", "generation", "result", "error", "retry", "block", "reason", "action", "key",
          "response", "leases", "name", "note", "outcome", "by", "older_than_seconds", "item", "after", "follow",
          "timeout"]


class Running:
    """The service over the test's queue, a worker holding a lease, and clients for each role."""

    def __init__(self, q: leaseq.Queue, dsn: str, url: str):
        self.q, self.dsn = q, dsn
        tokens = {role: auth.create_token(q, name=f"fuzz-{role}", role=role, created_by="fuzz", all_queues=True)[0]
                  for role in ("worker", "operator", "admin")}
        self.http = {role: httpx.Client(base_url=url, headers={"Authorization": f"Bearer {t}"}, timeout=10)
                     for role, t in tokens.items()}
        self.http["anonymous"] = httpx.Client(base_url=url, timeout=10)
        self.worker_id = self.http["worker"].post("/v1/workers", json={"name": "fuzz"}).json()["id"]
        q.enqueue("job", {"n": 1}, effect="side_effect", lease_seconds=600)
        self.task_id = q.enqueue("job", {"n": 2}).id
        claim = self.http["worker"].post(f"/v1/workers/{self.worker_id}/claim", json={"limit": 1}).json()
        self.running = claim["claims"][0]["task_id"]
        for client in self.http.values():  # first use of a token is recorded; later requests write nothing
            client.get("/v1/whoami")

    def paths(self) -> list[str]:
        w, t, r = self.worker_id, self.task_id, self.running
        return ["/v1/tasks", f"/v1/tasks/{t}", f"/v1/tasks/{t}/cancel", f"/v1/tasks/{t}/reconcile",
                f"/v1/tasks/{t}/unblock", f"/v1/tasks/{t}/requeue", "/v1/queues/default/pause", "/v1/workers",
                f"/v1/workers/{w}/claim", f"/v1/workers/{w}/renew", f"/v1/workers/{w}/tasks/{r}/complete",
                f"/v1/workers/{w}/tasks/{r}/fail", f"/v1/workers/{w}/tasks/{r}/release",
                f"/v1/workers/{w}/tasks/{r}/effects", f"/v1/workers/{w}/tasks/{r}/effects/1/response",
                "/v1/tokens", "/v1/prune", f"/v1/workers/{w}/revoke", f"/v1/workers/{w}/tasks/{r}/stream",
                f"/v1/tasks/{t}/stream", f"/v1/tasks/{r}/stream"]


@pytest.fixture
def service(q: leaseq.Queue, dsn: str) -> Iterator[Running]:
    # a stream that follows answers within half a second (then "reconnect"), not the default 25 s
    server = uvicorn.Server(uvicorn.Config(create_app(q, stream_seconds=0.5), host="127.0.0.1", port=0,
                                           log_level="critical",
                                           lifespan="on", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.005)
    running = Running(q, dsn, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}")
    yield running
    for client in running.http.values():
        client.close()
    server.should_exit = True
    thread.join(10)


@FUZZ
@given(data=st.data())
def test_generated_requests_never_break_the_service(service, data):
    path = data.draw(st.one_of(st.sampled_from(service.paths()),
                               st.sampled_from(service.paths()).map(lambda p: p.replace(str(service.running), "x"))
                               | st.one_of(TEXT, ODD_TEXT).map(lambda s: "/v1/tasks/" + quote(s, safe=""))),
                     label="path")
    method = data.draw(st.sampled_from(["POST", "POST", "GET", "DELETE"]), label="method")
    role = data.draw(st.sampled_from(["worker", "operator", "admin", "anonymous"]), label="role")
    names = data.draw(st.lists(st.sampled_from(FIELDS), max_size=5, unique=True), label="fields")
    body = {name: data.draw(JSON_VALUE, label=name) for name in names}
    if data.draw(st.booleans(), label="valid generation") and "generation" in body:
        body["generation"] = 1
    before = snapshot(service.dsn)
    if method == "GET":
        params = {k: str(v)[:200].encode("utf-8", "replace").decode() for k, v in body.items()}
        resp = service.http[role].get(path, params=params)
    else:  # ASCII JSON: lone surrogates travel as \ud800 escapes, as any client could send them
        resp = service.http[role].request(method, path, content=json.dumps(body).encode(),
                                          headers={"Content-Type": "application/json"})
    assert resp.status_code < 500, f"{method} {path} {body!r} -> {resp.status_code} {resp.text[:300]}"
    if resp.status_code >= 400:
        error = resp.json()["error"]
        assert error["code"] and error["message"], resp.text
        assert snapshot(service.dsn) == before, f"{method} {path} {body!r} refused ({resp.text[:200]}) but wrote"
