"""FencingMiddleware behind a real uvicorn server on 127.0.0.1, with httpx as the client.

The first half runs the explicit opt-out (``insecure_trust_all_callers``,
headers believed as sent) to exercise the fence and the replay rules; the
second half the safe set-up, with signed action tokens."""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.applications import Starlette
from starlette.routing import Route

import leaseq
from leaseq.fencing import ActionSigner, FencedStore, FencingMiddleware, fence_grant, route_param

from .conftest import add_entry, ledger, marker

NOW_SECRET = bytes(range(32))


@contextmanager
def serve(app) -> Iterator[httpx.Client]:
    """Run ``app`` under uvicorn on a free port of 127.0.0.1; yield a client for it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # listening before the server starts: requests queue, no wait needed
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=20) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def account_of(scope) -> str | None:
    parts = scope["path"].strip("/").split("/")
    return f"account:{parts[1]}" if len(parts) >= 2 and parts[0] == "accounts" else None


def bank_app(store: FencedStore, **options) -> tuple[FastAPI, itertools.count]:
    """A FastAPI service whose handlers write through the fence's connection (atomic mode)."""
    app = FastAPI()
    calls = itertools.count(1)
    p = marker(store)

    def balance(conn, name: str) -> int:
        return conn.execute(f"SELECT coalesce(sum(amount), 0) FROM ledger WHERE account = {p}", (name,)).fetchone()[0]

    @app.post("/accounts/{name}/deposit")
    def deposit(name: str, amount: int, request: Request):
        grant = fence_grant(request)
        if grant is None:  # an unfenced request: the service's own transaction
            with store.transaction() as conn:
                add_entry(conn, store, name, amount, "unfenced")
                return {"account": name, "balance": balance(conn, name), "call": next(calls)}
        add_entry(grant.connection, store, name, amount, str(grant.fencing_token))
        return {"account": name, "balance": balance(grant.connection, name), "call": next(calls)}

    @app.post("/accounts/{name}/reject")
    def reject(name: str, request: Request):
        add_entry(fence_grant(request).connection, store, name, 1000)
        return JSONResponse({"detail": "insufficient funds"}, status_code=400)

    @app.post("/accounts/{name}/boom")
    def boom(name: str, request: Request):
        add_entry(fence_grant(request).connection, store, name, 1000)
        raise RuntimeError("handler failed")

    @app.get("/accounts/{name}")
    def show(name: str, request: Request):
        assert fence_grant(request) is None
        with store.transaction() as conn:
            return {"balance": balance(conn, name)}

    @app.post("/plain")
    def plain(request: Request):
        return {"fenced": fence_grant(request) is not None}

    options.setdefault("insecure_trust_all_callers", True)
    options.setdefault("exempt", ["POST /plain"])   # no account in its path: let through unfenced
    app.add_middleware(FencingMiddleware, store=store, resource=account_of, **options)
    return app, calls


@pytest.fixture
def bank(store) -> Iterator[httpx.Client]:
    app, _ = bank_app(store, require_token=False)
    with serve(app) as client:
        yield client


def post(client, path: str, token=None, key=None, **headers):
    if token is not None:  # attempts of task 1
        headers["Leaseq-Fencing-Token"] = f"1.{token}"
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post(path, headers=headers)


def test_a_fresh_request_runs_and_a_repeated_key_is_replayed(bank, store):
    first = post(bank, "/accounts/alice/deposit?amount=10", token=3, key="dep-1")
    assert first.status_code == 200 and first.json() == {"account": "alice", "balance": 10, "call": 1}
    assert "idempotent-replayed" not in first.headers
    again = post(bank, "/accounts/alice/deposit?amount=10", token=3, key="dep-1")
    assert again.status_code == 200 and again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["content-type"] == "application/json"
    assert ledger(store) == [("alice", 10, "1.3")]
    assert store.newest_generation("account:alice", 1) == 3


def test_a_stale_token_gets_409_and_changes_nothing(bank, store):
    assert post(bank, "/accounts/alice/deposit?amount=5", token=5).status_code == 200
    stale = post(bank, "/accounts/alice/deposit?amount=7", token=4, key="late")
    assert stale.status_code == 409
    error = stale.json()["error"]
    assert error["code"] == "stale_token"
    assert "account:alice" in error["message"] and "4" in error["message"] and "5" in error["message"]
    assert ledger(store) == [("alice", 5, "1.5")]
    assert store.outcome("late") is None
    assert post(bank, "/accounts/alice/deposit?amount=7", token=6).json()["call"] == 2


@pytest.mark.parametrize("header, value", [
    ("Leaseq-Fencing-Token", "abc"), ("Leaseq-Fencing-Token", "-1"), ("Leaseq-Fencing-Token", "1.5.2.3"),
    ("Leaseq-Fencing-Token", ""), ("Leaseq-Fencing-Token", "1.99999999999999999999"),
    ("Leaseq-Fencing-Token", "1.9223372036854775808"), ("Leaseq-Fencing-Token", "7"),
    ("Leaseq-Fencing-Token", "1.-2"), ("Leaseq-Fencing-Token", "+1.2"), ("Idempotency-Key", "x" * 256),
    ("Idempotency-Key", "has space"),
])
def test_malformed_headers_get_400(bank, store, header, value):
    response = bank.post("/accounts/alice/deposit?amount=1", headers={header: value})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid" and header in response.json()["error"]["message"]
    assert ledger(store) == []


def test_error_responses_and_exceptions_roll_the_fence_back(bank, store):
    rejected = post(bank, "/accounts/alice/reject", token=9, key="k")
    assert rejected.status_code == 400 and rejected.json() == {"detail": "insufficient funds"}
    # uvicorn closes the connection after an app raises; don't let the client reuse it.
    boom = post(bank, "/accounts/alice/boom", token=9, key="k", Connection="close")
    assert boom.status_code == 500
    assert ledger(store) == [] and store.newest_generation("account:alice", 1) is None and store.outcome("k") is None
    # Nothing was recorded, so the key is still free for a successful retry.
    ok = post(bank, "/accounts/alice/deposit?amount=1", token=1, key="k")
    assert ok.status_code == 200 and ok.json()["call"] == 1


def test_unguarded_requests_pass_through(bank, store):
    post(bank, "/accounts/alice/deposit?amount=3", token=8)
    assert bank.get("/accounts/alice", headers={"Leaseq-Fencing-Token": "1.1"}).json() == {"balance": 3}
    assert bank.post("/plain", headers={"Leaseq-Fencing-Token": "1.1"}).json() == {"fenced": False}
    assert bank.post("/accounts/alice/deposit?amount=2").json()["call"] == 2   # no headers: unfenced
    assert store.newest_generation("account:alice", 1) == 8


def test_a_key_reused_for_another_resource_gets_422(bank):
    assert post(bank, "/accounts/alice/deposit?amount=1", token=1, key="k").status_code == 200
    reused = post(bank, "/accounts/bob/deposit?amount=1", token=1, key="k")
    assert reused.status_code == 422 and reused.json()["error"]["code"] == "idempotency_key_reused"


def test_concurrent_requests_with_one_key_run_the_handler_once(bank, store):
    barrier = threading.Barrier(8)
    responses = []

    def send():
        barrier.wait()
        responses.append(post(bank, "/accounts/carol/deposit?amount=4", token=2, key='"same"'))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.status_code for r in responses] == [200] * 8
    assert len({r.content for r in responses}) == 1
    assert sum("idempotent-replayed" not in r.headers for r in responses) == 1
    assert ledger(store) == [("carol", 4, "1.2")]
    assert store.outcome("same", 1) is not None    # the quoted header form names key `same` (kept per task)


def test_unfenced_writes_are_refused_by_default_even_when_trusting_callers(store):
    app, _ = bank_app(store)
    with serve(app) as client:
        missing = post(client, "/accounts/alice/deposit?amount=1", key="k")
        assert missing.status_code == 428 and missing.json()["error"]["code"] == "token_required"
        assert client.post("/plain").status_code == 200             # not a fenced resource
        assert ledger(store) == []


# Signed action tokens, on a plain Starlette app wrapped directly by the middleware.

def signed_app(store: FencedStore, signer: ActionSigner, **options):
    async def deposit(request):
        grant = fence_grant(request)
        add_entry(grant.connection, store, "dave", 1, str(grant.fencing_token))
        return JSONResponse({"task": grant.claims.task_id, "token": grant.fencing_token,
                             "key": grant.idempotency_key})

    async def boom(request):
        add_entry(fence_grant(request).connection, store, "dave", 1000)
        raise RuntimeError("handler failed")

    inner = Starlette(routes=[Route("/accounts/dave/deposit", deposit, methods=["POST"]),
                              Route("/accounts/dave/boom", boom, methods=["POST"])])
    return FencingMiddleware(inner, store=store, resource=account_of, signer=signer,
                             action=lambda scope: "deposit", **options)


def test_signed_action_tokens_are_required_and_scope_the_request(store):
    signer = ActionSigner({"k1": NOW_SECRET}, "k1")
    good = signer.issue(task_id=7, generation=4, action="deposit", idempotency_key="dep-7", ttl_seconds=60,
                        resource="account:dave")
    path = "/accounts/dave/deposit"
    with serve(signed_app(store, signer)) as client:
        def reason(response):
            assert response.status_code == 403, response.text
            assert response.json()["error"]["code"] == "forbidden"
            return response.json()["error"]["reason"]

        assert reason(client.post(path)) == "missing"
        # the signature's last two characters changed (a canonical ending that differs: one
        # signature in 1,024 already ends in "AA", and that "forgery" was the token itself)
        forged = good[:-2] + ("AE" if good.endswith("AA") else "AA")
        assert reason(client.post(path, headers={"Leaseq-Action-Token": forged})) == "forged"
        expired = signer.issue(7, 4, "deposit", "dep-7", 60, now=1_000_000, resource="account:dave")
        assert reason(client.post(path, headers={"Leaseq-Action-Token": expired})) == "expired"
        other = signer.issue(7, 4, "withdraw", "dep-7", 60, resource="account:dave")
        assert reason(client.post(path, headers={"Leaseq-Action-Token": other})) == "wrong_action"
        elsewhere = signer.issue(7, 4, "deposit", "dep-7", 60, resource="account:erin")
        assert reason(client.post(path, headers={"Leaseq-Action-Token": elsewhere})) == "wrong_resource"
        unbound = signer.issue(7, 4, "deposit", "dep-7", 60)
        assert reason(client.post(path, headers={"Leaseq-Action-Token": unbound})) == "unbound_resource"
        # A caller cannot raise its own fencing token past the signed generation.
        for raised in ("99", "7.99", "8.4", "9223372036854775807"):
            assert reason(client.post(path, headers={"Leaseq-Action-Token": good,
                                                     "Leaseq-Fencing-Token": raised})) == "wrong_generation"
        assert reason(client.post(path, headers={"Leaseq-Action-Token": good,
                                                 "Idempotency-Key": "other"})) == "wrong_idempotency_key"
        assert ledger(store) == []

        ok = client.post(path, headers={"Leaseq-Action-Token": good})
        assert ok.status_code == 200 and ok.json() == {"task": 7, "token": "7.4", "key": "dep-7"}
        # The same token with its fencing token spelt out is the same request.
        assert client.post(path, headers={"Leaseq-Action-Token": good, "Leaseq-Fencing-Token": "7.4"}
                           ).headers["idempotent-replayed"] == "true"
        replay = client.post(path, headers={"Leaseq-Action-Token": good})
        assert replay.headers["idempotent-replayed"] == "true" and replay.content == ok.content
        newer = signer.issue(7, 5, "deposit", "dep-7b", 60, resource="account:dave")
        assert client.post(path, headers={"Leaseq-Action-Token": newer}).status_code == 200
        stale = client.post(path, headers={"Leaseq-Action-Token": signer.issue(7, 4, "deposit", "dep-7c", 60,
                                                                               resource="account:dave")})
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_token"
        assert ledger(store) == [("dave", 1, "7.4"), ("dave", 1, "7.5")]
        # The wrapped app's own error page is passed on; the fence rolls back.
        crash = client.post("/accounts/dave/boom", headers={"Leaseq-Action-Token": signer.issue(
            7, 6, "deposit", "dep-7d", 60, resource="account:dave")})
        assert crash.status_code == 500
        assert store.newest_generation("account:dave", 7) == 5 and len(ledger(store)) == 2


# The safe set-up: what a caller without the queue's authority gets.

def test_the_middleware_will_not_start_without_a_signer_or_the_explicit_opt_out(store):
    with pytest.raises(leaseq.ConfigError, match="insecure_trust_all_callers"):
        FencingMiddleware(Starlette(), store=store, resource=account_of)
    with pytest.raises(leaseq.ConfigError, match="contradicts"):
        FencingMiddleware(Starlette(), store=store, resource=account_of,
                          signer=ActionSigner({"k1": NOW_SECRET}, "k1"), insecure_trust_all_callers=True)
    with pytest.raises(leaseq.InvalidInput, match="leeway_seconds"):
        FencingMiddleware(Starlette(), store=store, resource=account_of, action=lambda scope: "deposit",
                          signer=ActionSigner({"k1": NOW_SECRET}, "k1"), leeway_seconds=3600)


def test_a_stored_response_is_replayed_only_to_the_task_that_caused_it(store):
    signer = ActionSigner({"k1": NOW_SECRET}, "k1")
    path = "/accounts/dave/deposit"
    owner = signer.issue(7, 1, "deposit", "pay-dave", 60, resource="account:dave")
    with serve(signed_app(store, signer)) as client:
        first = client.post(path, headers={"Leaseq-Action-Token": owner})
        assert first.status_code == 200
        # Anonymous: the key is known (viewers see effect keys), the handler's auth never ran.
        for headers in ({"Idempotency-Key": "pay-dave"},
                        {"Idempotency-Key": "pay-dave", "Leaseq-Fencing-Token": "9223372036854775807"},
                        {"Idempotency-Key": "pay-dave", "Leaseq-Fencing-Token": "7.1"}):
            anonymous = client.post(path, headers=headers)
            assert anonymous.status_code == 403 and anonymous.json()["error"]["reason"] == "missing"
            assert first.content not in anonymous.content and "idempotent-replayed" not in anonymous.headers
        # Another task's genuine token naming the same key gets no stored response either: keys are
        # kept per task, so its request is its own (and it could not have squatted task 7's key).
        thief = client.post(path, headers={"Leaseq-Action-Token": signer.issue(
            99, 1, "deposit", "pay-dave", 60, resource="account:dave")})
        assert thief.status_code == 200 and "idempotent-replayed" not in thief.headers
        assert first.content != thief.content
        # The task that caused it gets it back.
        mine = client.post(path, headers={"Leaseq-Action-Token": owner})
        assert mine.headers["idempotent-replayed"] == "true" and mine.content == first.content
        assert ledger(store) == [("dave", 1, "7.1"), ("dave", 1, "99.1")]
        assert store.newest_generation("account:dave", 99) == 1       # its own request was fenced


def order_app(store: FencedStore, signer: ActionSigner) -> FastAPI:
    app = FastAPI()

    @app.post("/orders/{order_id}/pay")
    def pay(order_id: int, request: Request):
        grant = fence_grant(request)
        add_entry(grant.connection, store, f"order:{order_id}", 1, grant.fencing_token)
        return {"order": order_id, "resource": grant.resource_key}

    app.add_middleware(FencingMiddleware, store=store, signer=signer,
                       resource=route_param("order_id", prefix="order:"), action=lambda scope: "orders.pay")
    return app


def test_route_param_gives_one_resource_per_record_however_the_path_spells_it(store):
    signer = ActionSigner({"k1": NOW_SECRET}, "k1")

    def token(gen: int, key: str) -> dict:
        return {"Leaseq-Action-Token": signer.issue(5, gen, "orders.pay", key, 60, resource="order:1")}

    with serve(order_app(store, signer)) as client:
        ok = client.post("/orders/01/pay", headers=token(2, "a"))
        assert ok.status_code == 200 and ok.json() == {"order": 1, "resource": "order:1"}
        # The same record spelt "+1": the same fence, so task 5's older attempt is refused.
        stale = client.post("/orders/+1/pay", headers=token(1, "b"))
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_token"
        assert client.post("/orders/1/pay", headers=token(2, "c")).status_code == 200
        # A token bound to order 1 is refused on order 2.
        other = client.post("/orders/2/pay", headers=token(2, "d"))
        assert other.status_code == 403 and other.json()["error"]["reason"] == "wrong_resource"
        assert client.get("/orders/1/pay").status_code == 405          # unguarded methods pass through
        assert [row[0] for row in ledger(store)] == ["order:1", "order:1"]
