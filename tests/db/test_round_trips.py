"""Round trips per call on PostgreSQL, counted on the wire.

libpq's trace of the queue's only pooled connection records every message;
each exchange ends with the server's ReadyForQuery. A call made of one
statement must be one exchange: its statement is its own transaction, with
no BEGIN before it and no COMMIT after it (three exchanges instead of one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import pq

import leaseq
from leaseq import auth


@pytest.fixture
def traced(pg_schema_dsn: str, tmp_path: Path) -> Iterator[tuple[leaseq.Queue, Callable[[Callable[[], Any]], int]]]:
    q = leaseq.connect(pg_schema_dsn, min_size=1, max_size=1)
    q.migrate()
    pool = q.store._pool  # the blocking pool: one connection, which every call uses
    conn = pool.getconn()
    pool.putconn(conn)
    trace = (tmp_path / "libpq.trace").open("w")
    conn.pgconn.trace(trace.fileno())
    conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

    def exchanges(call: Callable[[], Any]) -> int:
        trace.flush()
        start = (tmp_path / "libpq.trace").stat().st_size
        call()
        trace.flush()
        with (tmp_path / "libpq.trace").open() as f:
            f.seek(start)
            return sum("\tReadyForQuery\t" in line for line in f)

    try:
        yield q, exchanges
    finally:
        conn.pgconn.untrace()
        trace.close()
        q.close()


def test_calls_of_one_statement_are_one_round_trip(traced) -> None:
    q, exchanges = traced
    task = q.enqueue("job", {"n": 1})
    calls = {"enqueue": lambda: q.enqueue("job", {"n": 2}), "get": lambda: q.get(task.id),
             "list_tasks": lambda: q.list_tasks(status="queued"), "queues": q.queues, "stats": q.stats,
             "now": q.now}
    for call in calls.values():
        call()  # the first call prepares its statement (a round trip of its own)
    assert {name: exchanges(call) for name, call in calls.items()} == dict.fromkeys(calls, 1)
    with pytest.raises(leaseq.NotFound):
        q.get(task.id + 1000)
    assert q.get(task.id) == task  # the connection is clean after the refused read


def test_the_count_sees_a_transaction_of_several_statements(traced) -> None:
    # The yardstick itself: an enqueue behind an approval gate is a transaction of
    # several statements, BEGIN and COMMIT included, and must count as more than one.
    q, exchanges = traced
    assert exchanges(lambda: q.enqueue("gated", approval="required")) >= 4


def test_a_token_check_outside_a_transaction_is_one_round_trip(traced) -> None:
    # Every operator request begins with it; the record of use (at most once a
    # minute) is a second statement, only when due.
    q, exchanges = traced
    auth.verify_token(q, auth.create_token(q, name="warm", role="operator")[0])  # prepares the statements
    token, record = auth.create_token(q, name="ops", role="operator")
    assert exchanges(lambda: auth.verify_token(q, token)) == 2  # never used: the record of use is due
    assert exchanges(lambda: auth.verify_token(q, token)) == 1
    assert auth.verify_token(q, token).token_id == record["id"]
    for bad in (token[:-1] + ("0" if token[-1] != "0" else "1"), "lq_000000000000_x", None):
        with pytest.raises(auth.Unauthorized):
            auth.verify_token(q, bad)
    auth.revoke_token(q, record["id"], by="test")
    with pytest.raises(auth.Unauthorized, match="revoked"):
        auth.verify_token(q, token)


def test_concurrent_enqueues_sharing_a_transaction_send_their_statements_together(
        pg_schema_dsn: str, tmp_path: Path) -> None:
    # Fifty enqueues waiting while one is written share transactions (leaseq.engine.shared);
    # the inserts of each transaction go in one exchange between its BEGIN and its COMMIT,
    # not one exchange each.
    import asyncio

    from pg_modes import own_connection

    async def story() -> tuple[int, list[leaseq.Task]]:
        async with await leaseq.connect_async(pg_schema_dsn, max_size=1) as aq:
            await aq.migrate()
            await aq.enqueue("job", {"warm": 1})  # prepares the insert on the pool's only connection
            pool = await aq.sync.store._async_pools.get()
            conn = await pool.getconn()
            await pool.putconn(conn)
            trace = (tmp_path / "libpq.trace").open("w")
            conn.pgconn.trace(trace.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                blocker = asyncio.create_task(aq.enqueue("job", {"first": True}))
                await asyncio.sleep(0)  # it is being written: the calls below wait together
                tasks = await asyncio.gather(*(aq.enqueue("job", {"i": i}) for i in range(50)))
                await blocker
            finally:
                trace.flush()
                conn.pgconn.untrace()
                trace.close()
        return (tmp_path / "libpq.trace").read_text().count("\tReadyForQuery\t"), tasks

    exchanges, tasks = asyncio.run(story())
    assert sorted(t.payload["i"] for t in tasks) == list(range(50))
    with own_connection(pg_schema_dsn) as conn:
        sizes = [n for (n,) in conn.execute("SELECT count(*) FROM leaseq_tasks WHERE id = ANY(%s) GROUP BY xmin::text",
                                            ([t.id for t in tasks],))]
    assert sum(sizes) == 50 and max(sizes) > 1, sizes
    # the blocker's one; then per transaction: a call alone, one; several: BEGIN, the inserts, COMMIT
    assert exchanges == 1 + sum(1 if n == 1 else 3 for n in sizes), (exchanges, sizes)
