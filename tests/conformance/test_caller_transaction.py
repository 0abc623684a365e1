"""enqueue(..., connection=conn): the task is written in the application's own
transaction and exists only if the application commits (the outbox pattern)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

import leaseq
from leaseq.db.dsn import parse_dsn
from pg_modes import aown_connection, own_connection


def _app_connection(q: leaseq.Queue, dsn: str):
    """The application's own connection to the queue's database, not in autocommit mode."""
    if q.dialect == "postgres":
        return own_connection(dsn)
    return sqlite3.connect(parse_dsn(dsn)[1])


def _committed_tasks(dsn: str) -> int:
    """How many tasks another connection sees."""
    dialect, target = parse_dsn(dsn)
    conn = own_connection(dsn) if dialect == "postgres" else sqlite3.connect(target)
    try:
        return conn.execute("SELECT count(*) FROM leaseq_tasks").fetchone()[0]
    finally:
        conn.close()


def _orders_table(conn) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id integer PRIMARY KEY, item text)")
    conn.commit()


def test_a_rolled_back_transaction_leaves_no_task(q: leaseq.Queue, dsn: str) -> None:
    conn = _app_connection(q, dsn)
    try:
        _orders_table(conn)
        conn.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
        t = q.enqueue("ship", {"order": 1}, connection=conn)
        ids = q.enqueue_many("notify", [1, 2], connection=conn)
        assert t.status == "queued" and len(ids) == 2
        conn.rollback()
    finally:
        conn.close()
    assert q.list_tasks() == []
    w = q.register_worker("w")
    assert q.claim(w) == []


def test_a_committed_transaction_makes_the_task_claimable(q: leaseq.Queue, dsn: str) -> None:
    w = q.register_worker("w")
    first = q.enqueue("prepare")
    conn = _app_connection(q, dsn)
    try:
        _orders_table(conn)
        conn.execute("INSERT INTO orders (id, item) VALUES (2, 'pen')")
        t = q.enqueue("ship", {"order": 2}, idempotency_key="order-2", connection=conn)
        child = q.enqueue("invoice", connection=conn, after=[first.id, t.id])
        assert _committed_tasks(dsn) == 1  # not visible before the commit (read beside it: on SQLite
        # leaseq's own calls would wait for the application's write lock)
        conn.commit()
        again = q.enqueue("ship", {"order": 2}, idempotency_key="order-2", connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert again.id == t.id
    assert q.get(child.id).status == "waiting"
    claimed = {c.task_id: c for c in q.claim(w, limit=5)}
    assert set(claimed) == {first.id, t.id}
    q.complete_many(w, [(c, None) for c in claimed.values()])
    assert q.get(child.id).status == "queued"


def test_a_connection_of_the_wrong_kind_is_refused(q: leaseq.Queue, dsn: str, tmp_path) -> None:
    if q.dialect == "postgres":
        wrong = sqlite3.connect(tmp_path / "other.db")
    else:
        pg = pytest.importorskip("psycopg")
        import os
        if not os.environ.get("LEASEQ_TEST_PG_DSN"):
            pytest.skip("needs a PostgreSQL connection to hand to a SQLite queue")
        wrong = pg.connect(os.environ["LEASEQ_TEST_PG_DSN"])
    try:
        for conn in (wrong, object(), None.__class__):
            with pytest.raises(leaseq.InvalidInput) as err:
                q.enqueue("ship", connection=conn)
            assert err.value.field == "connection"
    finally:
        wrong.close()
    assert q.list_tasks() == []


def test_a_connection_without_a_transaction_or_to_another_file_is_refused(q: leaseq.Queue, dsn: str,
                                                                          tmp_path) -> None:
    if q.dialect == "postgres":
        auto = own_connection(dsn, autocommit=True)
    else:
        auto = sqlite3.connect(parse_dsn(dsn)[1], isolation_level=None)
        other = sqlite3.connect(tmp_path / "other.db")
        with pytest.raises(leaseq.InvalidInput, match="not on the queue's file") as err:
            q.enqueue("ship", connection=other)
        other.close()
    try:
        with pytest.raises(leaseq.InvalidInput, match="autocommit") as err:
            q.enqueue("ship", connection=auto)
        assert err.value.field == "connection"
        if q.dialect == "postgres":
            with auto.transaction():  # an explicit transaction is one
                q.enqueue("ship", {"n": 1}, connection=auto)
        else:
            auto.execute("BEGIN")
            q.enqueue("ship", {"n": 1}, connection=auto)
            auto.execute("COMMIT")
    finally:
        auto.close()
    assert [t.payload for t in q.list_tasks()] == [{"n": 1}]


def test_async_enqueue_in_the_callers_transaction(q: leaseq.Queue, dsn: str) -> None:
    async def main() -> None:
        aq = leaseq.AsyncQueue(q)
        if q.dialect == "postgres":
            conn = await aown_connection(dsn)
            await aq.enqueue("ship", {"n": 1}, connection=conn)
            await conn.rollback()
            await aq.enqueue_many("ship", [{"n": 2}], connection=conn)
            await conn.commit()
            with pytest.raises(leaseq.InvalidInput) as err:
                await aq.enqueue("ship", connection=own_connection(dsn))
            assert err.value.field == "connection"
            await conn.close()
        else:
            conn = sqlite3.connect(parse_dsn(dsn)[1])
            await aq.enqueue("ship", {"n": 1}, connection=conn)
            conn.rollback()
            await aq.enqueue_many("ship", [{"n": 2}], connection=conn)
            conn.commit()
            conn.close()

    asyncio.run(main())
    assert [t.payload for t in q.list_tasks()] == [{"n": 2}]
