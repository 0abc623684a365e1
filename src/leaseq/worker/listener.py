"""The listener: wakes an idle worker's claim loop on the queue's notifications.

On a transport that offers LISTEN/NOTIFY it runs on a thread of its own,
reconnecting after a dropped connection. Each (re)connection wakes the claim
loop at once: notifications sent while it was away were missed, and polling
covers the gap until it is back.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("leaseq.worker")

#: How long the listener waits before reconnecting after its connection dropped.
LISTENER_RETRY = 0.5


def start_listener(transport: Any, queues: list[str], loop: asyncio.AbstractEventLoop, wake: asyncio.Event, *,
                   stopping: Callable[[], bool], name: str) -> threading.Event:
    """Start listening for ``queues`` on a daemon thread, setting ``wake`` (on ``loop``)
    at each notification; returns the event that stops it."""
    done = threading.Event()

    def listen() -> None:
        listener = None
        while not done.is_set() and not stopping():
            try:
                if listener is None:
                    listener = transport.listener(queues)
                    loop.call_soon_threadsafe(wake.set)
                if listener.wait(1.0):
                    loop.call_soon_threadsafe(wake.set)
            except Exception as exc:  # the connection went away: polling covers the gap
                logger.info("worker %s: listener lost its connection (%s); reconnecting", name, exc)
                _close_quietly(listener)
                listener = None
                done.wait(LISTENER_RETRY)
        _close_quietly(listener)

    threading.Thread(target=listen, name="leaseq-listener", daemon=True).start()
    return done


def _close_quietly(listener: Any) -> None:
    if listener is None:
        return
    try:
        listener.close()
    except Exception:  # pragma: no cover - already closed under our feet
        pass
