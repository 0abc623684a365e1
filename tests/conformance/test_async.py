"""AsyncQueue runs the same lease logic for asyncio code, on both backends."""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter

import pytest

import leaseq

from .support import WORKING_LEASE, snapshot


async def _wait_expired(aq: leaseq.AsyncQueue, claim: leaseq.Claim) -> None:
    for _ in range(250):
        if await aq.now() > claim.expires_at:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("lease did not expire by the database clock")


def test_async_guard_story(dsn: str) -> None:
    async def story() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            assert await aq.migrate()
            a, b = await aq.register_worker("a"), await aq.register_worker("b")
            t = await aq.enqueue("summarize", {"doc": 1}, effect="side_effect")
            [ca] = await aq.claim(a, lease_seconds=WORKING_LEASE)
            answered = await aq.begin_effect(a, ca, "crm.lookup")
            await aq.finish_effect(a, ca, answered, response={"ok": True})
            await _wait_expired(aq, ca)
            [cb] = await aq.claim(b)
            assert cb.generation == ca.generation + 1
            for stale in (aq.heartbeat(a, ca), aq.complete(a, ca, result="A"), aq.begin_effect(a, ca, "x")):
                with pytest.raises(leaseq.LeaseLost):
                    await stale
            assert (await aq.begin_effect(b, cb, "crm.lookup")).replayed
            await aq.heartbeat(b, cb)
            await aq.complete(b, cb, result="B")
            final = await aq.get(t.id)
            assert (final.status, final.result, final.claim_generation) == ("completed", "B", cb.generation)
            assert "lease_expired" in [e.type for e in await aq.events(t.id)]

    asyncio.run(story())


def test_async_concurrent_claims_never_overlap(dsn: str) -> None:
    async def race() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            await aq.migrate()
            for i in range(40):
                await aq.enqueue("job", {"i": i})
            workers = [await aq.register_worker(f"w{i}") for i in range(4)]

            async def drain(w: leaseq.Worker) -> list[int]:
                got = []
                while claims := await aq.claim(w, limit=2):
                    got += [c.task_id for c in claims]
                return got

            parts = await asyncio.gather(*(drain(w) for w in workers))
            every = [tid for part in parts for tid in part]
            assert len(every) == 40 and max(Counter(every).values()) == 1

    asyncio.run(race())


def test_async_errors_are_the_same_errors(dsn: str) -> None:
    async def bad() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            await aq.migrate()
            with pytest.raises(leaseq.InvalidInput) as info:
                await aq.enqueue("job", effect="write")
            assert info.value.field == "effect"
            with pytest.raises(leaseq.NotFound):
                await aq.get(10**9)

    asyncio.run(bad())


def test_async_claim_and_complete_keep_every_guard(dsn: str) -> None:
    """The awaited claim and batched completion (on PostgreSQL, on the event
    loop itself) refuse a stale generation and change nothing for it."""
    async def story() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            await aq.migrate()
            a, b = await aq.register_worker("a"), await aq.register_worker("b")
            stale_task = await aq.enqueue("job", {"i": 1})
            [ca] = await aq.claim(a, lease_seconds=WORKING_LEASE)
            await _wait_expired(aq, ca)
            [cb] = await aq.claim(b)  # routes the expired lease, then claims it again
            assert (cb.task_id, cb.generation) == (ca.task_id, ca.generation + 1)
            fresh_task = await aq.enqueue("job", {"i": 2})
            [ca2] = await aq.claim(a)
            before = snapshot(dsn)
            assert await aq.complete_many(a, [(ca, "stale")]) == set()
            assert snapshot(dsn) == before
            assert await aq.complete_many(a, [(ca, "stale"), (ca2, "fresh")]) == {fresh_task.id}
            assert await aq.complete_many(b, [(cb, "new")]) == {stale_task.id}
            assert (await aq.get(stale_task.id)).result == "new"
            assert (await aq.get(fresh_task.id)).result == "fresh"
            types = [e.type for e in await aq.events(stale_task.id)]
            assert types == ["enqueued", "claimed", "lease_expired", "claimed", "completed"], types

    asyncio.run(story())


def test_async_claim_routes_an_unanswered_call_to_reconciliation(dsn: str) -> None:
    async def story() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            await aq.migrate()
            a, b = await aq.register_worker("a"), await aq.register_worker("b")
            t = await aq.enqueue("pay", effect="side_effect")
            [ca] = await aq.claim(a, lease_seconds=WORKING_LEASE)
            await aq.begin_effect(a, ca, "bank.transfer")  # and never hears back
            await _wait_expired(aq, ca)
            assert await aq.claim(b) == []
            assert (await aq.get(t.id)).status == "needs_reconciliation"

    asyncio.run(story())


def test_async_claim_refuses_a_revoked_worker(dsn: str) -> None:
    async def story() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            await aq.migrate()
            a = await aq.register_worker("a")
            await aq.enqueue("job")
            await aq.revoke_worker(a)
            before = snapshot(dsn)
            with pytest.raises(leaseq.UnknownWorker):
                await aq.claim(a)
            assert snapshot(dsn) == before
            with pytest.raises(leaseq.InvalidInput) as info:
                await aq.claim(a, limit=0)
            assert info.value.field == "limit"

    asyncio.run(story())


def test_one_queue_serves_one_event_loop_after_another(dsn: str) -> None:
    """The awaited calls open connections for the loop that makes them; a
    queue outlives a loop (each asyncio.run), as a worker restarted in the
    same process would."""
    q = leaseq.connect(dsn)
    try:
        q.migrate()
        w = q.register_worker("w")
        ids = [q.enqueue("job", {"i": i}).id for i in range(3)]

        async def one() -> int:
            claims = await q.aclaim(w)
            done = await q.acomplete_many(w, [(c, None) for c in claims])
            await q.close_async()
            return len(done)

        assert [asyncio.run(one()) for _ in range(3)] == [1, 1, 1]
        assert [q.get(i).status for i in ids] == ["completed"] * 3
    finally:
        q.close()


def _public(cls: type) -> dict[str, object]:
    return {name: getattr(cls, name) for name in dir(cls)
            if not name.startswith("_") and inspect.isfunction(getattr(cls, name))}


def test_every_async_method_has_its_queue_methods_typed_signature() -> None:
    """AsyncQueue and Queue offer the same operations with the same parameters,
    defaults and annotations (AsyncQueue's are coroutines): one is never
    extended without the other."""
    sync, coros = _public(leaseq.Queue), _public(leaseq.AsyncQueue)
    # the worker runtime's awaited calls (an async handler's tool calls among them) and the
    # blocking helpers have no async twin by design
    # (joined, ajoined: the service's one transaction per request, a view of the queue in it)
    sync_only = {"aclaim", "acomplete_many", "abegin_effect", "afinish_effect", "asleep", "await_signal", "aconsume", "ajoined",
                 "close_async",
                 "end_worker_leases", "listener"}
    # context managers: `async with` where the queue's are `with`; run_in: a joined view's raw statements
    contexts, async_only = {"hold_attempt", "joined"}, {"run_in"}
    assert set(coros) - {"close"} - async_only == set(sync) - sync_only - {"close"}
    for name, coro in coros.items():
        if name in contexts:
            assert inspect.isasyncgenfunction(inspect.unwrap(coro)), name
            assert list(inspect.signature(coro).parameters) == list(inspect.signature(sync[name]).parameters), name
            continue
        assert inspect.iscoroutinefunction(coro), name
        if name in {"close", *async_only}:
            continue
        got, want = inspect.signature(coro), inspect.signature(sync[name])
        assert got == want, f"AsyncQueue.{name}{got} != Queue.{name}{want}"
        assert got.return_annotation == want.return_annotation != inspect.Signature.empty, name


def test_the_signature_check_notices_a_difference() -> None:
    class Bad:
        async def claim(self, worker, *, queue: str = "other") -> list:  # noqa: ANN001
            ...
    assert inspect.signature(Bad.claim) != inspect.signature(leaseq.Queue.claim)


async def _joined_and_held(q: leaseq.AsyncQueue) -> None:
    w = await q.register_worker("w")
    kept = await q.enqueue("job", {"n": 1})
    with pytest.raises(RuntimeError, match="roll back"):
        async with q.joined() as (view, _tx):
            await view.enqueue("job", {"n": 2})
            raise RuntimeError("roll back both")
    assert [t.payload for t in await q.list_tasks()] == [{"n": 1}]
    async with q.joined() as (view, _tx):
        await view.enqueue("job", {"n": 3})
        (claim,) = await view.claim(w)
    assert claim.task_id == kept.id and len(await q.list_tasks()) == 2
    async with q.hold_attempt(claim.task_id, claim.generation, epoch=claim.epoch):
        pass
    await q.complete(w, claim, {"ok": True})
    with pytest.raises(leaseq.LeaseLost):
        async with q.hold_attempt(claim.task_id, claim.generation, epoch=claim.epoch):
            pass


def test_the_async_queue_joins_operations_in_one_transaction_and_holds_an_attempt(dsn: str) -> None:
    async def main() -> None:
        q = await leaseq.connect_async(dsn)
        try:
            await q.migrate()
            await _joined_and_held(q)
        finally:
            await q.close()
    asyncio.run(main())
