"""Stopping background tasks that do not stop at the first cancellation."""

from __future__ import annotations

import asyncio
import time

from leaseq.core.timers import cancel_all


async def _swallows_one_cancellation(stopped: list[str]) -> None:
    # What Python 3.11's asyncio.wait_for does when a cancellation arrives in the turn its
    # awaitable finishes (a connection pool waits for a free connection that way): the
    # cancellation is dropped and the loop goes on, into its next long sleep.
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass
    try:
        await asyncio.sleep(3600)
    finally:
        stopped.append("second sleep")


def test_a_task_that_dropped_its_cancellation_is_cancelled_again() -> None:
    async def main() -> float:
        stopped: list[str] = []
        stubborn = asyncio.create_task(_swallows_one_cancellation(stopped))
        plain = asyncio.create_task(asyncio.sleep(3600))
        await asyncio.sleep(0)  # both are waiting
        started = time.monotonic()
        await asyncio.wait_for(cancel_all([stubborn, plain], again_after=0.05), timeout=5)
        assert stopped == ["second sleep"] and stubborn.cancelled() and plain.cancelled()
        return time.monotonic() - started

    assert asyncio.run(main()) < 2.0


def test_a_task_that_failed_while_stopping_has_its_error_retrieved() -> None:
    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("closing failed") from None

    async def main() -> asyncio.Task[None]:
        task = asyncio.create_task(fails_when_cancelled())
        await asyncio.sleep(0)
        await cancel_all([task])
        return task

    task = asyncio.run(main())
    assert isinstance(task.exception(), RuntimeError)
