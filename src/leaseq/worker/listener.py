"""The listener: wakes an idle worker's claim loop on the queue's notifications.

On a port that offers LISTEN/NOTIFY (``capabilities.listen_notify``) it runs
as a task on the runtime's loop (psycopg's asyncio connection: no thread of
its own), reconnecting after a dropped connection. Each (re)connection wakes
the claim loop at once: notifications sent while it was away were missed, and
polling covers the gap until it is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("leaseq.worker")

#: How long the listener waits before reconnecting after its connection dropped.
LISTENER_RETRY = 0.5
#: The longest one wait lasts before the listener looks whether the worker is stopping.
WAIT = 5.0


async def listen(transport: Any, queues: list[str], wake: asyncio.Event, *, stopping: Callable[[], bool],
                 name: str) -> None:
    """Listen for ``queues`` until cancelled (or the worker stops), setting ``wake`` at each notification."""
    listener = None
    try:
        while not stopping():
            try:
                if listener is None:
                    listener = await transport.listener(queues)
                    wake.set()
                if await listener.wait(WAIT):
                    wake.set()
            except Exception as exc:  # the connection went away: polling covers the gap
                logger.info("worker %s: listener lost its connection (%s); reconnecting", name, exc)
                await _close_quietly(listener)
                listener = None
                await asyncio.sleep(LISTENER_RETRY)
    finally:
        await _close_quietly(listener)


async def _close_quietly(listener: Any) -> None:
    if listener is None:
        return
    try:
        await listener.close()
    except Exception:  # pragma: no cover - already closed under our feet
        pass
