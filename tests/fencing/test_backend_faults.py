"""The fenced store when its PostgreSQL connection is dropped (pg_terminate_backend), mid-transaction.

A dropped connection is infrastructure trouble: FencedStore.apply raises
leaseq.BackendUnavailable (nothing recorded, the apply can be retried) and the
middleware answers 503, never 500.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

import leaseq
from leaseq.fencing import ActionSigner, FencedStore, FencingMiddleware, fence_grant
from pg_faults import backends, tagged, terminate
from pg_modes import POOLED

from .conftest import add_entry, ledger
from .test_middleware import serve

SECRET = bytes(range(32, 64))


@pytest.fixture
def pg_store(pg_schema_dsn: str) -> Iterator[tuple[FencedStore, str]]:
    """A migrated PostgreSQL FencedStore with a ``ledger`` table, and its connections' application_name."""
    dsn, name = tagged(pg_schema_dsn)
    fenced = FencedStore(dsn, min_size=2, max_size=4)
    fenced.migrate()
    with fenced.transaction() as conn:
        conn.execute("CREATE TABLE ledger (account TEXT NOT NULL, amount INTEGER NOT NULL, note TEXT)")
    try:
        yield fenced, name
    finally:
        fenced.close()


def drop_own_connection(conn) -> None:
    """End the server backend behind ``conn`` from another connection, as a failover would (the
    backend's own pid: through PgBouncer, ``conn.info.backend_pid`` is the pooler's, not the
    server's, and the transaction holds its server connection until it ends)."""
    [[pid]] = conn.execute("SELECT pg_backend_pid()").fetchall()
    terminate(pid=pid)


@pytest.mark.parametrize("key", [None, "dep-1"])
def test_a_connection_dropped_inside_the_write_is_backend_unavailable(pg_store, key):
    store, _ = pg_store

    def write(conn):
        add_entry(conn, store, "alice", 10)
        drop_own_connection(conn)
        add_entry(conn, store, "alice", 20)  # the driver meets the dropped connection here

    with pytest.raises(leaseq.BackendUnavailable, match="terminating connection|server closed|connection"):
        store.apply("account:alice", "1.3", write, idempotency_key=key)
    assert ledger(store) == [] and store.newest_generation("account:alice", 1) is None
    # The broken connection left the pool; the retry succeeds.
    assert store.apply("account:alice", "1.3", lambda conn: add_entry(conn, store, "alice", 10) or "ok",
                       idempotency_key=key) == "ok"
    assert ledger(store) == [("alice", 10, "")]


@pytest.mark.parametrize("key", [None, "dep-2"])
def test_a_connection_dropped_before_the_commit_is_backend_unavailable(pg_store, key):
    store, _ = pg_store

    def write(conn):
        add_entry(conn, store, "bob", 5)
        drop_own_connection(conn)
        return {"ok": True}  # the outcome record or the COMMIT meets the dropped connection

    with pytest.raises(leaseq.BackendUnavailable):
        store.apply("account:bob", "1.1", write, idempotency_key=key)
    assert ledger(store) == [] and store.newest_generation("account:bob", 1) is None


def test_idle_pool_connections_dropped_by_the_server_do_not_fail_the_next_apply(pg_store):
    store, name = pg_store
    store.apply("account:carol", "1.1", lambda conn: None)
    before = backends(name)
    # through PgBouncer the pool's two connections may share one server connection
    assert terminate(name=name) == len(before) >= (1 if POOLED else 2)
    for token in (1, 2, 3):
        store.apply("account:carol", f"1.{token}", lambda conn: add_entry(conn, store, "carol", 1))
    assert len(ledger(store)) == 3 and backends(name).isdisjoint(before)


def test_the_middleware_answers_503_when_the_fence_connection_drops_mid_transaction(pg_store):
    store, _ = pg_store
    signer = ActionSigner({"k1": SECRET}, "k1")
    drop = {"next": True}

    async def deposit(request):
        grant = fence_grant(request)
        add_entry(grant.connection, store, "dave", 1, str(grant.fencing_token))
        if drop["next"]:
            drop["next"] = False
            drop_own_connection(grant.connection)
        return JSONResponse({"token": grant.fencing_token})

    inner = Starlette(routes=[Route("/accounts/dave/deposit", deposit, methods=["POST"])])
    app = FencingMiddleware(inner, store=store, signer=signer, action=lambda scope: "deposit",
                            resource=lambda scope: "account:" + scope["path"].split("/")[2])
    token = signer.issue(task_id=7, generation=4, action="deposit", idempotency_key="dep-7", ttl_seconds=120,
                         resource="account:dave")
    with serve(app) as client:
        dropped = client.post("/accounts/dave/deposit", headers={"Leaseq-Action-Token": token})
        assert dropped.status_code == 503, dropped.text
        assert dropped.json()["error"]["code"] == "unavailable"
        assert ledger(store) == [] and store.newest_generation("account:dave", 7) is None and store.outcome("dep-7") is None
        # Nothing was recorded: the same request, retried, runs once and succeeds.
        retried = client.post("/accounts/dave/deposit", headers={"Leaseq-Action-Token": token})
        assert retried.status_code == 200 and retried.json() == {"token": "7.4"}
    assert ledger(store) == [("dave", 1, "7.4")]
