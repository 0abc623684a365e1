"""Waiters for a backend that cannot notify: waiting is sleeping, and the waiter looks again.

SQLite never notifies; PostgreSQL does not when its connections pass through a
transaction-mode pooler with no direct connection to LISTEN on, or in the
portable mode (see :class:`leaseq.db.dsn.PostgresMode`). Their
``capabilities.listen_notify`` is then False: an idle worker claims again
every ``idle_poll_interval`` (0.2 s, :class:`leaseq.worker.Capabilities`),
and :meth:`leaseq.Queue.wait` reads the task again every ``interval`` seconds.
"""

from __future__ import annotations

import asyncio
import threading
import time


class SleepingListener:
    """A work listener that cannot be woken: :meth:`wait` sleeps out its timeout (or until closed)."""

    def __init__(self) -> None:
        self._closed = threading.Event()

    def wait(self, timeout: float) -> bool:
        """Sleep ``timeout`` seconds (less, once closed); never notified."""
        self._closed.wait(timeout)
        return False

    def close(self) -> None:
        self._closed.set()


class AsyncSleepingListener:
    """:class:`SleepingListener` for asyncio code."""

    async def wait(self, timeout: float) -> bool:
        """Sleep ``timeout`` seconds; never notified."""
        await asyncio.sleep(timeout)
        return False

    async def close(self) -> None:
        """Nothing to release."""


class PollingTaskListener:
    """A task listener that sleeps ``interval`` seconds per wait, so the waiter looks again that often."""

    def __init__(self, interval: float) -> None:
        self.interval = interval

    def wait(self, timeout: float) -> bool:
        """Sleep ``min(timeout, interval)`` seconds; never notified."""
        time.sleep(max(0.0, min(timeout, self.interval)))
        return False

    def close(self) -> None:
        """Nothing to release."""


class AsyncPollingTaskListener:
    """:class:`PollingTaskListener` for asyncio code."""

    def __init__(self, interval: float) -> None:
        self.interval = interval

    async def wait(self, timeout: float) -> bool:
        """Sleep ``min(timeout, interval)`` seconds; never notified."""
        await asyncio.sleep(max(0.0, min(timeout, self.interval)))
        return False

    async def close(self) -> None:
        """Nothing to release."""
