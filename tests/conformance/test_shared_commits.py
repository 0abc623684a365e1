"""Concurrent ``AsyncQueue.enqueue`` calls share transactions (leaseq.engine.shared), and each
call still gets what it would have had alone: its own task, its own error, the order of the
calls before it. The outcomes are checked on both backends (SQLite has no asyncio driver: its
calls run one by one); that calls did share a commit is checked on PostgreSQL, where rows
written by one transaction carry its id (``xmin``)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

import leaseq
from leaseq.store import parse_dsn

POISONED = "refused by the trigger of this test"


def refuse_poison(dsn: str) -> None:
    """Make the database refuse the insert of a task whose payload has the key ``poison``
    (a trigger in the test's own schema): a statement that fails inside a transaction."""
    dialect, target = parse_dsn(dsn)
    if dialect == "sqlite":
        conn = sqlite3.connect(target)
        try:
            with conn:
                conn.execute("CREATE TRIGGER leaseq_test_poison BEFORE INSERT ON leaseq_tasks "
                             "WHEN json_extract(NEW.payload, '$.poison') IS NOT NULL "
                             f"BEGIN SELECT RAISE(ABORT, '{POISONED}'); END")
        finally:
            conn.close()
        return
    from pg_modes import own_connection

    with own_connection(dsn) as pg:
        pg.execute(f"CREATE FUNCTION leaseq_test_poison() RETURNS trigger LANGUAGE plpgsql AS "
                   f"$$ BEGIN RAISE EXCEPTION '{POISONED}'; END $$")
        pg.execute("CREATE TRIGGER leaseq_test_poison BEFORE INSERT ON leaseq_tasks FOR EACH ROW "
                   "WHEN (NEW.payload ? 'poison') EXECUTE FUNCTION leaseq_test_poison()")


def _transactions(dsn: str, ids: list[int]) -> int:
    """How many transactions wrote the tasks ``ids`` (PostgreSQL)."""
    from pg_modes import own_connection

    with own_connection(dsn) as conn:
        row = conn.execute("SELECT count(DISTINCT xmin::text) FROM leaseq_tasks WHERE id = ANY(%s)",
                           (ids,)).fetchone()
    assert row is not None
    return int(row[0])


def _callers(aq: leaseq.AsyncQueue, calls: int, callers: int, **options: object) -> list[leaseq.Task]:
    async def caller(c: int) -> list[leaseq.Task]:
        return [await aq.enqueue("job", {"i": i}, **options) for i in range(c, calls, callers)]  # type: ignore[arg-type]

    async def together() -> list[leaseq.Task]:
        return [t for share in await asyncio.gather(*(caller(c) for c in range(callers))) for t in share]

    return asyncio.run(together())


def test_concurrent_enqueues_each_get_their_own_task_and_share_commits(dsn: str) -> None:
    async def migrate() -> leaseq.AsyncQueue:
        aq = await leaseq.connect_async(dsn)
        await aq.migrate()
        return aq

    aq = asyncio.run(migrate())
    try:
        tasks = _callers(aq, 400, 40)
        assert len({t.id for t in tasks}) == 400
        assert sorted(t.payload["i"] for t in tasks) == list(range(400))
        assert {t.enqueue_outcome for t in tasks} == {"created"}
        for t in tasks[::37]:  # each returned task is the row written for that call
            assert aq.sync.get(t.id).payload == t.payload
        assert len(aq.sync.events(tasks[0].id)) >= 1
        if aq.dialect == "postgres":
            assert _transactions(dsn, [t.id for t in tasks]) < 200  # shared: each alone would be 400
            alone = [aq.sync.enqueue("job", {"alone": i}).id for i in range(3)]
            assert _transactions(dsn, alone) == 3
    finally:
        asyncio.run(aq.close())


def test_a_refused_call_fails_alone_and_a_key_names_one_task_among_concurrent_calls(dsn: str) -> None:
    async def story() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            await aq.migrate()
            blocker = asyncio.create_task(aq.enqueue("job", {"first": True}))  # writing: the rest wait together
            calls = [aq.enqueue("job", {"i": i}) for i in range(5)]
            calls.append(aq.enqueue("job", {"k": 1}, idempotency_key="same"))
            calls.append(aq.enqueue("job", {"k": 1}, idempotency_key="same"))
            calls.append(aq.enqueue("job", {"bad": 1}, max_attempts=0))  # refused before any statement
            calls.append(aq.enqueue("job", {"k": 2}, idempotency_key="same"))  # reused: another task
            calls += [aq.enqueue("job", {"j": i}) for i in range(5)]
            results = await asyncio.gather(blocker, *calls, return_exceptions=True)
            first, rest = results[0], results[1:]
            assert isinstance(first, leaseq.Task)
            made = [r for r in rest[:5] + rest[-5:]]
            assert all(isinstance(r, leaseq.Task) and r.enqueue_outcome == "created" for r in made)
            keyed, bad = [rest[5], rest[6], rest[8]], rest[7]
            # concurrent calls, in whichever order their transactions took them: the key names one
            # task, the calls asking for it as it was made get it, the others are refused
            found = [r for r in keyed if isinstance(r, leaseq.Task)]
            refused = [r for r in keyed if not isinstance(r, leaseq.Task)]
            assert found and all(isinstance(r, leaseq.IdempotencyKeyConflict) for r in refused), keyed
            assert len({t.id for t in found}) == 1 and [t.enqueue_outcome for t in found].count("created") == 1
            assert all(t.payload == found[0].payload for t in found)
            assert (len(found), found[0].payload) in ((2, {"k": 1}), (1, {"k": 2}))
            assert isinstance(bad, leaseq.InvalidInput) and bad.field == "max_attempts"
            everything = await aq.list_tasks(limit=100)
            assert len(everything) == 1 + 10 + 1  # the refused calls wrote nothing
            assert {t.id for t in everything} == {first.id, found[0].id} | {r.id for r in made}

    asyncio.run(story())


@pytest.mark.parametrize("cancel_at", ["waiting"])
def test_a_call_cancelled_while_it_waits_writes_nothing(dsn: str, cancel_at: str) -> None:
    async def story() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            await aq.migrate()
            blocker = asyncio.create_task(aq.enqueue("job", {"first": True}))
            await asyncio.sleep(0)  # the blocker is writing
            waiting = asyncio.create_task(aq.enqueue("job", {"cancelled": True}))
            await asyncio.sleep(0)
            if aq.dialect == "postgres":  # on SQLite each call is in a thread of its own, unshared
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                await blocker
                assert [t.payload for t in await aq.list_tasks()] == [{"first": True}]
            else:
                await asyncio.gather(blocker, waiting)

    asyncio.run(story())


def test_a_statement_the_database_refuses_fails_its_call_alone(dsn: str) -> None:
    # The inserts of a shared transaction are sent together (PostgreSQL's pipeline): one the
    # database refuses fails the transaction, and each call runs again alone, so only it fails.
    async def story() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            await aq.migrate()
            refuse_poison(dsn)
            blocker = asyncio.create_task(aq.enqueue("job", {"first": True}))  # writing: the rest wait together
            await asyncio.sleep(0)
            calls = [aq.enqueue("job", {"i": i}) for i in range(6)]
            calls.insert(3, aq.enqueue("job", {"poison": 1}))
            results = await asyncio.gather(blocker, *calls, return_exceptions=True)
            poisoned = results.pop(4)
            assert isinstance(poisoned, Exception) and POISONED in str(poisoned), poisoned
            assert all(isinstance(r, leaseq.Task) and r.enqueue_outcome == "created" for r in results), results
            stored = await aq.list_tasks(limit=100)
            assert sorted(t.id for t in stored) == sorted(r.id for r in results if isinstance(r, leaseq.Task))
            assert all("poison" not in t.payload for t in stored)

    asyncio.run(story())


def test_calls_of_several_statements_share_a_transaction_with_calls_of_one(dsn: str) -> None:
    # A call whose transaction has several statements (a budget, a singleton key, a wait on
    # another task) runs them whole, in its turn, among the single inserts sent together; a
    # call naming the same key, in whichever order their transactions took them, sees all of it.
    async def story() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            await aq.migrate()
            upstream = await aq.enqueue("job", {"up": 1})
            blocker = asyncio.create_task(aq.enqueue("job", {"first": True}))
            await asyncio.sleep(0)
            budget = {"tokens": 500}
            calls = [aq.enqueue("job", {"i": 0}),
                     aq.enqueue("job", {"b": 1}, idempotency_key="kb", budget=budget),
                     aq.enqueue("job", {"i": 1}),
                     aq.enqueue("job", {"b": 1}, idempotency_key="kb", budget=budget),
                     aq.enqueue("job", {"s": 1}, singleton_key="one"),
                     aq.enqueue("job", {"i": 2}),
                     aq.enqueue("job", {"s": 2}, singleton_key="one"),
                     aq.enqueue("job", {"w": 1}, after=[upstream.id]),
                     aq.enqueue("job", {"i": 3})]
            results = await asyncio.gather(blocker, *calls)
            first, plain0, keyed0, plain1, keyed1, single0, plain2, single1, waiting, plain3 = results
            assert [t.payload["i"] for t in (plain0, plain1, plain2, plain3)] == [0, 1, 2, 3]
            assert keyed0.id == keyed1.id and keyed0.budget == keyed1.budget == budget
            assert sorted([keyed0.enqueue_outcome, keyed1.enqueue_outcome]) == ["created", "existing"]
            assert single0.id == single1.id
            assert sorted([single0.enqueue_outcome, single1.enqueue_outcome]) == ["created", "skipped"]
            assert waiting.status == "waiting" and waiting.enqueue_outcome == "created"
            stored = {t.id: t for t in await aq.list_tasks(limit=100)}
            made = [first, plain0, keyed0, plain1, single0, plain2, waiting, plain3]
            assert set(stored) == {upstream.id} | {t.id for t in made}
            assert stored[keyed0.id].budget == budget and stored[waiting.id].status == "waiting"

    asyncio.run(story())
