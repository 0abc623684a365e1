"""One LISTEN connection for every wait of a store: the notifier.

Each :meth:`leaseq.Queue.wait`, each following :meth:`leaseq.Queue.stream`
(and their asyncio forms) on PostgreSQL is woken through the one connection
of its store's :class:`Notifier`, however many wait at once: a waiter
registers its interest in a channel (``leaseq_task_<id>``), the notifier's
thread LISTENs on that channel while at least one waiter wants it and
UNLISTENs after, and wakes only the waiters of the channel it hears
(a :class:`threading.Event` for blocking code; ``loop.call_soon_threadsafe``
for asyncio code).

What it keeps of a dedicated connection per wait:

* listening starts before the waiter's first look: registering returns (is
  awaited) once the channel is listened on, so no end slips by between the
  look and the wait;
* a connection that drops is opened again, LISTENs on every channel wanted,
  and then wakes every waiter once: each looks again, so nothing notified
  while it was away is missed;
* ``close()`` stops the thread and its connection (the queue's ``close()``).

The connection is opened when the first waiter registers and closed after
:data:`IDLE_SECONDS` with no waiter. Nothing here knows a task's statuses: a
waiter woken only looks again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..core.errors import BackendUnavailable
from ..core.timers import wait_event
from .base import STREAM_PAYLOAD

logger = logging.getLogger("leaseq.store")

#: Pause before the notifier connects again after its connection dropped (or could not be opened).
RETRY_SECONDS = 0.5
#: How long the notifier keeps its connection with no waiter before it closes it (seconds).
IDLE_SECONDS = 30.0
#: The longest the notifier's thread waits on its connection before it looks at what is wanted.
TURN_SECONDS = 5.0

_CHANNEL = re.compile(r"^[a-z_][a-z0-9_]*$")


def heard(payload: str, streams: bool) -> bool:
    """Whether a task channel's notification wakes a waiter: every one wakes a stream's reader
    (``streams``); a wait for the task's end passes over its emits."""
    return streams or payload != STREAM_PAYLOAD


def task_channel(task_id: int) -> str:
    """The channel task ``task_id``'s end and emits are notified on."""
    return f"leaseq_task_{int(task_id)}"


class Connection(Protocol):
    """The notifier's one connection (:class:`leaseq.store.postgres.SharedListener`)."""

    def listen(self, channel: str) -> None:
        """LISTEN on ``channel``."""

    def unlisten(self, channel: str) -> None:
        """UNLISTEN ``channel``."""

    def wait(self, timeout: float) -> list[tuple[str, str]]:
        """The notifications heard within ``timeout`` seconds, as ``(channel, payload)``."""

    def poke(self) -> None:
        """End a :meth:`wait` now (from any thread)."""

    def close(self) -> None:
        """Close the connection."""


class Interest:
    """One waiter's interest in a channel, told by the notifier's thread what happens:
    :meth:`ready` once the channel is listened on (or the listener could not connect), and
    :meth:`heard` for each notification on it (None: look again, something may have been
    missed). Both are called on the notifier's thread and must return at once."""

    channel: str

    def ready(self, error: BaseException | None) -> None:
        """The channel is listened on (``error`` None), or it could not be."""

    def heard(self, payload: str | None) -> None:
        """A notification on the channel (None: the listener connected again)."""


class Notifier:
    """One LISTEN connection, opened by ``connect()``, serving every :class:`Interest`
    registered with :meth:`subscribe`. Thread-safe; one thread of its own."""

    def __init__(self, connect: Callable[[], Connection], *, name: str = "leaseq-notifier",
                 retry: float = RETRY_SECONDS, idle: float = IDLE_SECONDS):
        self._connect = connect
        self._name = name
        self._retry = retry
        self._idle = idle
        self._lock = threading.Lock()
        self._interests: dict[str, set[Interest]] = {}
        #: interests not yet told the channel is listened on
        self._pending: set[Interest] = set()
        self._thread: threading.Thread | None = None
        self._connection: Connection | None = None
        self._closed = threading.Event()
        #: how many times the notifier connected (tests read it)
        self.connections = 0
        #: set while the notifier is connected and listening on every channel wanted
        self.connected = threading.Event()
        self._pid = os.getpid()

    @property
    def waiting(self) -> int:
        """How many interests are registered now."""
        with self._lock:
            return sum(len(s) for s in self._interests.values())

    def subscribe(self, interest: Interest) -> None:
        """Register ``interest``: its channel is listened on soon, and it is told so
        (:meth:`Interest.ready`). BackendUnavailable once the notifier is closed."""
        if not _CHANNEL.match(interest.channel):
            raise ValueError(f"not a channel name: {interest.channel!r}")
        with self._lock:
            if self._closed.is_set():
                raise BackendUnavailable("the queue is closed")
            if self._pid != os.getpid():  # a forked child: the thread and its connection stayed behind
                self._pid = os.getpid()
                self._interests, self._pending = {}, set()
                self._thread = self._connection = None
                self.connected.clear()
            self._interests.setdefault(interest.channel, set()).add(interest)
            self._pending.add(interest)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            connection = self._connection
        if connection is not None:
            connection.poke()  # listen on the channel now, not at the next turn

    def unsubscribe(self, interest: Interest) -> None:
        """Forget ``interest``: its channel is UNLISTENed once no other interest wants it."""
        with self._lock:
            self._pending.discard(interest)
            same = self._interests.get(interest.channel)
            if same is None or interest not in same:
                return
            same.discard(interest)
            if same:
                return
            del self._interests[interest.channel]
            connection = self._connection
        if connection is not None:
            connection.poke()

    def close(self) -> None:
        """Stop the thread and close its connection; every waiter is woken (to look again)."""
        with self._lock:
            self._closed.set()
            connection = self._connection
            thread = self._thread
        if connection is not None:
            connection.poke()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._tell_all(closing=True)

    # -- the notifier's thread --------------------------------------------------------

    def _run(self) -> None:
        reconnected = False
        while not self._closed.is_set():
            try:
                connection = self._connect()
            except Exception as exc:  # cannot connect: those about to look are told; the rest wait on
                logger.info("the notifier could not connect (%s); trying again", exc)
                with self._lock:
                    pending = list(self._pending)
                    self._pending.clear()
                for interest in pending:
                    interest.ready(exc)
                if self._ended_idle(None):
                    return
                self._closed.wait(self._retry)
                continue
            self.connections += 1
            with self._lock:
                self._connection = connection
            try:
                if self._serve(connection, reconnected):
                    return
            except Exception as exc:  # the connection went away: connect again, then everyone looks again
                logger.info("the notifier lost its connection (%s); reconnecting", exc)
                reconnected = True
            finally:
                self.connected.clear()
                with self._lock:
                    if self._connection is connection:
                        self._connection = None
                try:
                    connection.close()
                except Exception:  # pragma: no cover - closed under our feet already
                    pass
            self._closed.wait(self._retry)

    def _serve(self, connection: Connection, reconnected: bool) -> bool:
        """Drive ``connection`` until it fails (raises), the notifier closes or it has been idle
        long enough (True: the thread ends)."""
        listening: set[str] = set()
        idle_since: float | None = None
        while not self._closed.is_set():
            with self._lock:
                wanted = set(self._interests)
            for channel in sorted(wanted - listening):  # in one order: what a reader of pg_stat_activity sees last
                connection.listen(channel)
            for channel in sorted(listening - wanted):
                connection.unlisten(channel)
            listening = wanted
            with self._lock:
                ready = [i for i in self._pending if i.channel in listening]
                self._pending.difference_update(ready)
                everyone = [i for s in self._interests.values() for i in s] if reconnected else []
            self.connected.set()
            for interest in ready:
                interest.ready(None)
            if reconnected:  # listening again on every channel wanted: now each waiter looks again
                reconnected = False
                for interest in everyone:
                    interest.heard(None)
            if wanted:
                idle_since = None
            else:
                idle_since = idle_since if idle_since is not None else time.monotonic()
                if self._ended_idle(idle_since):
                    return True
            turn = TURN_SECONDS if idle_since is None else \
                max(0.0, min(TURN_SECONDS, idle_since + self._idle - time.monotonic()))
            for channel, payload in connection.wait(turn):
                with self._lock:
                    found = list(self._interests.get(channel, ()))
                for interest in found:
                    interest.heard(payload)
        return True

    def _ended_idle(self, idle_since: float | None) -> bool:
        """End the thread (True) when no interest is registered and, with ``idle_since``, none
        has been for :attr:`_idle` seconds; the next :meth:`subscribe` starts another."""
        with self._lock:
            if self._interests or (idle_since is not None and time.monotonic() - idle_since < self._idle):
                return False
            self._thread = None
            return True

    def _tell_all(self, *, closing: bool = False) -> None:
        with self._lock:
            everyone = [i for s in self._interests.values() for i in s]
            pending = list(self._pending)
            self._pending.clear()
        for interest in pending:
            interest.ready(BackendUnavailable("the queue is closed") if closing else None)
        for interest in everyone:
            interest.heard(None)


def _unavailable(error: BaseException) -> BackendUnavailable:
    if isinstance(error, BackendUnavailable):
        return BackendUnavailable(str(error))
    return BackendUnavailable(f"PostgreSQL listener: {error}")


class TaskWait(Interest):
    """A blocking wait's interest in task ``task_id`` (``streams``: its emits wake it too), as
    :meth:`leaseq.Queue.wait` and :meth:`leaseq.Queue.stream` use it: :meth:`open` returns once
    the task's channel is listened on; :meth:`wait` until notified; :meth:`close` to forget it."""

    def __init__(self, notifier: Notifier, task_id: int, *, streams: bool = False):
        self.channel = task_channel(task_id)
        self._notifier = notifier
        self._streams = streams
        self._listening = threading.Event()
        self._woken = threading.Event()
        self._error: BaseException | None = None

    def ready(self, error: BaseException | None) -> None:
        """See :meth:`Interest.ready`."""
        self._error = error
        self._listening.set()

    def heard(self, payload: str | None) -> None:
        """See :meth:`Interest.heard`."""
        if payload is None or heard(payload, self._streams):
            self._woken.set()

    def open(self, timeout: float) -> TaskWait:
        """Register with the notifier and return once the channel is listened on;
        BackendUnavailable when it could not be within ``timeout`` seconds."""
        self._notifier.subscribe(self)
        if not self._listening.wait(timeout) or self._error is not None:
            self._notifier.unsubscribe(self)
            raise _unavailable(self._error or TimeoutError(f"not listening after {timeout:g} s"))
        return self

    def wait(self, timeout: float) -> bool:
        """True when notified (a burst of notifications wakes it once), False after ``timeout`` seconds."""
        woken = self._woken.wait(max(0.0, timeout))
        self._woken.clear()
        return woken

    def close(self) -> None:
        """Stop listening for the task (the channel is UNLISTENed once no other waiter wants it)."""
        self._notifier.unsubscribe(self)


class AsyncTaskWait(Interest):
    """:class:`TaskWait` for asyncio code, on the running event loop (open it with :meth:`open`):
    the notifier's thread wakes it with ``loop.call_soon_threadsafe``."""

    def __init__(self, notifier: Notifier, task_id: int, *, streams: bool = False):
        self.channel = task_channel(task_id)
        self._notifier = notifier
        self._streams = streams
        self._loop = asyncio.get_running_loop()
        self._listening: asyncio.Future[BaseException | None] = self._loop.create_future()
        self._woken = asyncio.Event()
        self._notified = False

    def _soon(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # its loop closed: nobody waits any more
            pass

    def ready(self, error: BaseException | None) -> None:
        """See :meth:`Interest.ready`."""
        self._soon(self._set_ready, error)

    def _set_ready(self, error: BaseException | None) -> None:
        if not self._listening.done():
            self._listening.set_result(error)

    def heard(self, payload: str | None) -> None:
        """See :meth:`Interest.heard`."""
        if payload is None or heard(payload, self._streams):
            self._soon(self._wake)

    def _wake(self) -> None:
        self._notified = True
        self._woken.set()

    async def open(self, timeout: float) -> AsyncTaskWait:
        """:meth:`TaskWait.open`, awaited."""
        self._notifier.subscribe(self)
        # a timer, not asyncio.wait_for (see leaseq.core.timers.wait_event)
        timer = self._loop.call_later(timeout, self._set_ready, TimeoutError(f"not listening after {timeout:g} s"))
        try:
            error = await self._listening
        except BaseException:
            self._notifier.unsubscribe(self)
            raise
        finally:
            timer.cancel()
        if error is not None:
            self._notifier.unsubscribe(self)
            raise _unavailable(error)
        return self

    async def wait(self, timeout: float) -> bool:
        """:meth:`TaskWait.wait`, awaited."""
        if not self._notified:
            await wait_event(self._woken, max(0.0, timeout))
        self._woken.clear()
        woken, self._notified = self._notified, False
        return woken

    async def close(self) -> None:
        """:meth:`TaskWait.close`, awaited."""
        self._notifier.unsubscribe(self)
