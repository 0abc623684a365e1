"""Action tokens nobody can forge: references minted by the queue's database, checked online.

The queue keeps a token's claims and the SHA-256 of its secret
(``mint_action_token``, under the lease guard, in the effect's transaction);
a downstream asks ``verify_action_token`` through a verifier role, so the
token of a cancelled, revoked or superseded attempt is refused at once, and
no verifier can mint one. Both backends through the middleware; the attacks
log in as the PostgreSQL roles an attacker would hold and send raw SQL.
"""

from __future__ import annotations

import secrets
import time
import uuid
import warnings
from collections.abc import Iterator

import psycopg
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

import leaseq
from leaseq.core import action_tokens
from leaseq.fencing import (ActionSigner, FencedStore, FencingMiddleware, InvalidActionToken, QueueVerifier,
                            UnsafeOfflineTokens,
                            fence_grant, route_param)
from leaseq.store.functions import call_sql, load_signatures
from leaseq.store.queries import load_named_queries
from pg_modes import own_connection

from .conftest import make_role


@pytest.fixture
def shop(tmp_path, verifier_dsn: str) -> Iterator[TestClient]:
    """A downstream service fenced by the middleware, checking tokens online."""
    store = FencedStore(f"sqlite:///{tmp_path / 'shop.db'}")
    store.migrate()
    with store.transaction() as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, paid INTEGER NOT NULL DEFAULT 0)")
        conn.execute("INSERT INTO orders (id) VALUES (17)")
    api = FastAPI()
    verifier = QueueVerifier(verifier_dsn)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsafeOfflineTokens)  # the online default says nothing
        api.add_middleware(FencingMiddleware, store=store, verifier=verifier,
                           resource=route_param("order_id", prefix="order:"), action=lambda scope: "orders.pay")

    @api.post("/orders/{order_id}/pay")
    def pay(order_id: int, request: Request) -> dict:
        grant = fence_grant(request)
        assert grant is not None
        grant.connection.execute("UPDATE orders SET paid = paid + 1 WHERE id = ?", (order_id,))
        return {"order": order_id, "paid": True}

    client = TestClient(api)
    client.store = store  # type: ignore[attr-defined]
    yield client
    verifier.close()
    store.close()


def paid(shop: TestClient) -> int:
    with shop.store.transaction() as conn:  # type: ignore[attr-defined]
        return int(conn.execute("SELECT paid FROM orders WHERE id = 17").fetchone()[0])


def begin(q: leaseq.Queue, name: str = "a", lease_seconds: float = 30, key: str = "pay:17", queue: str = "default"):
    q.enqueue("pay", {}, effect="idempotent", actions=["orders.pay"], resources=["order:17"],
              lease_seconds=lease_seconds, idempotency_key=f"pay-{uuid.uuid4().hex[:6]}", queue=queue)
    worker = q.register_worker(name)
    [claim] = q.claim(worker, queue=queue)
    fx = q.begin_effect(worker, claim, "orders.pay", key, resource="order:17")
    return worker, claim, fx


def post(shop: TestClient, token: str | None):
    return shop.post("/orders/17/pay", headers={} if token is None else {"Leaseq-Action-Token": token})


def test_a_direct_workers_token_pays_once_end_to_end(q: leaseq.Queue, shop: TestClient) -> None:
    app = leaseq.App(queue=q)

    @app.task("pay_order", effect="idempotent", actions=["orders.pay"])
    def pay_order(ctx, order_id: int):
        with ctx.effect("orders.pay", key=f"pay:{order_id}", resource=f"order:{order_id}") as fx:
            assert fx.token is not None and fx.token.startswith("lqt1.")
            if not fx.replayed:
                answer = shop.post(f"/orders/{order_id}/pay", headers={"Leaseq-Action-Token": fx.token})
                answer.raise_for_status()
                fx.record(answer.json())
        return fx.response

    task = pay_order.options(resources=["order:17"]).enqueue(order_id=17)
    app.run_worker(until_idle=True, install_signals=False)
    assert q.get(task.id).status == "completed", q.get(task.id)
    assert paid(shop) == 1


def test_the_token_is_a_reference_the_queue_keeps_only_the_hash_of(q: leaseq.Queue, shop: TestClient) -> None:
    _, claim, fx = begin(q)
    token_id, token_hash = action_tokens.parse(fx.token)
    secret = fx.token.rsplit(".", 1)[1]
    rows = snapshot_tokens(q)
    assert secret not in repr(rows) and token_hash in repr(rows)
    assert post(shop, fx.token).status_code == 200
    assert paid(shop) == 1


def test_the_sweep_deletes_tokens_an_hour_past_their_expiry(q: leaseq.Queue, shop: TestClient) -> None:
    """A token row is written per action and per renewal it is asked for under: the sweep
    deletes those an hour and more past their expiry (refused anyway; a deleted one as
    unknown), and keeps the live ones and the ones that have only just run out, in every
    queue (a token carries its task's queue: the sweep reads one queue at a time)."""
    tokens = [begin(q, f"w{n}", queue=queue)[2].token for n, queue in enumerate(("orders", "default", "orders"))]
    ids = [int(action_tokens.parse(t)[0]) for t in tokens]
    ago = {ids[0]: 7200, ids[1]: 1800}  # two hours past expiry, half an hour past; ids[2] live
    for token_id, seconds in ago.items():
        if q.dialect == "sqlite":
            import sqlite3

            with sqlite3.connect(q.store.dsn[len("sqlite:///"):]) as conn:
                conn.execute("UPDATE leaseq_action_tokens SET expires_at = "
                             "(julianday('now') - 2440587.5) * 86400.0 - ? WHERE id = ?", (seconds, token_id))
        else:
            with own_connection(q.store.dsn) as conn:
                conn.execute("UPDATE leaseq_action_tokens SET expires_at = now() - make_interval(secs => %s) "
                             "WHERE id = %s", (seconds, token_id))
    q.sweep()
    assert sorted(r[0] for r in snapshot_tokens(q)) == ids[1:]
    assert post(shop, tokens[0]).status_code == 403 and post(shop, tokens[1]).status_code == 403
    assert post(shop, tokens[2]).status_code == 200


def snapshot_tokens(q: leaseq.Queue) -> list:
    if q.dialect == "sqlite":
        import sqlite3

        with sqlite3.connect(q.store.dsn[len("sqlite:///"):]) as conn:
            return conn.execute("SELECT * FROM leaseq_action_tokens").fetchall()
    with own_connection(q.store.dsn) as conn:
        return conn.execute("SELECT * FROM leaseq_action_tokens").fetchall()


def test_a_cancelled_attempts_token_is_refused_at_once(q: leaseq.Queue, shop: TestClient) -> None:
    _, claim, fx = begin(q)
    q.cancel(claim.task_id)
    answer = post(shop, fx.token)
    assert answer.status_code == 403, answer.json()
    assert answer.json()["error"]["reason"] == "lease_ended"
    assert paid(shop) == 0


def test_a_revoked_workers_token_is_refused_at_once(q: leaseq.Queue, shop: TestClient) -> None:
    worker, _, fx = begin(q)
    q.revoke_worker(worker)
    answer = post(shop, fx.token)
    assert answer.status_code == 403 and answer.json()["error"]["reason"] == "lease_ended"
    assert paid(shop) == 0


def test_a_superseded_attempts_token_is_refused_at_once(q: leaseq.Queue, shop: TestClient) -> None:
    """A gives the task back (a retry), B claims it: A's token, not yet expired, is refused."""
    a, claim_a, fx_a = begin(q)
    q.fail(a, claim_a, "flaky", delay=0)
    b = q.register_worker("b")
    [claim_b] = q.claim(b)
    assert claim_b.generation > claim_a.generation
    late = post(shop, fx_a.token)
    assert late.status_code == 403 and late.json()["error"]["reason"] == "superseded", late.json()
    fx_b = q.begin_effect(b, claim_b, "orders.pay", "pay:17", resource="order:17")
    assert post(shop, fx_b.token).status_code == 200
    assert paid(shop) == 1


def test_a_token_whose_lease_ran_out_is_refused_without_leeway(q: leaseq.Queue, shop: TestClient) -> None:
    a, claim_a, fx_a = begin(q, lease_seconds=0.5)
    time.sleep(0.7)
    b = q.register_worker("b")
    [claim_b] = q.claim(b)
    answer = post(shop, fx_a.token)
    assert answer.status_code == 403 and answer.json()["error"]["reason"] in ("expired", "superseded")
    assert paid(shop) == 0


def test_forged_and_random_tokens_are_refused(q: leaseq.Queue, shop: TestClient) -> None:
    _, _, fx = begin(q)
    token_id = fx.token.split(".")[1]
    for token, reason in ((f"lqt1.{token_id}.{secrets.token_urlsafe(32)}", "unknown_token"),
                          (f"lqt1.999999.{secrets.token_urlsafe(32)}", "unknown_token"),
                          (fx.token[:-1] + ("A" if fx.token[-1] != "A" else "B"), "unknown_token"),
                          ("lqt1.1.short", "malformed"),
                          (ActionSigner({"k": bytes(32)}, "k").issue(1, 1, "orders.pay", "1:pay:17", 60,
                                                                     resource="order:17"), "malformed")):
        answer = post(shop, token)
        assert answer.status_code == 403 and answer.json()["error"]["reason"] == reason, (token, answer.json())
    assert post(shop, None).json()["error"]["reason"] == "missing"
    assert paid(shop) == 0


def test_a_token_is_good_for_its_action_and_resource_only(q: leaseq.Queue, verifier_dsn: str) -> None:
    _, claim, fx = begin(q)
    verifier = QueueVerifier(verifier_dsn)
    try:
        claims = verifier.verify(fx.token, action="orders.pay", resource="order:17",
                                 idempotency_key=f"{claim.task_id}:pay:17")
        assert (claims.task_id, claims.generation, claims.resource) == (claim.task_id, claim.generation, "order:17")
        for kwargs, reason in (({"action": "orders.refund"}, "wrong_action"),
                               ({"resource": "order:18"}, "wrong_resource"),
                               ({"idempotency_key": "x"}, "wrong_idempotency_key")):
            with pytest.raises(InvalidActionToken) as refused:
                verifier.verify(fx.token, **kwargs)
            assert refused.value.reason == reason
    finally:
        verifier.close()


def test_an_unreachable_queue_refuses_the_request(q: leaseq.Queue, tmp_path) -> None:
    store = FencedStore(f"sqlite:///{tmp_path / 'shop2.db'}")
    store.migrate()
    down = ("sqlite:///" + str(tmp_path / "missing.db") if q.dialect == "sqlite"
            else "postgresql://nobody:x@127.0.0.1:1/none")
    api = FastAPI()
    api.add_middleware(FencingMiddleware, store=store, verifier=QueueVerifier(down),
                       resource=route_param("order_id", prefix="order:"),
                       actions={"POST /orders/{order_id}/pay": "orders.pay"})

    @api.post("/orders/{order_id}/pay")
    def pay(order_id: int) -> dict:
        raise AssertionError("must not run")

    _, _, fx = begin(q)
    answer = TestClient(api).post("/orders/17/pay", headers={"Leaseq-Action-Token": fx.token})
    assert answer.status_code == 503, answer.json()
    store.close()


def test_an_offline_signer_alone_warns_loudly(tmp_path) -> None:
    store = FencedStore(f"sqlite:///{tmp_path / 'shop3.db'}")
    with pytest.warns(UnsafeOfflineTokens, match="superseded"):
        FencingMiddleware(FastAPI(), store=store, resource=lambda scope: None, action=lambda scope: "orders.pay",
                          insecure_offline_signer=ActionSigner({"k": bytes(32)}, "k"))
    with pytest.raises(leaseq.ConfigError, match="verifier"):
        FencingMiddleware(FastAPI(), store=store, resource=lambda scope: None)


# -- attacks, as the PostgreSQL roles an attacker would hold ------------------------------------

def function_call(name: str) -> str:
    return call_sql(load_named_queries("postgres")[name], load_signatures()[name])


def mint_params(claim, worker_id: str, effect_id: int) -> dict:
    return {"token_hash": action_tokens.digest(action_tokens.new_secret()), "effect_id": effect_id,
            "task_id": claim.task_id, "generation": claim.generation, "worker_id": worker_id, "ttl_seconds": 300.0}


@pytest.mark.parametrize("dsn", ["postgres"], indirect=True)
def test_a_verifier_role_can_verify_and_nothing_else(q: leaseq.Queue, verifier_dsn: str) -> None:
    worker, claim, fx = begin(q)
    with own_connection(verifier_dsn, autocommit=True) as conn:
        token_id, token_hash = action_tokens.parse(fx.token)
        row = conn.execute(function_call("verify_action_token"),
                           {"token_id": token_id, "token_hash": token_hash, "action": None,
                            "idempotency_key": None, "resource": None}).fetchone()
        assert row[0] is None and row[1] == claim.task_id
        for statement in ("SELECT * FROM leaseq_action_tokens", "SELECT * FROM leaseq_tasks",
                          "SELECT * FROM leaseq_migrations",
                          "INSERT INTO leaseq_action_tokens (token_hash, effect_id, task_id, generation, action, "
                          "idempotency_key, issued_at, expires_at) VALUES (repeat('0', 64), 1, 1, 1, 'a', 'k', "
                          "now(), now() + interval '1 hour')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        for name, params in (("mint_action_token", mint_params(claim, worker.id, fx.id)),
                             ("lock_lease", {"task_id": claim.task_id, "worker_id": worker.id,
                                             "generation": claim.generation}),
                             ("get_task", {"task_id": claim.task_id})):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(function_call(name), params)


@pytest.mark.parametrize("dsn", ["postgres"], indirect=True)
def test_a_worker_role_cannot_mint_beyond_its_lease_and_declarations(q: leaseq.Queue,
                                                                     made_roles: list[str]) -> None:
    worker_dsn = make_role(q, made_roles, "worker")
    mine = leaseq.connect(worker_dsn)
    try:
        t_mine = q.enqueue("pay", {}, effect="idempotent", actions=["orders.pay"], resources=["order:17"],
                           lease_seconds=30)
        w = mine.register_worker("attacker")
        [claim] = mine.claim(w)
        assert claim.task_id == t_mine.id
        fx = mine.begin_effect(w, claim, "orders.pay", "pay:17", resource="order:17")
        assert fx.token is not None and fx.token.startswith("lqt1.")
        # another task, held by another worker, with an effect of its own
        other_worker, other_claim, other_fx = begin(q, name="honest")
        # an entry of the attacker's task naming an undeclared action and an undeclared resource: the
        # worker role cannot write one (insert_effect's guard), so the owner writes them to prove the
        # mint re-checks the declarations itself
        with own_connection(q.store.dsn, autocommit=True) as admin:
            undeclared = [admin.execute(
                "INSERT INTO leaseq_effects (task_id, generation, worker_id, action, idempotency_key, effect, resource)"
                " VALUES (%s, %s, %s, %s, %s, 'idempotent', %s) RETURNING id",
                (claim.task_id, claim.generation, w.id, action, key, resource)).fetchone()[0]
                for action, key, resource in (("orders.refund", "x1", "order:17"), ("orders.pay", "x2", "order:99"))]
            before = admin.execute("SELECT count(*) FROM leaseq_action_tokens").fetchone()[0]
        with own_connection(worker_dsn, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("INSERT INTO leaseq_action_tokens (token_hash, effect_id, task_id, generation, action, "
                             "idempotency_key, issued_at, expires_at) VALUES (repeat('0', 64), %s, %s, %s, "
                             "'orders.pay', 'k', now(), now() + interval '1 hour')",
                             (fx.id, claim.task_id, claim.generation))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT * FROM leaseq_action_tokens")
            mint = function_call("mint_action_token")
            # another task's effect, named as the attacker's own task
            assert conn.execute(mint, mint_params(claim, w.id, other_fx.id)).fetchall() == []
            # another task, under the other worker's id: not the attacker's identity
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(mint, mint_params(other_claim, other_worker.id, other_fx.id))
            # another task under its own worker id: no lease of it
            assert conn.execute(mint, mint_params(other_claim, w.id, other_fx.id)).fetchall() == []
            # a generation it does not hold
            stale = mint_params(claim, w.id, fx.id) | {"generation": claim.generation + 1}
            assert conn.execute(mint, stale).fetchall() == []
            # an undeclared action, an undeclared resource
            for effect_id in undeclared:
                assert conn.execute(mint, mint_params(claim, w.id, effect_id)).fetchall() == []
            # its own lease, its own declared entry: minted
            assert len(conn.execute(mint, mint_params(claim, w.id, fx.id)).fetchall()) == 1
        with own_connection(q.store.dsn, autocommit=True) as admin:
            assert admin.execute("SELECT count(*) FROM leaseq_action_tokens").fetchone()[0] == before + 1
    finally:
        mine.close()


def test_a_token_of_another_lease_epoch_than_its_tasks_claim_is_superseded(q: leaseq.Queue, shop: TestClient) -> None:
    """A failover can keep a token's row while the claim it was minted under is handed out again
    in a new history (a new lease epoch, perhaps the same generation): the verifier and the
    queue's lease check both compare the epoch, not only the generation."""
    worker, claim, fx = begin(q)
    assert post(shop, fx.token).status_code == 200
    with q.hold_attempt(claim.task_id, claim.generation, epoch=claim.epoch):
        pass
    moved = "UPDATE leaseq_tasks SET claim_epoch = claim_epoch + 1 WHERE id = "
    if q.dialect == "sqlite":
        import sqlite3

        with sqlite3.connect(q.store.dsn[len("sqlite:///"):]) as conn:
            conn.execute(moved + "?", (claim.task_id,))
    else:
        with own_connection(q.store.dsn) as conn:
            conn.execute(moved + "%s", (claim.task_id,))
    refused = post(shop, fx.token)
    assert refused.status_code == 403 and refused.json()["error"]["reason"] == "superseded", refused.text
    with pytest.raises(leaseq.LeaseLost):
        with q.hold_attempt(claim.task_id, claim.generation, epoch=claim.epoch):
            pass
    with q.hold_attempt(claim.task_id, claim.generation, epoch=claim.epoch + 1):
        pass
