"""Every guarded route says what it does and to what: the middleware takes the action from the route.

A shop served by uvicorn, its tokens minted by the queue (references, checked
online through ``QueueVerifier``) on both backends. The middleware derives a
request's action from its method and the path template of the route it
reaches (``actions={"POST /orders/{order_id}/refund": "orders.refund"}``), so
a worker allowed to pay an order cannot refund it with the same token; a
guarded request to a path no route takes, to a route that performs no
declared action, or whose record the fence cannot name is refused, unless its
route is exempt by name.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from starlette.applications import Starlette

import leaseq
from leaseq.fencing import (FencedStore, FencingMiddleware, QueueVerifier, RouteActions, RouteMatch,
                            UnsafeAnyAction, UnsafeOfflineTokens, fence_grant, match_route, route_param)

from .test_middleware import serve

ACTIONS = {"POST /orders/{order_id}/pay": "orders.pay",
           "POST /orders/{order_id}/refund": "orders.refund",
           "POST /refunds": "orders.refund",                    # names its order in the body
           "POST /v1/orders/{order_id}/pay": "orders.pay"}      # an included router's prefix
EXEMPT = ["POST /orders/search"]


def shop_app(store: FencedStore, verifier: QueueVerifier, **options) -> FastAPI:
    """A FastAPI shop: paying and refunding write through the fence's connection."""
    api = FastAPI()

    def count(conn, column: str, order_id: int) -> None:
        conn.execute(f"UPDATE orders SET {column} = {column} + 1 WHERE id = ?", (order_id,))

    @api.post("/orders/{order_id}/pay")
    def pay(order_id: int, request: Request) -> dict:
        count(fence_grant(request).connection, "paid", order_id)
        return {"order": order_id, "paid": True}

    @api.post("/orders/{order_id}/refund")
    def refund(order_id: int, request: Request) -> dict:
        count(fence_grant(request).connection, "refunded", order_id)
        return {"order": order_id, "refunded": True}

    @api.post("/refunds")
    async def refund_by_body(request: Request) -> dict:
        order_id = int((await request.json())["order_id"])
        with store.transaction() as conn:   # nothing fenced it: the service's own transaction
            count(conn, "refunded", order_id)
        return {"order": order_id, "refunded": True}

    @api.delete("/orders/{order_id}")
    def delete(order_id: int) -> dict:
        with store.transaction() as conn:
            conn.execute("DELETE FROM orders WHERE id = ?", (order_id,))
        return {"deleted": order_id}

    @api.post("/orders/search")
    def search() -> dict:
        return {"orders": [17], "fenced": False}

    @api.get("/orders/{order_id}")
    def show(order_id: int) -> dict:
        with store.transaction() as conn:
            row = conn.execute("SELECT paid, refunded FROM orders WHERE id = ?", (order_id,)).fetchone()
        return {"paid": row[0], "refunded": row[1]}

    v1 = APIRouter()

    @v1.post("/orders/{order_id}/pay")
    def pay_v1(order_id: int, request: Request) -> dict:
        count(fence_grant(request).connection, "paid", order_id)
        return {"order": order_id, "paid": True, "version": 1}

    api.include_router(v1, prefix="/v1")
    options.setdefault("actions", ACTIONS)
    options.setdefault("exempt", EXEMPT)
    api.add_middleware(FencingMiddleware, store=store, verifier=verifier,
                       resource=route_param("order_id", prefix="order:"), **options)
    return api


@pytest.fixture
def shop_store(tmp_path) -> Iterator[FencedStore]:
    store = FencedStore(f"sqlite:///{tmp_path / 'shop.db'}")
    store.migrate()
    with store.transaction() as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, paid INTEGER NOT NULL DEFAULT 0, "
                     "refunded INTEGER NOT NULL DEFAULT 0)")
        conn.execute("INSERT INTO orders (id) VALUES (17)")
    yield store
    store.close()


@pytest.fixture
def verifier(verifier_dsn: str) -> Iterator[QueueVerifier]:
    checker = QueueVerifier(verifier_dsn)
    yield checker
    checker.close()


@pytest.fixture
def shop(shop_store: FencedStore, verifier: QueueVerifier) -> Iterator[httpx.Client]:
    with serve(shop_app(shop_store, verifier)) as client:
        yield client


def orders(store: FencedStore) -> list[tuple]:
    with store.transaction() as conn:
        return [tuple(r) for r in conn.execute("SELECT id, paid, refunded FROM orders ORDER BY id").fetchall()]


def fence_rows(store: FencedStore) -> int:
    with store.transaction() as conn:
        return sum(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                   for table in ("leaseq_fence_attempts", "leaseq_fence_outcomes"))


def tokens(q: leaseq.Queue, *actions: str) -> dict[str, str]:
    """One claimed task allowed to pay and refund order 17; its token for each of ``actions``."""
    q.enqueue("order_work", {}, effect="idempotent", actions=["orders.pay", "orders.refund"],
              resources=["order:17"], lease_seconds=60, idempotency_key=f"w-{uuid.uuid4().hex[:8]}")
    worker = q.register_worker("w")
    [claim] = q.claim(worker)
    return {action: q.begin_effect(worker, claim, action, f"{action}:17", resource="order:17").token
            for action in actions}


def refused(answer: httpx.Response, reason: str) -> str:
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "forbidden" and error["reason"] == reason, error
    return str(error["message"])


def test_a_token_for_one_action_is_refused_on_another_actions_route(q, shop, shop_store) -> None:
    token = tokens(q, "orders.pay", "orders.refund")
    before = fence_rows(shop_store)
    # the pay token on the refund route: the route's action is orders.refund
    message = refused(shop.post("/orders/17/refund", headers={"Leaseq-Action-Token": token["orders.pay"]}),
                      "wrong_action")
    assert "another action" in message
    refused(shop.post("/orders/17/pay", headers={"Leaseq-Action-Token": token["orders.refund"]}), "wrong_action")
    assert orders(shop_store) == [(17, 0, 0)] and fence_rows(shop_store) == before
    # each token on its own route: the happy path
    assert shop.post("/orders/17/pay", headers={"Leaseq-Action-Token": token["orders.pay"]}).status_code == 200
    assert shop.post("/orders/17/refund", headers={"Leaseq-Action-Token": token["orders.refund"]}).status_code == 200
    again = shop.post("/orders/17/pay", headers={"Leaseq-Action-Token": token["orders.pay"]})
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert orders(shop_store) == [(17, 1, 1)]
    # a route under an included router's prefix is named with it
    v1 = shop.post("/v1/orders/17/pay", headers={"Leaseq-Action-Token": token["orders.pay"]})
    assert v1.status_code == 200, v1.text
    refused(shop.post("/v1/orders/17/pay", headers={"Leaseq-Action-Token": token["orders.refund"]}), "wrong_action")


def test_a_guarded_request_no_route_declares_an_action_for_is_refused(q, shop, shop_store) -> None:
    token = tokens(q, "orders.pay")["orders.pay"]
    headers = {"Leaseq-Action-Token": token}
    # a path no route takes, and a method its route does not answer
    message = refused(shop.post("/orders/17/cancel", headers=headers), "unknown_route")
    assert "POST /orders/17/cancel" in message
    refused(shop.put("/orders/17/pay", headers=headers), "unknown_route")
    # a route the app has, whose action nobody declared: the handler never runs
    message = refused(shop.delete("/orders/17", headers=headers), "undeclared_action")
    assert "DELETE /orders/{order_id}" in message and "actions=" in message
    assert orders(shop_store) == [(17, 0, 0)] and fence_rows(shop_store) == 0
    # the safe methods pass as before
    assert shop.get("/orders/17").json() == {"paid": 0, "refunded": 0}
    assert shop.get("/nowhere").status_code == 404


def test_a_guarded_request_naming_no_resource_is_refused_unless_its_route_is_exempt(q, shop, shop_store) -> None:
    token = tokens(q, "orders.refund")["orders.refund"]
    # a body-identified record: a genuine token for the route's action, but the fence cannot name the order
    answer = shop.post("/refunds", json={"order_id": 17}, headers={"Leaseq-Action-Token": token})
    message = refused(answer, "no_resource")
    assert "POST /refunds" in message and "exempt=" in message
    assert orders(shop_store) == [(17, 0, 0)] and fence_rows(shop_store) == 0
    # the exempt route passes, with no token at all, unfenced
    search = shop.post("/orders/search")
    assert search.status_code == 200 and search.json() == {"orders": [17], "fenced": False}
    assert fence_rows(shop_store) == 0


def test_an_exempt_body_identified_route_passes_unfenced(q, shop_store, verifier) -> None:
    actions = {k: v for k, v in ACTIONS.items() if k != "POST /refunds"}
    with serve(shop_app(shop_store, verifier, actions=actions, exempt=[*EXEMPT, "post /refunds"])) as shop:
        answer = shop.post("/refunds", json={"order_id": 17})
        assert answer.status_code == 200, answer.text
        assert orders(shop_store) == [(17, 0, 1)] and fence_rows(shop_store) == 0
        # exempting one route leaves the others guarded
        refused(shop.post("/orders/17/refund"), "missing")


def test_an_action_callable_overrides_the_table(q, shop_store, verifier) -> None:
    token = tokens(q, "orders.pay", "orders.refund")
    app = shop_app(shop_store, verifier, actions=None, action=lambda scope: "orders.refund")
    with serve(app) as shop:
        refused(shop.post("/orders/17/pay", headers={"Leaseq-Action-Token": token["orders.pay"]}), "wrong_action")
        assert shop.post("/orders/17/pay", headers={"Leaseq-Action-Token": token["orders.refund"]}).status_code == 200
    assert orders(shop_store) == [(17, 1, 0)]
    # a callable naming no action refuses the request, as an undeclared route is refused
    with serve(shop_app(shop_store, verifier, actions=None, action=lambda scope: None)) as shop:
        refused(shop.post("/orders/17/pay", headers={"Leaseq-Action-Token": token["orders.pay"]}),
                "undeclared_action")
    assert orders(shop_store) == [(17, 1, 0)]


@pytest.mark.filterwarnings("ignore::leaseq.fencing.UnsafeAnyAction")   # the served app's, once seen below
def test_any_action_is_an_explicit_loud_opt_in(q, shop_store, verifier) -> None:
    with pytest.raises(leaseq.ConfigError, match="actions") as info:
        FencingMiddleware(Starlette(), store=shop_store, verifier=verifier, resource=route_param("order_id"))
    assert "insecure_any_action=True" in str(info.value)
    with pytest.warns(UnsafeAnyAction, match="UNSAFE insecure_any_action"):
        FencingMiddleware(Starlette(), store=shop_store, verifier=verifier, resource=route_param("order_id"),
                          insecure_any_action=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsafeOfflineTokens)   # the online default warns of nothing else
        FencingMiddleware(Starlette(), store=shop_store, verifier=verifier, resource=route_param("order_id"),
                          actions=ACTIONS)
    token = tokens(q, "orders.pay")["orders.pay"]
    with serve(shop_app(shop_store, verifier, actions=None, insecure_any_action=True)) as shop:   # what the old default did: the pay token refunds
        assert shop.post("/orders/17/refund", headers={"Leaseq-Action-Token": token}).status_code == 200
        # the opt-in is about actions only: a record the fence cannot name is still refused
        refused(shop.post("/refunds", json={"order_id": 17}, headers={"Leaseq-Action-Token": token}), "no_resource")
    assert orders(shop_store) == [(17, 0, 1)]


@pytest.mark.parametrize("options, field", [
    ({"actions": {"/orders/{order_id}/pay": "orders.pay"}}, "actions"),        # no method
    ({"actions": {"POST orders/{order_id}/pay": "orders.pay"}}, "actions"),    # no leading slash
    ({"actions": {"POST /orders/{order_id}/pay": ""}}, "actions"),
    ({"actions": {"POST /x": "a", "post /x": "b"}}, "actions"),                # one route, twice
    ({"actions": {}}, "actions"),
    ({"exempt": "POST /orders/search"}, "exempt"),                             # a string, not a list
    ({"exempt": ["/orders/search"]}, "exempt"),
    ({"action": "orders.pay", "actions": None}, "action"),
    ({"insecure_any_action": "yes", "actions": None}, "insecure_any_action"),
])
def test_a_malformed_declaration_is_refused_naming_its_field(shop_store, tmp_path, options, field) -> None:
    options = {"actions": ACTIONS, **options}
    verifier = QueueVerifier(f"sqlite:///{tmp_path / 'queue.db'}")
    with pytest.raises(leaseq.InvalidInput) as info:
        FencingMiddleware(Starlette(), store=shop_store, verifier=verifier, resource=route_param("order_id"),
                          **options)
    assert info.value.field == field


@pytest.mark.parametrize("options, says", [
    ({"action": lambda scope: "orders.pay"}, "action: overrides"),
    ({"insecure_any_action": True}, "contradicts"),
    ({"exempt": ["POST /orders/{order_id}/pay"]}, "fenced or exempt"),
])
def test_contradictory_declarations_are_refused(shop_store, tmp_path, options, says) -> None:
    verifier = QueueVerifier(f"sqlite:///{tmp_path / 'queue.db'}")
    with pytest.raises(leaseq.ConfigError, match=says):
        FencingMiddleware(Starlette(), store=shop_store, verifier=verifier, resource=route_param("order_id"),
                          actions=RouteActions(ACTIONS), **options)


def test_routes_are_named_as_declared_under_included_routers_and_mounts(q, shop_store, verifier) -> None:
    """``route_param`` and the table see the route the app will run: FastAPI's included routers
    (matched through a router object of their own) and Starlette mounts, prefixes included."""
    api = FastAPI()
    outer, inner = APIRouter(), APIRouter()

    @inner.post("/orders/{order_id:int}/pay")
    def pay(order_id: int, request: Request) -> dict:
        grant = fence_grant(request)
        assert grant is not None, "an included route's request must be fenced"
        grant.connection.execute("UPDATE orders SET paid = paid + 1 WHERE id = ?", (order_id,))
        return {"order": order_id, "resource": grant.resource_key}

    outer.include_router(inner, prefix="/shop")
    api.include_router(outer, prefix="/v2")
    sub = FastAPI()

    @sub.post("/orders/{order_id}/refund")
    def refund(order_id: int, request: Request) -> dict:
        grant = fence_grant(request)
        assert grant is not None
        grant.connection.execute("UPDATE orders SET refunded = refunded + 1 WHERE id = ?", (order_id,))
        return {"order": order_id, "resource": grant.resource_key}

    api.mount("/legacy", sub)
    # action= names the action here, as before this table existed: what is new is the resource found
    api.add_middleware(FencingMiddleware, store=shop_store, verifier=verifier,
                       resource=route_param("order_id", prefix="order:"),
                       action=lambda scope: "orders.refund" if scope["path"].endswith("/refund") else "orders.pay")
    token = tokens(q, "orders.pay", "orders.refund")
    with serve(api) as client:
        paid = client.post("/v2/shop/orders/017/pay", headers={"Leaseq-Action-Token": token["orders.pay"]})
        assert paid.status_code == 200 and paid.json() == {"order": 17, "resource": "order:17"}, paid.text
        back = client.post("/legacy/orders/17/refund", headers={"Leaseq-Action-Token": token["orders.refund"]})
        assert back.status_code == 200 and back.json() == {"order": 17, "resource": "order:17"}, back.text
    assert orders(shop_store) == [(17, 1, 1)]
    scope = {"type": "http", "method": "POST", "path": "/v2/shop/orders/5/pay", "root_path": "", "headers": [],
             "query_string": b"", "app": api}
    assert match_route(scope) == RouteMatch("POST", "/v2/shop/orders/{order_id:int}/pay", {"order_id": 5}, "pay")
    assert RouteActions({"post /v2/shop/orders/{order_id:int}/pay": "orders.pay"})(scope) == "orders.pay"
    scope["path"] = "/legacy/orders/5/refund"
    assert match_route(scope).key == "POST /legacy/orders/{order_id}/refund"
