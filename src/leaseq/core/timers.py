"""Waiting on an :class:`asyncio.Event` for a while, for the worker and the service alike."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Wait until ``event`` is set or ``timeout`` seconds pass (a timeout sets it).

    A timer, not ``asyncio.wait_for``: no extra task (the claim loop waits like this
    once per batch), and a cancellation always reaches the waiter. On Python 3.11
    wait_for drops one that arrives in the turn the event is set, and the waiter
    goes on as if it had not been cancelled.
    """
    timer = asyncio.get_running_loop().call_later(timeout, event.set)
    try:
        await event.wait()
    finally:
        timer.cancel()


async def cancel_all(tasks: Iterable[asyncio.Future[Any]], *, again_after: float = 0.5) -> None:
    """Cancel ``tasks`` and wait until every one has ended, cancelling again each
    ``again_after`` seconds a task that is still running.

    One cancellation is not always enough. On Python 3.11 ``asyncio.wait_for`` drops
    one that arrives in the turn its awaitable finishes, and libraries use it inside
    their own calls (a connection pool's wait for a free connection): the task goes
    on as if it had not been cancelled, into its next long sleep, and a worker
    waiting for it to end never exits. A second cancellation reaches it there.
    Their exceptions are retrieved (they end a loop that is being stopped)."""
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=again_after)
        for task in done:
            if not task.cancelled():
                task.exception()
