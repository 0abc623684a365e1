"""Pooled PostgreSQL connections the server dropped are replaced at checkout, sync and asyncio.

Every idle connection of the queue's pools is ended with pg_terminate_backend
(what a failover or a pooler restart does to them); the next calls must all
succeed, on fresh connections, with no call paying for a stale one.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import leaseq

from pg_faults import backends, tagged, terminate


@pytest.fixture
def tagged_dsn(pg_schema_dsn: str) -> tuple[str, str]:
    return tagged(pg_schema_dsn)


def test_stale_pooled_connections_do_not_fail_the_next_sync_calls(tagged_dsn):
    dsn, name = tagged_dsn
    q = leaseq.connect(dsn, min_size=4, max_size=4)
    try:
        q.migrate()
        w = q.register_worker("w")
        q.enqueue("job", {"n": 1})
        before = backends(name)
        assert len(before) == 4  # the whole pool is open and idle
        assert terminate(name=name) == 4
        # Every call below would have met a dead connection.
        for n in range(2, 6):
            q.enqueue("job", {"n": n})
        claims = q.claim(w, limit=10)
        assert len(claims) == 5
        for c in claims:
            q.complete(w, c, result={"ok": True})
        assert {t.status for t in (q.get(c.task_id) for c in claims)} == {"completed"}
        assert backends(name).isdisjoint(before)
    finally:
        q.close()


def test_a_pool_of_stale_connections_is_replaced_within_one_checkout(tagged_dsn):
    """psycopg_pool's own check= hook backs off 1, 2, 4... s between failed checks (a
    10-connection pool would time out); ours closes each dead one and takes the next at once."""
    dsn, name = tagged_dsn
    q = leaseq.connect(dsn, min_size=8, max_size=8)
    try:
        q.migrate()
        assert len(backends(name)) == 8
        terminate(name=name)
        from leaseq.db.postgres import checked_connection

        started = time.monotonic()
        with checked_connection(q.store._pool) as conn:
            assert conn.execute("SELECT 1 AS one").fetchone()["one"] == 1
        assert time.monotonic() - started < 5.0
    finally:
        q.close()


def test_stale_pooled_connections_do_not_fail_the_next_async_calls(tagged_dsn):
    dsn, name = tagged_dsn
    q = leaseq.connect(dsn, min_size=1, max_size=4)
    try:
        q.migrate()
        w = q.register_worker("w")
        q.enqueue_many("job", [{"n": n} for n in range(20)])

        aq = leaseq.AsyncQueue(q)

        async def main() -> int:
            got = len(await aq.claim(w, limit=1))  # opens this loop's asyncio pool
            # Grow the asyncio pool: several statements at once.
            batches = await asyncio.gather(*(aq.claim(w, limit=1) for _ in range(4)))
            got += sum(len(b) for b in batches)
            before = backends(name)
            assert terminate(name=name) == len(before) >= 2  # the sync pool's and the asyncio pool's
            for _ in range(5):
                claims = await aq.claim(w, limit=2)
                got += len(claims)
                assert await aq.complete_many(w, [(c, {"ok": True}) for c in claims]) == {c.task_id for c in claims}
            assert backends(name).isdisjoint(before)
            await aq.close_async()
            return got

        assert asyncio.run(main()) == 15
    finally:
        q.close()


def test_statements_go_to_the_server_without_their_comments(pg_schema_dsn):
    """The claim's text with its comments is over psycopg's 4 KB query-cache limit; the store
    sends a call of its function (whose body is the query: leaseq.store.functions), and the
    statements sent as written go compacted (tests/unit/test_queries.py holds every one
    under the limit)."""
    from psycopg import _queries

    from leaseq.store.functions import wire_queries
    from leaseq.store.queries import load_queries, load_wire_queries

    with leaseq.connect(pg_schema_dsn) as q:
        sent = q.store._queries
        assert sent == wire_queries()[0]
        assert len(load_queries("postgres")["claim_batch"]) > _queries.MAX_CACHED_STATEMENT_LENGTH
        assert sent["claim_batch"].startswith("SELECT * FROM leaseq_q_claim_batch(")
        assert sent["migrations_applied"] == load_wire_queries("postgres")["migrations_applied"]
        assert all("--" not in text and len(text) < _queries.MAX_CACHED_STATEMENT_LENGTH for text in sent.values())
        q.migrate()
        q.enqueue("job")
        assert len(q.claim(q.register_worker("w"))) == 1


def test_the_asyncio_pool_serves_the_parties_waiting_in_turn(pg_schema_dsn):
    """A burst of one party's transactions (a token's hundred waits ending at once, asked
    again) queues behind itself: another party's transaction asked for after the whole burst
    gets one of the next connections that free, not the burst's last (issue 29). First come
    first served, it entered after all twenty of the burst's."""
    from leaseq.db.postgres import pool_party

    q = leaseq.connect(pg_schema_dsn, min_size=2, max_size=2)
    entered: list[str] = []

    async def one(party: str, n: int) -> None:
        pool_party.set(party)  # this task's own context
        async with q.ajoined() as (_, tx):
            entered.append(f"{party}{n}")
            await tx.rows("db_now")
            await asyncio.sleep(0.02)  # holds its connection a while, as a claim under load does

    async def burst() -> None:
        async with q.ajoined() as (_, tx):  # the asyncio pool open, its two connections too
            await tx.rows("db_now")
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(one("hostile", n)) for n in range(20)]
        await asyncio.sleep(0.005)  # every one of them asked (two entered, eighteen wait)
        tasks.append(loop.create_task(one("honest", 0)))
        await asyncio.gather(*tasks)
        await q.close_async()

    try:
        q.migrate()
        asyncio.run(burst())
    finally:
        q.close()
    assert len(entered) == 21
    assert entered.index("honest0") <= 3, entered  # the two holding, then at most one more of the burst
