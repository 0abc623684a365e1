"""The service's edges: failed-authentication limits, the rate-limit table's bound,
forwarded headers, /docs, names matched whole, and token files.

Every HTTP test runs a real uvicorn (the ``svc`` fixture, or a real
``leaseq serve`` process) and sends real requests from 127.0.0.1, the one
shared address every client here has, as behind a load balancer.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from click.testing import CliRunner

import leaseq
from leaseq.cli.main import cli
from leaseq.service.access import TokenBuckets

from .conftest import Service, serve
from .support import error_of, snapshot


def _bad_requests(worker_token: str) -> list[dict[str, str]]:
    """Headers of requests that fail authentication in every way there is."""
    token_id = worker_token.split("_")[1]
    return [
        {},  # no credential
        {"Authorization": "Bearer not-a-token"},
        {"Authorization": "Basic abc"},
        {"Authorization": f"Bearer lq_{secrets.token_hex(6)}_{secrets.token_hex(32)}"},  # unknown id
        {"Authorization": f"Bearer lq_{token_id}_{secrets.token_hex(32)}"},  # the worker's own id, wrong secret
    ]


@pytest.fixture
def slow_refill(q: leaseq.Queue, dsn: str) -> Iterator[Service]:
    """The service with the default failure burst (20) and almost no refill, so a
    slow, loaded machine cannot refill a bucket between two requests."""
    with serve(q, failed_auth_per_second=0.01) as (url, app):
        s = Service(url, app, q, dsn)
        try:
            yield s
        finally:
            s.close()


def test_a_flood_of_failed_authentications_never_refuses_a_valid_worker(slow_refill: Service) -> None:
    """Behind one shared address, bad requests (missing, malformed, unknown and
    forged tokens, even a forged secret for the worker's own token id) are
    limited, and a valid worker's renewals keep being accepted, during the flood
    and after it: failures are counted by what failed, not by address."""
    svc = slow_refill
    token = svc.token("worker", "steady", all_queues=True)
    worker = svc.http(token)
    wid = worker.post("/v1/workers", json={"name": "steady"}).json()["id"]
    task = svc.q.enqueue("job", lease_seconds=60)
    [claim] = worker.post(f"/v1/workers/{wid}/claim", json={}).json()["claims"]
    renew = {"leases": [{"task_id": task.id, "generation": claim["generation"]}]}
    bad = _bad_requests(token)

    # first exhaust every failure bucket there is, one request after another
    seen = {401: 0, 429: 0}
    with httpx.Client(base_url=svc.url, timeout=10) as client:
        for i in range(150):
            resp = client.post(f"/v1/workers/{wid}/renew", json=renew, headers=bad[i % len(bad)])
            seen[resp.status_code] += 1
    assert seen[429] >= 150 - 2 * 20 - 2, seen  # the limit is in force for the failing requests...
    resp = worker.post(f"/v1/workers/{wid}/renew", json=renew)
    assert resp.status_code == 200, resp.text  # ...and not for the valid worker at the same address
    assert [r["task_id"] for r in resp.json()["renewed"]] == [task.id]

    # then a flood racing the worker's renewals
    stop = threading.Event()
    flood_codes: list[int] = []

    def flood(offset: int) -> None:
        with httpx.Client(base_url=svc.url, timeout=10) as client:
            i = offset
            while not stop.is_set():
                flood_codes.append(client.post(f"/v1/workers/{wid}/renew", json=renew,
                                               headers=bad[i % len(bad)]).status_code)
                i += 1

    threads = [threading.Thread(target=flood, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    try:
        # the renewals race a flood already under way (a flood client's start-up can outlast them)
        deadline = time.monotonic() + 10
        while len(flood_codes) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        codes = [worker.post(f"/v1/workers/{wid}/renew", json=renew).status_code for _ in range(40)]
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert codes == [200] * 40, codes
    assert set(flood_codes) <= {401, 429} and flood_codes.count(429) > 0, set(flood_codes)
    assert worker.post(f"/v1/workers/{wid}/tasks/{task.id}/complete",
                       json={"generation": claim["generation"]}).status_code == 200
    assert svc.q.get(task.id).status == "completed"


def test_failures_are_counted_per_failing_token_not_per_address(q: leaseq.Queue) -> None:
    """A token whose secret keeps failing is limited on its own: other tokens'
    failures from the same address still get their 401 (not a 429), and a
    missing or unknown token is counted by address, apart from the token ids."""
    with serve(q, failed_auth_burst=3, failed_auth_per_second=0.01) as (url, _):
        from leaseq import auth

        a, _ = auth.create_token(q, name="a", role="worker", created_by="test", all_queues=True)
        b, _ = auth.create_token(q, name="b", role="worker", created_by="test", all_queues=True)

        def status(token: str) -> int:
            return httpx.get(f"{url}/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status_code

        forged_a = f"lq_{a.split('_')[1]}_{'0' * 64}"
        forged_b = f"lq_{b.split('_')[1]}_{'0' * 64}"
        unknown = f"lq_{'0' * 12}_{'0' * 64}"
        assert [status(forged_a) for _ in range(5)] == [401, 401, 401, 429, 429]
        assert status(forged_b) == 401 and status(unknown) == 401  # their own buckets
        assert [status(unknown) for _ in range(3)] == [401, 401, 429]  # unknown ids share the address bucket
        assert status("malformed") == 429  # as do malformed ones
        assert status(forged_b) == 401
        assert status(a) == 200 and status(b) == 200  # valid credentials are never refused by failures
        resp = httpx.get(f"{url}/v1/whoami", headers={"Authorization": f"Bearer {forged_a}"})
        assert error_of(resp)["code"] == "rate_limited" and int(resp.headers["retry-after"]) >= 1


def test_the_rate_limit_table_is_bounded_and_constant_time() -> None:
    """Every new key (an address, a token id) adds one bucket; past the bound the
    least recently used goes, in O(1): no rebuild of the table under its lock."""
    buckets = TokenBuckets(rate=0.001, burst=1)  # each key spends its only token: nothing refills
    bound = buckets.max_keys
    for i in range(bound + 10_000):
        assert buckets.take(f"addr:{i}") == 0
    assert len(buckets) == bound
    assert buckets.take(f"addr:{bound + 9_999}") > 0  # a recent key keeps its state
    assert buckets.take("addr:0") == 0  # the oldest was dropped, and comes back full
    started = time.perf_counter()
    for i in range(20_000):
        buckets.take(f"new:{i}")
    elapsed = time.perf_counter() - started
    assert len(buckets) == bound
    assert elapsed < 2.0, f"20,000 new keys at the bound took {elapsed:.2f}s"  # ~0.05 s; a rebuild each: minutes


def test_small_bounds_evict_least_recently_used_first() -> None:
    buckets = TokenBuckets(rate=0.001, burst=2, max_keys=3)
    for key in "abc":
        buckets.take(key)
    buckets.take("a")  # a is now the most recent, and empty
    buckets.take("d")  # evicts b, the least recently used
    assert len(buckets) == 3
    assert buckets.take("a") > 0  # kept: still empty
    assert buckets.take("b") == 0  # dropped: back at full


@contextmanager
def leaseq_serve(dsn: str, *options: str) -> Iterator[str]:
    """A real ``leaseq serve`` process on an ephemeral port; yields its URL."""
    env = dict(os.environ)
    env.pop("FORWARDED_ALLOW_IPS", None)
    proc = subprocess.Popen([sys.executable, "-m", "leaseq.cli", "--dsn", dsn, "serve", "--port", "0",
                             "--log-level", "warning", "--failed-auth-rate", "0.01", *options],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stderr.readline()
        m = re.search(r"listening on (http://\S+)", line)
        assert m, line + proc.stderr.read() if proc.poll() is not None else line
        yield m.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        proc.stderr.close()


def _forwarded_clients_are_told_apart(url: str) -> bool:
    """Exhaust the failure bucket of one forwarded address, then fail 15 times from
    another (under the burst of 20): all 401 means the second address has a bucket
    of its own (the header was believed); sharing the first's empty bucket, none does
    (the service under test refills a bucket once in 100 s)."""
    def fail_from(address: str) -> int:
        return httpx.get(f"{url}/v1/whoami",
                         headers={"Authorization": "Bearer junk", "X-Forwarded-For": address}).status_code

    assert [fail_from("10.0.0.1") for _ in range(40)][-1] == 429
    second = [fail_from("10.0.0.2") for _ in range(15)]
    assert set(second) <= {401, 429}
    assert second.count(401) in (0, 15), second
    return second.count(401) == 15


@pytest.mark.parametrize("dsn", ["sqlite"], indirect=True)  # HTTP plumbing: one backend is enough
def test_forwarded_headers_are_ignored_unless_configured(q: leaseq.Queue, dsn: str) -> None:
    """uvicorn alone believes X-Forwarded-For from 127.0.0.1; `leaseq serve`
    believes it from nobody unless --forwarded-allow-ips names the proxy."""
    with leaseq_serve(dsn) as url:
        assert not _forwarded_clients_are_told_apart(url)
        assert httpx.get(f"{url}/docs").status_code == 404  # Swagger UI (from a CDN) is off by default
        assert httpx.get(f"{url}/openapi.json").status_code == 200
    with leaseq_serve(dsn, "--forwarded-allow-ips", "127.0.0.1", "--docs") as url:
        assert _forwarded_clients_are_told_apart(url)
        assert httpx.get(f"{url}/docs").status_code == 200


def test_forwarded_proto_from_a_trusted_proxy_makes_the_session_cookie_secure(q: leaseq.Queue) -> None:
    from leaseq import auth

    token, _ = auth.create_token(q, name="v", role="viewer", created_by="test")
    for trusted, forwarded_proto, secure in (("", "https", False), ("127.0.0.1", "https", True),
                                             ("127.0.0.1", "http", False)):
        with serve(q, forwarded_allow_ips=trusted) as (url, _):
            proto = {"X-Forwarded-Proto": forwarded_proto}
            form = httpx.get(f"{url}/login", headers=proto)
            assert ("; secure" in form.headers["set-cookie"].lower()) == secure  # the login form's cookie too
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
            origin = ("https://" if secure else "http://") + url.split("://")[1]
            resp = httpx.post(f"{url}/login", data={"token": token, "csrf": csrf},
                              headers={**proto, "Origin": origin,
                                       "Cookie": f"leaseq_login={form.cookies['leaseq_login']}"})
            assert resp.status_code == 303, resp.text
            [cookie] = [c for c in resp.headers.get_list("set-cookie") if c.startswith("leaseq_session=")]
            assert ("; secure" in cookie.lower()) == secure, (trusted, forwarded_proto, cookie)
            assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower() and "Path=/" in cookie


# -- names are matched whole ------------------------------------------------------------

NEWLINE_NAMES = ["default\n", "default\r\n", "\ndefault", "mail\n"]


def test_a_name_with_a_trailing_newline_is_refused_by_the_library(q: leaseq.Queue, dsn: str) -> None:
    before = snapshot(dsn)
    for name in NEWLINE_NAMES:
        for call in (lambda: q.enqueue("job", queue=name), lambda: q.pause(name), lambda: q.resume(name),
                     lambda: q.register_worker(name), lambda: q.list_tasks(queue=name),
                     lambda: q.claim(q.register_worker("w"), queue=name)):
            with pytest.raises(leaseq.InvalidInput, match=r"must be 1-100 characters") as info:
                call()
            assert info.value.field in ("queue", "name")
    assert {k: v for k, v in snapshot(dsn).items() if k != "leaseq_workers"} == \
        {k: v for k, v in before.items() if k != "leaseq_workers"}
    assert [w.name for w in q.workers()] == ["w"] * len(NEWLINE_NAMES)


def test_a_name_with_a_trailing_newline_is_refused_by_the_cli(q: leaseq.Queue, dsn: str) -> None:
    before = snapshot(dsn)
    for args in (["pause", "default\n"], ["enqueue", "job", "--queue", "default\n"],
                 ["ls", "--queue", "default\n"], ["tokens", "create", "--role", "viewer", "--name", "v\n"]):
        result = CliRunner().invoke(cli, ["--dsn", dsn, *args])
        assert result.exit_code == 2, (args, result.output)
        assert re.match(r"error: (queue|name): must be 1-100 characters", result.stderr), result.stderr
    assert snapshot(dsn) == before


def test_a_name_with_a_trailing_newline_is_refused_over_http(svc: Service) -> None:
    operator = svc.http(svc.token("operator"))
    worker = svc.http(svc.token("worker", all_queues=True))
    wid = worker.post("/v1/workers", json={"name": "w"}).json()["id"]
    operator.get("/v1/queues").raise_for_status()  # first use is recorded once; later requests write nothing
    before = snapshot(svc.dsn)
    for resp, field in ((operator.post("/v1/tasks", json={"kind": "job", "queue": "default\n"}), "queue"),
                        (operator.post("/v1/queues/default%0A/pause"), "path.name"),
                        (operator.get("/v1/tasks", params={"queue": "default\n"}), "queue"),
                        (worker.post(f"/v1/workers/{wid}/claim", json={"queue": "default\n"}), "queue"),
                        (worker.post(f"/v1/workers/{wid}%0A/claim", json={}), "path.worker_id"),
                        (worker.post("/v1/workers", json={"name": "w\n"}), "name")):
        assert resp.status_code == 422, resp.text
        assert error_of(resp)["field"] == field, resp.text
    assert snapshot(svc.dsn) == before
    # and so "default\n" cannot stay claimable while "default" is paused
    operator.post("/v1/queues/default/pause", json={"create": True}).raise_for_status()
    assert [(r["name"], bool(r["paused"])) for r in svc.q.queues()] == [("default", True)]


# -- token files ------------------------------------------------------------------------

def test_tokens_create_output_writes_a_file_only_its_owner_can_read(q: leaseq.Queue, dsn: str, tmp_path) -> None:
    from leaseq import auth

    target = tmp_path / "worker.token"
    old = os.umask(0o022)  # the usual umask: a shell redirect would make the file world-readable
    try:
        result = CliRunner().invoke(cli, ["--dsn", dsn, "tokens", "create", "--role", "worker", "--queue", "ci",
                                          "--name", "ci",
                                          "--output", str(target)])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and "mode 0600" in result.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    token = target.read_text().strip()
    assert auth.verify_token(q, token).name == "ci"
    # never overwritten, and a refused create leaves no token behind
    tokens_before = len(auth.list_tokens(q))
    again = CliRunner().invoke(cli, ["--dsn", dsn, "tokens", "create", "--role", "worker", "--queue", "ci",
                                     "--name", "ci2",
                                     "--output", str(target)])
    assert again.exit_code == 2 and again.stderr.startswith("error: output: ") and "already exists" in again.stderr
    bad = CliRunner().invoke(cli, ["--dsn", dsn, "tokens", "create", "--role", "worker", "--queue", "ci",
                                   "--name", "bad name",
                                   "--output", str(tmp_path / "other.token")])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: name: ")
    assert not (tmp_path / "other.token").exists()
    assert len(auth.list_tokens(q)) == tokens_before and target.read_text().strip() == token


def test_revoking_a_worker_with_its_token_stops_it_registering_again(q: leaseq.Queue, dsn: str) -> None:
    """Revoking one worker leaves its token able to register a new worker and claim;
    `leaseq tokens revoke --worker ID` revokes the token behind it, and all its workers."""
    from leaseq import auth

    token, record = auth.create_token(q, name="ci", role="worker", created_by="test", all_queues=True)
    w1 = q.register_worker("w", token_id=record["id"])
    w2 = q.register_worker("w", token_id=record["id"])
    q.revoke_worker(w1)
    assert auth.verify_token(q, token).token_id == record["id"]  # the token still works: a new worker could claim
    result = CliRunner().invoke(cli, ["--dsn", dsn, "tokens", "revoke", "--worker", w1.id])
    assert result.exit_code == 0, result.output
    assert record["id"] in result.output and w2.id in result.output
    with pytest.raises(auth.Unauthorized, match="revoked"):
        auth.verify_token(q, token)
    assert all(w.revoked_at is not None for w in q.workers())
    for args in (["tokens", "revoke"], ["tokens", "revoke", record["id"], "--worker", w1.id],
                 ["tokens", "revoke", "--worker", "nobody-000000000000"]):
        bad = CliRunner().invoke(cli, ["--dsn", dsn, *args])
        assert bad.exit_code == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1, \
            (args, bad.output)


def test_remote_queue_goes_through_the_proxy_the_environment_names(svc, monkeypatch) -> None:
    token = svc.token("worker", all_queues=True)
    with socket.socket() as closed:  # a port nothing listens on: the proxy is down
        closed.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.setenv("HTTP_PROXY", proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(leaseq.BackendUnavailable):
        svc.remote(token).whoami()  # through the proxy, which is down
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert svc.remote(token).whoami()["role"] == "worker"  # NO_PROXY: straight to the service
