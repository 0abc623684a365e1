"""The two real processes of test_zombie.py: a leaseq worker that calls a shop, and the shop.

Kept import-light; both read their settings from the environment.

- ``worker``: ``leaseq worker tests.fencing.zombie_apps:worker``. Its task
  records the intent of ``orders.pay``, writes the action token it was given
  to ``token-<generation>`` in ``$FAULT_DIR``, waits for ``go-<generation>``
  with a plain sleep (a frozen-and-resumed worker that ignores its lost
  lease, as a request already on its way would), then calls the shop with
  that token and writes the answer to ``status-<generation>``.
- ``shop``: ``uvicorn tests.fencing.zombie_apps:shop``. A FastAPI service set
  up as the README documents: ``FencingMiddleware`` with the queue's signer
  and ``route_param``; with ``$LEASE_CHECK=same`` its store also asks the
  queue (tables in the same database) whether the attempt still holds its
  lease. ``$LEEWAY`` is the clock-skew leeway in seconds.
"""


import os
import time
from pathlib import Path

import leaseq

FAULT_DIR = Path(os.environ.get("FAULT_DIR", "."))


def _mark(name: str, text: str) -> None:
    tmp = FAULT_DIR / f".{name}.tmp"
    tmp.write_text(text)
    tmp.rename(FAULT_DIR / name)


worker = leaseq.App()


@worker.task("pay_order", effect="idempotent", lease_seconds=float(os.environ.get("LEASE", "2")),
             actions=["orders.pay"])
def pay_order(ctx: leaseq.TaskContext, order_id: int) -> dict:
    import httpx

    gen = ctx.generation
    with ctx.effect("orders.pay", key=f"pay:{order_id}", resource=f"order:{order_id}") as fx:
        token = fx.token
        _mark(f"token-{gen}", token or "")
        while not (FAULT_DIR / f"go-{gen}").exists():
            time.sleep(0.02)
        answer = httpx.post(f"{os.environ['SHOP_URL']}/orders/{order_id}/pay",
                            headers={"Leaseq-Action-Token": token}, timeout=30)
        _mark(f"status-{gen}", f"{answer.status_code} {answer.text}")
        fx.record({"status": answer.status_code})
    return {"status": answer.status_code}


def _shop():
    from fastapi import FastAPI, Request

    from leaseq.fencing import ActionSigner, FencedStore, FencingMiddleware, QueueLeaseCheck, fence_grant, route_param

    dsn = os.environ["SHOP_DSN"]
    store = FencedStore(dsn, lease_check=QueueLeaseCheck() if os.environ.get("LEASE_CHECK") == "same" else None)
    mark = "%s" if store.dialect == "postgres" else "?"
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app.post("/orders/{order_id}/pay")
    def pay(order_id: int, request: Request) -> dict:
        grant = fence_grant(request)
        grant.connection.execute(f"INSERT INTO payments (order_id, token) VALUES ({mark}, {mark})",
                                 (order_id, grant.fencing_token))
        return {"paid": order_id, "by": grant.fencing_token}

    app.add_middleware(FencingMiddleware, store=store, signer=ActionSigner.from_env(),
                       resource=route_param("order_id", prefix="order:"), action=lambda scope: "orders.pay",
                       leeway_seconds=float(os.environ.get("LEEWAY", "1")))
    return app


shop = _shop() if os.environ.get("SHOP_DSN") else None
