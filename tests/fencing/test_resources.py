"""Resources declared at enqueue; a read_only call gets no action token. Both backends, and over HTTP.

An effect may name (bind its action token to) only a resource its task
declared (``resources=[...]``); the refusal is insert_effect's own guard, so
the attack tests at the end send it as a worker role's raw SQL too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.testclient import TestClient

import leaseq
from leaseq.cli.main import cli
from leaseq.fencing import ActionSigner, FencedStore, FencingMiddleware, route_param
from pg_modes import own_connection
from service.conftest import serve

from .test_actions import SIGNER, claim_one, sq  # noqa: F401 (sq: the queue fixture)


def test_an_effect_may_name_only_a_resource_its_task_declared(sq) -> None:
    task, w, claim = claim_one(sq, effect="idempotent", actions=["orders.pay"], resources=["order:17", "order:18"])
    assert sorted(sq.get(task.id).resources) == ["order:17", "order:18"]
    with pytest.raises(leaseq.InvalidInput, match="'order:99' is not a resource task") as info:
        sq.begin_effect(w, claim, "orders.pay", "pay:99", resource="order:99")
    assert info.value.field == "resource" and "order:17" in str(info.value)
    assert sq.effects(task.id) == [] and sq.get(task.id).open_effects == 0
    fx = sq.begin_effect(w, claim, "orders.pay", "pay:17", resource="order:17")
    assert fx.resource == "order:17" and SIGNER.verify(fx.token, resource="order:17").resource == "order:17"
    # one key, one resource: the key begun for order:17 cannot be asked for again on order:18
    with pytest.raises(leaseq.InvalidInput, match="one key, one resource") as info:
        sq.begin_effect(w, claim, "orders.pay", "pay:17", resource="order:18")
    assert info.value.field == "resource"


def test_a_task_that_declared_no_resource_names_none(sq) -> None:
    task, w, claim = claim_one(sq, effect="idempotent")
    with pytest.raises(leaseq.InvalidInput, match="declared: none") as info:
        sq.begin_effect(w, claim, "orders.pay", resource="order:1")
    assert info.value.field == "resource" and sq.effects(task.id) == []
    unbound = sq.begin_effect(w, claim, "orders.pay")       # an unbound token, which a fence refuses
    assert SIGNER.verify(unbound.token).resource is None


@pytest.mark.parametrize("bad", ["order:1", [""], [1], ["x" * 256], [f"r{i}" for i in range(1001)]])
def test_bad_resources_are_refused_on_enqueue_and_nothing_is_written(sq, bad) -> None:
    with pytest.raises(leaseq.InvalidInput, match="resources"):
        sq.enqueue("job", {}, effect="idempotent", resources=bad)
    with pytest.raises(leaseq.InvalidInput, match="resources"):
        sq.enqueue_many("job", [{}, {}], effect="idempotent", resources=bad)
    assert sq.list_tasks() == []


def test_a_read_only_task_declares_no_resource(sq) -> None:
    with pytest.raises(leaseq.InvalidInput, match="resources") as info:
        sq.enqueue("job", {}, effect="read_only", resources=["order:1"])
    assert info.value.field == "resources" and sq.list_tasks() == []


def test_resources_are_compared_on_a_repeated_key_and_are_in_the_approval_digest(sq) -> None:
    task = sq.enqueue("job", {}, effect="idempotent", idempotency_key="k", resources=["order:1"])
    assert sq.enqueue("job", {}, effect="idempotent", idempotency_key="k", resources=["order:1"]).id == task.id
    with pytest.raises(leaseq.IdempotencyKeyConflict, match="resources"):
        sq.enqueue("job", {}, effect="idempotent", idempotency_key="k", resources=["order:2"])
    digest = leaseq.approval_digest("job", {}, "default", effect="idempotent", resources=["order:1"])
    assert digest != leaseq.approval_digest("job", {}, "default", effect="idempotent", resources=["order:2"])
    # a task declaring none keeps the digest it had before resources existed
    assert leaseq.approval_digest("job", {}, "default") == leaseq.approval_digest("job", {}, "default", resources=[])
    gated = sq.enqueue("job", {}, effect="idempotent", resources=["order:1"], approval="required")
    [request] = [a for a in sq.approvals() if a.task_id == gated.id]
    assert request.digest == digest


def test_many_tasks_and_app_definitions_declare_resources(sq, dsn) -> None:
    ids = sq.enqueue_many("job", [{}, {}], effect="idempotent", resources=["a:1"])
    assert [sq.get(i).resources for i in ids] == [["a:1"], ["a:1"]]
    app = leaseq.App(queue=sq)

    @app.task("pay", effect="idempotent", actions=["orders.pay"])
    def pay(ctx, order_id: int) -> None:
        pass

    assert sq.get(pay.options(resources=["order:3"]).enqueue(order_id=3).id).resources == ["order:3"]


def test_the_cli_declares_resources_and_refuses_a_bad_one_naming_it(dsn) -> None:
    env = {"LEASEQ_DSN": dsn}
    assert CliRunner().invoke(cli, ["migrate"], env=env).exit_code == 0
    ok = CliRunner().invoke(cli, ["enqueue", "job", "--effect", "idempotent", "--action", "orders.pay",
                                  "--resource", "order:1", "--resource", "order:2", "--json"], env=env)
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(cli, ["enqueue", "job", "--resource", "order:1"], env=env)  # read_only
    assert bad.exit_code == 2 and bad.output.startswith("error: resources: ") and "Traceback" not in bad.output
    with leaseq.connect(dsn) as q:
        [task] = q.list_tasks()
        assert task.actions == ["orders.pay"] and task.resources == ["order:1", "order:2"]


# -- read_only calls take no action, so they get no action token --------------------------

def shop(store: FencedStore) -> FastAPI:
    api = FastAPI()
    api.add_middleware(FencingMiddleware, store=store, signer=SIGNER,
                       resource=route_param("order_id", prefix="order:"), action=lambda scope: "orders.refund")

    @api.post("/orders/{order_id}/refund")
    def refund(order_id: int) -> dict:
        return {"refunded": order_id}

    return api


def test_a_read_only_call_gets_no_token_and_a_fence_refuses_it_even_on_a_paused_queue(sq, tmp_path) -> None:
    task, w, claim = claim_one(sq, effect="idempotent", actions=["search.query"])
    sq.pause("default")
    # the off-switch and the declared actions do not stop a read-only lookup, and it gets no token
    fx = sq.begin_effect(w, claim, "orders.refund", "r1", effect="read_only")
    assert fx.token is None and fx.effect == "read_only"
    with pytest.raises(leaseq.InvalidInput, match="read_only call") as info:
        sq.begin_effect(w, claim, "orders.refund", "r2", effect="read_only", resource="order:1")
    assert info.value.field == "resource"
    with pytest.raises(leaseq.QueuePaused):
        sq.begin_effect(w, claim, "orders.refund", "r3", effect="side_effect")
    with FencedStore(f"sqlite:///{tmp_path / 'shop.db'}") as store:
        store.migrate()
        answer = TestClient(shop(store)).post("/orders/1/refund", headers={"Leaseq-Action-Token": fx.token or ""})
        assert answer.status_code == 403 and answer.json()["error"]["reason"] == "missing"


@pytest.fixture
def signing_svc(sq):
    with serve(sq) as (url, app):
        yield url


def test_over_http_an_undeclared_resource_is_422_and_a_read_only_call_has_no_token(sq, signing_svc) -> None:
    import httpx

    from leaseq import auth
    from leaseq.client import RemoteQueue

    token, _ = auth.create_token(sq, name="w", role="worker", created_by="test", all_queues=True)
    task = sq.enqueue("job", {}, effect="idempotent", actions=["search.query", "orders.pay"],
                      resources=["order:1"])
    with RemoteQueue(signing_svc, token, timeout=10) as rq, \
            httpx.Client(base_url=signing_svc, headers={"Authorization": f"Bearer {token}"}) as raw:
        w = rq.register_worker("w")
        [claim] = rq.claim(w, lease_seconds=30)
        path = f"/v1/workers/{w.id}/tasks/{task.id}/effects"
        resp = raw.post(path, json={"generation": claim.generation, "action": "orders.pay", "resource": "order:2"})
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"]["field"] == "resource" and sq.effects(task.id) == []
        sq.pause("default")
        resp = raw.post(path, json={"generation": claim.generation, "action": "orders.refund",
                                    "resource": "order:1", "effect": "read_only"})
        assert resp.status_code == 422 and resp.json()["error"]["field"] == "resource", resp.text
        resp = raw.post(path, json={"generation": claim.generation, "action": "orders.refund",
                                    "effect": "read_only"})
        assert resp.status_code in (200, 201) and resp.json()["token"] is None, resp.text
        sq.resume("default")
        fx = rq.begin_effect(w, claim, "orders.pay", "pay:1", resource="order:1")
        assert SIGNER.verify(fx.token, resource="order:1").task_id == task.id


# -- attacks: a worker role sends the effect statements as raw SQL -----------------------

@pytest.fixture
def worker_role(pg_schema_dsn: str) -> Iterator[tuple[str, leaseq.Queue]]:
    admin = leaseq.connect(pg_schema_dsn)
    admin.migrate()
    name = f"lq_worker_{uuid.uuid4().hex[:8]}"
    result = CliRunner().invoke(cli, ["roles", "create", "worker", name], env={"LEASEQ_DSN": pg_schema_dsn})
    assert result.exit_code == 0, result.output
    try:
        yield result.stdout.strip().splitlines()[0], admin
    finally:
        admin.close()
        with own_connection(pg_schema_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
            conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def effects_of(admin: leaseq.Queue) -> list[tuple]:
    with own_connection(admin.store.dsn) as conn:
        return conn.execute("SELECT id, task_id, generation, action, resource, effect FROM leaseq_effects "
                            "ORDER BY id").fetchall()


def test_a_worker_role_cannot_insert_an_effect_its_task_did_not_declare(worker_role) -> None:
    dsn, admin = worker_role
    task = admin.enqueue("job", {}, effect="idempotent", actions=["orders.pay"], resources=["order:1"])
    with leaseq.connect(dsn) as q:
        w = q.register_worker("w")
        [claim] = q.claim(w, lease_seconds=30)
        insert = "SELECT * FROM leaseq_q_insert_effect(%s, %s, %s, %s, %s, %s, NULL, %s, %s)"
        with own_connection(dsn, autocommit=True) as conn:
            for action, resource, effect, tool in (("orders.pay", "order:2", "idempotent", False),   # resource
                                                   ("orders.refund", "order:1", "idempotent", False),  # action
                                                   ("orders.refund", None, "side_effect", True),
                                                   ("orders.pay", "order:2", "read_only", True)):    # no bypass
                rows = conn.execute(insert, (task.id, claim.generation, w.id, action, "k", effect,
                                             resource, tool)).fetchall()
                assert rows == [], (action, resource, effect)
            assert effects_of(admin) == []
            rows = conn.execute(insert, (task.id, claim.generation, w.id, "orders.pay", "k", "idempotent",
                                         "order:1", False)).fetchall()
            assert len(rows) == 1
        assert [(e[3], e[4]) for e in effects_of(admin)] == [("orders.pay", "order:1")]


def test_a_worker_role_cannot_rebind_another_tasks_effect(worker_role) -> None:
    dsn, admin = worker_role
    victim = admin.enqueue("job", {"n": "victim"}, effect="idempotent", priority=1)
    mine = admin.enqueue("job", {"n": "mine"}, effect="idempotent")
    aw = admin.register_worker("victim-worker")
    [vclaim] = admin.claim(aw, lease_seconds=30)
    assert vclaim.task_id == victim.id
    vfx = admin.begin_effect(aw, vclaim, "crm.update", "k")
    with leaseq.connect(dsn) as q:
        w = q.register_worker("w")
        [claim] = q.claim(w, lease_seconds=30)
        assert claim.task_id == mine.id
        before = effects_of(admin)
        with own_connection(dsn, autocommit=True) as conn:
            # the victim's effect, named with the attacker's own live lease
            rows = conn.execute("SELECT * FROM leaseq_q_rebind_effect(%s, %s, %s, %s)",
                                (claim.generation, w.id, vfx.id, mine.id)).fetchall()
            assert rows == []
            with pytest.raises(psycopg.Error, match="holds no live lease"):
                conn.execute("SELECT * FROM leaseq_q_rebind_effect(%s, %s, %s, %s)",
                             (vclaim.generation, w.id, vfx.id, victim.id))
        assert effects_of(admin) == before


# -- downstream idempotency keys are namespaced by task ----------------------------------

def test_downstream_keys_are_namespaced_by_task_so_no_task_squats_another(sq, tmp_path) -> None:
    a = sq.enqueue("job", {"n": "a"}, effect="idempotent", actions=["orders.refund"], resources=["order:1"],
                   priority=1)
    b = sq.enqueue("job", {"n": "b"}, effect="idempotent", actions=["orders.refund"], resources=["order:1"])
    w = sq.register_worker("w")
    [claim_a] = sq.claim(w, lease_seconds=30)
    [claim_b] = sq.claim(w, lease_seconds=30)
    assert (claim_a.task_id, claim_b.task_id) == (a.id, b.id)
    # A picks the key B will use ("refund:1"), and goes first.
    fx_a = sq.begin_effect(w, claim_a, "orders.refund", "refund:1", resource="order:1")
    fx_b = sq.begin_effect(w, claim_b, "orders.refund", "refund:1", resource="order:1")
    assert fx_a.downstream_key == f"{a.id}:refund:1" and fx_b.downstream_key == f"{b.id}:refund:1"
    assert SIGNER.verify(fx_a.token).idempotency_key == fx_a.downstream_key
    with FencedStore(f"sqlite:///{tmp_path / 'shop.db'}") as store:
        store.migrate()
        client = TestClient(shop(store))
        first = client.post("/orders/1/refund", headers={"Leaseq-Action-Token": fx_a.token,
                                                         "Idempotency-Key": fx_a.downstream_key})
        assert first.status_code == 200 and "idempotent-replayed" not in first.headers
        mine = client.post("/orders/1/refund", headers={"Leaseq-Action-Token": fx_b.token})
        assert mine.status_code == 200, mine.text                        # not idempotency_key_reused
        assert "idempotent-replayed" not in mine.headers
        again = client.post("/orders/1/refund", headers={"Leaseq-Action-Token": fx_b.token})
        assert again.headers["idempotent-replayed"] == "true"
        # A cannot name B's key: the header must equal the key its own token names
        forged = client.post("/orders/1/refund", headers={"Leaseq-Action-Token": fx_a.token,
                                                          "Idempotency-Key": fx_b.downstream_key})
        assert forged.status_code == 403 and forged.json()["error"]["reason"] == "wrong_idempotency_key"


def test_the_handler_sends_the_namespaced_key(dsn) -> None:
    app = leaseq.App(dsn, signer=SIGNER)
    seen: list[tuple[str, str]] = []

    @app.task("send", effect="idempotent")
    def send(ctx) -> None:
        with ctx.effect("email.send", key="welcome") as fx:
            seen.append((fx.idempotency_key, fx.ledger_key))

    task = send.enqueue()
    app.run_worker(until_idle=True, install_signals=False, concurrency=1)
    app.queue.close()
    assert seen == [(f"{task.id}:welcome", "welcome")]
