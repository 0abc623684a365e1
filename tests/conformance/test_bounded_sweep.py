"""The sweep of every queue, bounded: a pass examines at most ``max_queues`` queues, on both backends.

``Queue.sweep`` (``leaseq sweep``, ``leaseq serve``'s maintenance) walks the queues in name order
from where its previous pass stopped, examines at most ``max_queues`` of them (1000 by default)
and sweeps those with work, many queues to a transaction, one locking statement per queue. So a
pass over ten thousand queues with an expired lease each costs what one over a thousand does, and
passes reach every queue in turn. Transactions are counted by a wrapper around the queue's own
store: every transaction an operation opens is asked of it.

Sweeping is a queue operation for the library and the CLI (and the service's maintenance); it is
not offered over HTTP, so its transports here are the blocking and the awaited queue.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq.core.errors import InvalidInput
from leaseq.engine.expiry import SWEEP_MAX_QUEUES, SWEEP_TX_QUEUES

from .support import run_out

#: Ten thousand queues, each with one expired lease.
MANY = 10_000

# Rows written by hand: a lease that ran out a minute ago in each of n queues (q00000, q00001, ...),
# held by a registered worker at generation 1. The trails hold no "claimed" event: no claim made them.
PG_EXPIRED = """
INSERT INTO leaseq_tasks (queue, kind, payload, effect, status, idempotency_key, max_attempts, lease_seconds,
                          claim_generation, attempts, lease_owner, lease_expires_at, claimed_at)
SELECT %(prefix)s || lpad(g::text, 5, '0'), 'job', '{}', 'read_only', 'running', 'k' || g, 5, 30, 1, 1,
       %(worker)s, now() - interval '1 minute', now() - interval '2 minutes'
FROM generate_series(0, %(n)s - 1) AS g
"""
SQLITE_EXPIRED = """
WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < :n - 1)
INSERT INTO leaseq_tasks (queue, kind, payload, effect, status, idempotency_key, max_attempts, lease_seconds,
                          claim_generation, attempts, lease_owner, lease_expires_at, claimed_at)
SELECT :prefix || printf('%05d', n), 'job', '{}', 'read_only', 'running', 'k' || n, 5, 30, 1, 1,
       :worker, (julianday('now') - 2440587.5) * 86400.0 - 60, (julianday('now') - 2440587.5) * 86400.0 - 120
FROM g
"""


def expired_in_queues(q: leaseq.Queue, n: int, *, prefix: str = "q") -> None:
    """An expired lease in each of ``n`` queues (``<prefix>00000`` ...), written in one statement."""
    worker = q.register_worker("gone").id
    params = {"n": n, "worker": worker, "prefix": prefix}
    if q.dialect == "postgres":
        with psycopg.connect(q.store.conninfo, autocommit=True) as conn:  # type: ignore[attr-defined]
            with conn.transaction():
                conn.execute("SET LOCAL ROLE leaseq_owner")  # the lease columns are the owner's to write
                conn.execute(PG_EXPIRED, params)
            conn.execute("ANALYZE leaseq_tasks")
    else:
        with sqlite3.connect(q.store.path) as conn:  # type: ignore[attr-defined]
            conn.execute(SQLITE_EXPIRED, params)


def routings(q: leaseq.Queue) -> dict[int, int]:
    """How many ``lease_expired`` events each task has, by task id."""
    sql = "SELECT task_id, count(*) FROM leaseq_events WHERE type = 'lease_expired' GROUP BY task_id"
    if q.dialect == "postgres":
        with psycopg.connect(q.store.conninfo) as conn:  # type: ignore[attr-defined]
            return dict(conn.execute(sql).fetchall())  # type: ignore[arg-type]
    with sqlite3.connect(q.store.path) as conn:  # type: ignore[attr-defined]
        return dict(conn.execute(sql).fetchall())


def still_running(q: leaseq.Queue) -> int:
    sql = "SELECT count(*) FROM leaseq_tasks WHERE status = 'running'"
    if q.dialect == "postgres":
        with psycopg.connect(q.store.conninfo) as conn:  # type: ignore[attr-defined]
            return int(conn.execute(sql).fetchone()[0])  # type: ignore[index]
    with sqlite3.connect(q.store.path) as conn:  # type: ignore[attr-defined]
        return int(conn.execute(sql).fetchone()[0])


@contextmanager
def counted_transactions(q: leaseq.Queue) -> Iterator[list[bool]]:
    """Every transaction the queue's operations open meanwhile, recorded (its one_statement flag)."""
    store: Any = q.store
    opened: list[bool] = []
    real: Callable[..., Any] = store.transaction

    def transaction(*, one_statement: bool = False) -> Any:
        opened.append(one_statement)
        return real(one_statement=one_statement)

    store.transaction = transaction
    try:
        yield opened
    finally:
        del store.transaction


@pytest.mark.trails_unchecked("the expired leases are written by hand: no claim made them")
def test_a_pass_over_ten_thousand_queues_is_bounded_and_passes_reach_every_queue(q: leaseq.Queue) -> None:
    expired_in_queues(q, MANY)
    # one pass: the first thousand queues, in name order, in a bounded number of transactions
    with counted_transactions(q) as opened:
        assert q.sweep() == SWEEP_MAX_QUEUES
    # the list of queues, then a thousand queues a hundred to a transaction (not one each)
    assert SWEEP_TX_QUEUES == 100 and len(opened) == 11, len(opened)
    assert q.sweep_resumes_after == f"q{SWEEP_MAX_QUEUES - 1:05d}"
    assert sorted(routings(q)) == list(range(1, SWEEP_MAX_QUEUES + 1))  # ids follow the queue names
    # the passes that follow take the next thousand each, until the last queue
    passes = [SWEEP_MAX_QUEUES]
    while q.sweep_resumes_after is not None:
        with counted_transactions(q) as opened:
            passes.append(q.sweep())
        assert len(opened) <= 11
    # (the tenth stopped at its bound on the last queue: the next finds none after it)
    assert passes == [SWEEP_MAX_QUEUES] * (MANY // SWEEP_MAX_QUEUES) + [0]
    assert still_running(q) == 0
    assert set(routings(q).values()) == {1} and len(routings(q)) == MANY  # each lease routed once
    assert q.sweep() == 0  # nothing left (a pass from the first queue: the first thousand)


@pytest.mark.trails_unchecked("the expired leases are written by hand: no claim made them")
def test_passes_resume_after_the_last_queue_examined_and_start_again_at_the_first(q: leaseq.Queue) -> None:
    expired_in_queues(q, 7)
    w = q.register_worker("w")
    q.enqueue("job", {}, queue="q00002b")  # a queue with nothing to sweep is examined all the same
    assert q.sweep(max_queues=3) == 3 and q.sweep_resumes_after == "q00002"
    assert q.sweep(max_queues=3) == 2 and q.sweep_resumes_after == "q00004"  # q00002b, q00003, q00004
    # work in a queue before the cursor: the pass after the one that reaches the last queue finds it
    late = q.enqueue("job", {}, queue="a-late")
    [c] = q.claim(w, queue="a-late")
    run_out(q, w, c)
    assert q.sweep(max_queues=3) == 2 and q.sweep_resumes_after is None  # q00005, q00006: the end
    assert q.get(late.id).status == "running"
    assert q.sweep(max_queues=3) == 1 and q.get(late.id).status == "queued"  # a-late, q00000, q00001
    assert q.sweep_resumes_after == "q00001"


@pytest.mark.parametrize("bad", [0, -1, SWEEP_MAX_QUEUES * 1000, 2.5, "10", True])
def test_a_bad_max_queues_is_refused_naming_the_field(q: leaseq.Queue, bad: Any) -> None:
    with pytest.raises(InvalidInput, match="max_queues") as raised:
        q.sweep(max_queues=bad)
    assert raised.value.field == "max_queues"

    async def awaited() -> None:
        async with await leaseq.connect_async(q.store.dsn) as aq:  # type: ignore[attr-defined]
            with pytest.raises(InvalidInput, match="max_queues"):
                await aq.sweep(max_queues=bad)
    asyncio.run(awaited())


@pytest.mark.trails_unchecked("the expired leases are written by hand: no claim made them")
def test_the_awaited_sweep_is_bounded_and_resumes_alike(q: leaseq.Queue) -> None:
    expired_in_queues(q, 250)

    async def passes() -> list[int]:
        async with await leaseq.connect_async(q.store.dsn) as aq:  # type: ignore[attr-defined]
            done = [await aq.sweep(max_queues=100)]
            assert aq.sweep_resumes_after == "q00099"
            while aq.sweep_resumes_after is not None:
                done.append(await aq.sweep(max_queues=100))
            return done
    assert asyncio.run(passes()) == [100, 100, 50]
    assert still_running(q) == 0 and set(routings(q).values()) == {1}


@pytest.mark.trails_unchecked("the expired leases are written by hand: no claim made them")
def test_two_sweepers_at_once_route_each_lease_exactly_once(q: leaseq.Queue) -> None:
    """A race: two queue objects (connections of their own) sweep the same queues at the same time,
    in passes of their own; every lease is routed once, by one of them."""
    n = 2000
    expired_in_queues(q, n)
    start = threading.Barrier(2)
    routed: list[int] = []
    errors: list[BaseException] = []

    def sweeper() -> None:
        try:
            with leaseq.connect(q.store.dsn) as mine:  # type: ignore[attr-defined]
                start.wait()
                total = mine.sweep(max_queues=300)
                while mine.sweep_resumes_after is not None:
                    total += mine.sweep(max_queues=300)
                routed.append(total)
        except BaseException as exc:  # the test's thread reports it
            errors.append(exc)

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sum(routed) == n, routed  # each counted by the one that routed it
    found = routings(q)
    assert len(found) == n and set(found.values()) == {1}
    assert still_running(q) == 0
