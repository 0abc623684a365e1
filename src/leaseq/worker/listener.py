"""The listener: wakes an idle worker's claim loop on the queue's notifications.

On a port that offers LISTEN/NOTIFY (``capabilities.listen_notify``) it runs
as a task on the runtime's loop, waiting on a waiter registered with the
process's one notifier (:mod:`leaseq.store.notifier`: the connection every
other waiter of the process shares, task waits and streams in handlers
included; in a worker process the notifier usually runs on the runtime's own
loop, and the waiter sets the claim loop's wake-up event itself as it is
woken). The notifier reconnects after a dropped connection and then wakes
the claim loop at once: notifications sent while it was away were missed, and
polling covers the gap until it is back. A waiter that cannot be registered
(the notifier cannot connect) is asked for again after :data:`LISTENER_RETRY`.
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
    direct = False
    try:
        while not stopping():
            try:
                if listener is None:
                    listener = await transport.listener(queues)
                    direct = _wake_directly(listener, wake)
                    wake.set()
                if await listener.wait(WAIT) and not direct:
                    wake.set()
            except Exception as exc:  # not listening (yet): polling covers the gap
                logger.info("worker %s: not listening for work (%s); trying again", name, exc)
                await _close_quietly(listener)
                listener = None
                await asyncio.sleep(LISTENER_RETRY)
    finally:
        await _close_quietly(listener)


def _wake_directly(listener: Any, wake: asyncio.Event) -> bool:
    """Have ``listener`` set ``wake`` itself as it is woken (where it can: ``wake_also``), so the
    claim loop claims in the turn the notification reaches the loop, not a turn later after this
    task. True when it does."""
    wake_also = getattr(listener, "wake_also", None)
    if wake_also is None:
        return False
    wake_also(wake)
    return True


async def _close_quietly(listener: Any) -> None:
    if listener is None:
        return
    try:
        await listener.close()
    except Exception:  # pragma: no cover - already closed under our feet
        pass
