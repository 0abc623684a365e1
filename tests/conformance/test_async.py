"""AsyncQueue runs the same lease logic for asyncio code, on both backends."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import leaseq

from .support import WORKING_LEASE


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
