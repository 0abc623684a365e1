"""A waiting claim stops when its request is cancelled, even as it is woken.

On Python 3.11 ``asyncio.wait_for`` returns normally when the cancellation
arrives in the same turn as the wake-up, and the request waits on as if it
had not been cancelled. The waiter here is woken and cancelled in one turn.
"""

from __future__ import annotations

import asyncio

import pytest

from leaseq.service.wakeups import Waiter


def test_a_waiter_cancelled_as_it_is_woken_stops() -> None:
    async def run() -> None:
        waiter = Waiter("default", "w-1")
        waiting = asyncio.create_task(waiter.wait(5.0))
        await asyncio.sleep(0)  # it waits now
        waiter.event.set()  # woken ...
        waiting.cancel()  # ... and cancelled in the same turn
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(waiting), 2.0)

    asyncio.run(run())


def test_a_waiter_returns_when_woken_or_when_its_time_is_up() -> None:
    async def run() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        waiter = Waiter("default", "w-1")
        started = loop.time()
        loop.call_later(0.05, waiter.event.set)
        await waiter.wait(5.0)
        woken = loop.time() - started
        assert not waiter.event.is_set()  # ready to be woken again
        started = loop.time()
        await waiter.wait(0.1)
        return woken, loop.time() - started

    woken, timed_out = asyncio.run(run())
    assert woken < 2.0 and 0.09 <= timed_out < 2.0
