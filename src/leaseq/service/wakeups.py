"""Waking long-poll claims: one listener per service process, fanned out to waiting requests.

A claim request that finds nothing may wait (up to its ``wait``, capped by
the service) for work to arrive. What wakes it:

* on PostgreSQL, the enqueue's ``NOTIFY`` (delivered at commit), heard by a
  single ``LISTEN`` connection this process opens when the first claim
  waits, which wakes every waiting request (each then claims again; the
  claim statement decides who gets what);
* anything enqueued or sent back to the queue through this same process
  (its enqueue route calls :meth:`WorkSignal.wake`), on either backend;
* a re-check every ``recheck`` seconds, for what no notification announces:
  a delayed task coming due, an expired lease to route, an enqueue on a
  SQLite file by another process (SQLite cannot notify, so its re-check is
  short), or a notification missed while the listener reconnected.

The listener knows nothing of leases; it only says "look again".
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..core.timers import wait_event
from ..queue import Queue

logger = logging.getLogger("leaseq.service")

#: Re-check period of a waiting claim where LISTEN/NOTIFY wakes it (PostgreSQL)...
NOTIFIED_RECHECK = 1.0
#: ...and where nothing but this process's own enqueues can (SQLite).
POLLED_RECHECK = 0.2
#: Pause before the listener reconnects after its connection dropped.
LISTENER_RETRY = 0.5


class _AnyQueue(set):  # type: ignore[type-arg]
    """The listener's queue set: every queue (waiters of every queue share one listener)."""

    def __contains__(self, item: object) -> bool:
        return True


class Waiter:
    """One waiting claim request."""

    __slots__ = ("queue", "worker_id", "event", "interrupted")

    def __init__(self, queue: str, worker_id: str):
        self.queue = queue
        self.worker_id = worker_id
        self.event = asyncio.Event()
        #: the worker asked to stop waiting (it is shutting down): claim nothing more
        self.interrupted = False

    async def wait(self, timeout: float) -> None:
        """Until woken or ``timeout`` seconds pass; then ready to be woken again (a
        cancelled request stops here: :func:`~leaseq.core.timers.wait_event`)."""
        await wait_event(self.event, timeout)
        self.event.clear()


class WorkSignal:
    """Wakes the waiting claims of one service process.

    ``recheck`` (seconds): how often a waiting claim looks again on its own;
    by default :data:`NOTIFIED_RECHECK` where the backend notifies, else
    :data:`POLLED_RECHECK`.
    """

    def __init__(self, queue: Queue, *, recheck: float | None = None):
        self.queue = queue
        self.notifies = queue.capabilities.listen_notify
        self.recheck = recheck if recheck is not None else (NOTIFIED_RECHECK if self.notifies else POLLED_RECHECK)
        self._waiters: set[Waiter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        #: set while the shared listener is connected (tests wait on it)
        self.listening = threading.Event()
        #: notifications heard (each woke every waiting claim)
        self.notifications = 0

    @property
    def waiting(self) -> int:
        """How many claim requests wait now."""
        return len(self._waiters)

    @contextmanager
    def waiter(self, queue: str, worker_id: str) -> Iterator[Waiter]:
        """Register a waiting claim (on the running event loop) for as long as the block lasts.

        Register *before* the first claim attempt: a wake-up that comes
        while that attempt runs then leaves the event set, and is not missed.
        """
        self._loop = asyncio.get_running_loop()
        w = Waiter(queue, worker_id)
        self._waiters.add(w)
        if self.notifies:
            self._ensure_listener()
        try:
            yield w
        finally:
            self._waiters.discard(w)

    def wake(self, queue: str | None = None) -> None:
        """Wake the claims waiting on ``queue`` (None: every queue). Callable from any thread."""
        self._on_loop(self._wake, queue)

    def _on_loop(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the waiting claims' loop, if any claim waits (from any thread)."""
        loop = self._loop
        if loop is None or loop.is_closed() or not self._waiters:
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def _wake(self, queue: str | None) -> None:
        for w in list(self._waiters):
            if queue is None or w.queue == queue:
                w.event.set()

    def interrupt(self, worker_id: str) -> int:
        """End the waits of ``worker_id``'s claims at once, empty-handed (call on the loop).
        Returns how many were waiting here."""
        n = 0
        for w in list(self._waiters):
            if w.worker_id == worker_id:
                w.interrupted = True
                w.event.set()
                n += 1
        return n

    def _heard_interrupt(self, worker_id: str) -> None:
        """Another process (or this one) was asked to end ``worker_id``'s waits (listener thread)."""
        self._on_loop(self.interrupt, worker_id)

    # -- the shared listener ------------------------------------------------------

    def _ensure_listener(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(target=self._listen, name="leaseq-claim-listener", daemon=True)
                self._thread.start()

    def _listen(self) -> None:
        while not self._closed.is_set():
            listener = None
            try:
                listener = self.queue.store.listener(_AnyQueue(), on_interrupt=self._heard_interrupt)
                self.listening.set()
                self.wake()  # anything enqueued while we were not listening
                while not self._closed.is_set():
                    if listener.wait(0.5):
                        self.notifications += 1
                        self.wake()
            except Exception as exc:  # the connection went away: the re-check covers the gap
                logger.info("claim listener lost its connection (%s); reconnecting", exc)
            finally:
                self.listening.clear()
                if listener is not None:
                    try:
                        listener.close()
                    except Exception:  # pragma: no cover - already closed under our feet
                        pass
            self._closed.wait(LISTENER_RETRY)

    def close(self) -> None:
        """Stop the listener (the application's shutdown)."""
        self._closed.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=2)
