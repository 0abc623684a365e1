"""Waiting on an :class:`asyncio.Event` for a while, for the worker and the service alike."""

from __future__ import annotations

import asyncio


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
