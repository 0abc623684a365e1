"""One LISTEN connection for every waiter of a process: the notifier.

Everything in a process that waits for a PostgreSQL notification is woken
through the one connection of its database's :class:`Notifier`, however many
wait at once and whichever queue object they came through: a worker's claim
loop (``leaseq_work``, for its queues), the service's waiting requests (work,
``leaseq_interrupt``, and the tasks they wait for), each :meth:`leaseq.Queue.wait`
and each following :meth:`leaseq.Queue.stream` (a task's ``leaseq_task_<id>``),
sync and async alike. A waiter registers its interest in a channel; the
notifier LISTENs on that channel while at least one waiter wants it and
UNLISTENs after, and wakes only the waiters of the channel it hears (a
:class:`threading.Event` for blocking code; the waiter's own event loop for
asyncio code).

Who drives the connection: a task on the event loop of the notifier's first
waiter when that is an asyncio one (the loop watches the socket and hands each
notification over as it reads it: a worker's claim loop is woken with no thread
in between), else a thread of its own. A thread takes over when that loop ends
with waiters left, or when a blocking waiter registers on the loop's own thread
(the loop cannot read while it blocks); then every waiter looks again.

There is one notifier per listening DSN per process (:func:`share`): each
store opened on that DSN holds a :class:`Share` of it, and the notifier closes
with the last share.

What it keeps of a dedicated connection per wait:

* listening starts before the waiter's first look: registering returns (is
  awaited) once the channel is listened on, so nothing notified between the
  look and the wait slips by;
* a connection that drops is opened again, LISTENs on every channel wanted,
  and then wakes every waiter once: each looks again, so nothing notified
  while it was away is missed;
* ``close()`` of a share (the queue's ``close()``) wakes that store's waiters
  and forgets them; the last one stops the thread and its connection.

The connection is opened when the first waiter registers and closed after
:data:`IDLE_SECONDS` with no waiter. Nothing here knows a task's statuses or a
lease: a waiter woken only looks again.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, Self

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

#: The channel an enqueue notifies, its payload the queue's name (the claim loops' wake-up).
WORK_CHANNEL = "leaseq_work"
#: The channel ``notify_interrupt`` notifies, its payload a worker's id: end its waiting claims.
INTERRUPT_CHANNEL = "leaseq_interrupt"

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


class AsyncConnection(Protocol):
    """The notifier's one connection when it runs on an event loop
    (:class:`leaseq.store.postgres.AsyncSharedListener`): :class:`Connection`, awaited."""

    async def listen(self, channel: str) -> None:
        """LISTEN on ``channel``."""

    async def unlisten(self, channel: str) -> None:
        """UNLISTEN ``channel``."""

    async def wait(self, timeout: float) -> list[tuple[str, str]]:
        """The notifications heard within ``timeout`` seconds, as ``(channel, payload)``."""

    def poke(self) -> None:
        """End a :meth:`wait` now (from any thread)."""

    def deliver(self, to: Callable[[str, str], None]) -> None:
        """From now on hand each notification to ``to`` (``channel, payload``) as soon as it is
        read, on the loop, rather than from :meth:`wait`."""

    async def close(self) -> None:
        """Close the connection."""


class Interest:
    """One waiter's interest in a channel, told by the notifier's thread what happens:
    :meth:`ready` once the channel is listened on (or the listener could not connect), and
    :meth:`heard` for each notification on it (None: look again, something may have been
    missed). Both are called on the notifier's thread and must return at once."""

    channel: str
    #: the event loop of an asyncio waiter (None: a blocking one)
    loop: asyncio.AbstractEventLoop | None = None

    def ready(self, error: BaseException | None) -> None:
        """The channel is listened on (``error`` None), or it could not be."""

    def heard(self, payload: str | None) -> None:
        """A notification on the channel (None: the listener connected again)."""


class Notifier:
    """One LISTEN connection, opened by ``connect()``, serving every :class:`Interest`
    registered with :meth:`subscribe`. Thread-safe; one thread of its own, or, with
    ``aconnect`` and an asyncio waiter first, a task on that waiter's event loop (the
    connection is then ``aconnect()``'s, whose socket the loop watches: the asyncio waiters
    of that loop, a worker's claim loop among them, are woken with no thread in between). A
    store reaches it through its :class:`Share` (:func:`share`)."""

    def __init__(self, connect: Callable[[], Connection], *, name: str = "leaseq-notifier",
                 retry: float = RETRY_SECONDS, idle: float = IDLE_SECONDS,
                 aconnect: Callable[[], Awaitable[AsyncConnection]] | None = None):
        self._connect = connect
        self._aconnect = aconnect
        self._name = name
        self._retry = retry
        self._idle = idle
        self._lock = threading.Lock()
        self._interests: dict[str, set[Interest]] = {}
        #: interests not yet told the channel is listened on
        self._pending: set[Interest] = set()
        self._thread: threading.Thread | None = None
        #: the task driving the connection on an event loop, instead of the thread
        self._task: asyncio.Task[None] | None = None
        self._task_loop: asyncio.AbstractEventLoop | None = None
        #: set while no task drives the connection
        self._task_ended = threading.Event()
        self._task_ended.set()
        self._connection: Connection | AsyncConnection | None = None
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

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed.is_set()

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
                self._thread = self._connection = self._task = None
                self.connected.clear()
            if self._task is not None and self._task_loop is not None and self._task_loop.is_closed():
                self._task = self._connection = None  # its loop was closed under it
                self.connected.clear()
            retired: Connection | AsyncConnection | None = None
            if self._task is not None and interest.loop is None and self._task_loop is not None \
                    and _running(self._task_loop):
                # A blocking waiter on the very thread whose loop reads the connection: that loop
                # cannot read while this one blocks. A thread takes over (and everyone looks again
                # once it listens); the task ends, closing its connection, when its loop runs again.
                retired, self._task, self._connection = self._connection, None, None
                self.connected.clear()
                self._start_thread(reconnected=True)
            if interest.channel not in self._interests:
                self.connected.clear()  # not listening on every channel wanted until the thread LISTENs
            self._interests.setdefault(interest.channel, set()).add(interest)
            self._pending.add(interest)
            if self._thread is None and self._task is None:
                if self._aconnect is not None and interest.loop is not None and _running(interest.loop):
                    self._task_ended.clear()
                    self._task_loop = interest.loop
                    self._task = interest.loop.create_task(self._arun(), name=self._name)
                else:
                    self._start_thread(reconnected=False)
            connection = self._connection
        if retired is not None:
            retired.poke()
        if connection is not None:
            connection.poke()  # listen on the channel now, not at the next turn

    def _start_thread(self, *, reconnected: bool) -> None:
        """Drive the connection from a thread of its own (``self._lock`` held)."""
        self._thread = threading.Thread(target=self._run, args=(reconnected,), name=self._name, daemon=True)
        self._thread.start()

    def unsubscribe(self, interest: Interest) -> bool:
        """Forget ``interest``: its channel is UNLISTENed once no other interest wants it.
        Returns whether it had not yet been told :meth:`Interest.ready`."""
        with self._lock:
            pending = interest in self._pending
            self._pending.discard(interest)
            same = self._interests.get(interest.channel)
            if same is None or interest not in same:
                return pending
            same.discard(interest)
            if same:
                return pending
            del self._interests[interest.channel]
            connection = self._connection
        if connection is not None:
            connection.poke()
        return pending

    def close(self) -> None:
        """Stop the thread and close its connection; every waiter is woken (to look again)."""
        with self._lock:
            self._closed.set()
            connection = self._connection
            thread = self._thread
            task, loop = self._task, self._task_loop
        if connection is not None:
            connection.poke()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if task is not None and loop is not None and loop.is_running() and not _running(loop):
            self._task_ended.wait(timeout=5)  # its loop closes the connection: wait for it, from another thread
        self._tell_all(closing=True)

    # -- the notifier's thread --------------------------------------------------------

    def _run(self, reconnected: bool = False) -> None:
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
                if set(self._interests) <= listening:  # else a channel came meanwhile: it is LISTENed next turn
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
                self._dispatch(channel, payload)
        return True

    def _dispatch(self, channel: str, payload: str) -> None:
        """Tell the interests in ``channel`` of a notification on it."""
        with self._lock:
            found = list(self._interests.get(channel, ()))
        for interest in found:
            interest.heard(payload)

    # -- or its task, on the event loop of its first waiter (the same turns, awaited) --------

    async def _arun(self) -> None:
        assert self._aconnect is not None
        reconnected = False
        try:
            while not self._closed.is_set() and self._driving_here():
                try:
                    connection = await self._aconnect()
                except Exception as exc:  # cannot connect: those about to look are told; the rest wait on
                    logger.info("the notifier could not connect (%s); trying again", exc)
                    with self._lock:
                        pending = list(self._pending)
                        self._pending.clear()
                    for interest in pending:
                        interest.ready(exc)
                    if self._ended_idle(None, task=True):
                        return
                    await asyncio.sleep(self._retry)
                    continue
                self.connections += 1
                with self._lock:
                    if self._task is asyncio.current_task():
                        self._connection = connection
                try:
                    if await self._aserve(connection, reconnected):
                        return
                except Exception as exc:  # the connection went away: connect again, then everyone looks again
                    logger.info("the notifier lost its connection (%s); reconnecting", exc)
                    reconnected = True
                finally:
                    with self._lock:
                        if self._connection is connection:
                            self._connection = None
                        if self._task is asyncio.current_task():  # else a thread drives, its flag its own
                            self.connected.clear()
                    try:
                        await connection.close()
                    except Exception:  # pragma: no cover - closed under our feet already
                        pass
                if self._driving_here():
                    await asyncio.sleep(self._retry)
        finally:
            with self._lock:
                if self._task is asyncio.current_task():
                    self._task = None
                    if self._interests and not self._closed.is_set():
                        # its loop is ending (the task was cancelled) with waiters of other threads or
                        # loops still registered: a thread takes over, and they all look again
                        self._start_thread(reconnected=True)
            self._task_ended.set()

    def _driving_here(self) -> bool:
        """Whether the running task still drives the connection (not retired, see :meth:`subscribe`)."""
        with self._lock:
            return self._task is asyncio.current_task()

    async def _aserve(self, connection: AsyncConnection, reconnected: bool) -> bool:
        """:meth:`_serve`, awaited on the loop; a notification is handed over as the loop reads it
        (in the turn its socket was ready), not after this task's next turn."""
        connection.deliver(self._dispatch)
        listening: set[str] = set()
        idle_since: float | None = None
        while not self._closed.is_set() and self._driving_here():
            with self._lock:
                wanted = set(self._interests)
            for channel in sorted(wanted - listening):
                await connection.listen(channel)
            for channel in sorted(listening - wanted):
                await connection.unlisten(channel)
            listening = wanted
            with self._lock:
                ready = [i for i in self._pending if i.channel in listening]
                self._pending.difference_update(ready)
                everyone = [i for s in self._interests.values() for i in s] if reconnected else []
                if set(self._interests) <= listening:
                    self.connected.set()
            for interest in ready:
                interest.ready(None)
            if reconnected:
                reconnected = False
                for interest in everyone:
                    interest.heard(None)
            if wanted:
                idle_since = None
            else:
                idle_since = idle_since if idle_since is not None else time.monotonic()
                if self._ended_idle(idle_since, task=True):
                    return True
            turn = TURN_SECONDS if idle_since is None else \
                max(0.0, min(TURN_SECONDS, idle_since + self._idle - time.monotonic()))
            for channel, payload in await connection.wait(turn):
                self._dispatch(channel, payload)
        return True

    def _ended_idle(self, idle_since: float | None, *, task: bool = False) -> bool:
        """End the thread (the task, with ``task``) (True) when no interest is registered and,
        with ``idle_since``, none has been for :attr:`_idle` seconds; the next :meth:`subscribe`
        starts another."""
        with self._lock:
            if self._interests or (idle_since is not None and time.monotonic() - idle_since < self._idle):
                return False
            if not task:
                self._thread = None
            elif self._task is asyncio.current_task():
                self._task = None
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


# -- one notifier per listening DSN per process ------------------------------------------

_shared: dict[str, tuple[Notifier, int]] = {}
_shared_lock = threading.Lock()


def share(key: str, connect: Callable[[], Connection],
          aconnect: Callable[[], Awaitable[AsyncConnection]] | None = None) -> Share:
    """A share of this process's notifier for ``key`` (the DSN its connection LISTENs
    through), made with ``connect`` (and ``aconnect``, its connection when it runs on an
    event loop) when there is none yet. Every store opened on that DSN holds one; the
    notifier closes with the last (:meth:`Share.close`)."""
    with _shared_lock:
        found = _shared.get(key)
        notifier, holders = found if found is not None and not found[0].closed else \
            (Notifier(connect, name="leaseq-notifier", aconnect=aconnect), 0)
        _shared[key] = (notifier, holders + 1)
    return Share(notifier, key)


def _release(key: str, notifier: Notifier) -> None:
    with _shared_lock:
        found = _shared.get(key)
        if found is None or found[0] is not notifier:
            return
        if found[1] > 1:
            _shared[key] = (notifier, found[1] - 1)
            return
        del _shared[key]
    notifier.close()


class Share:
    """One store's hold on its process's :class:`Notifier` (:func:`share`): waiters of the
    store subscribe through it; :meth:`close` (the store's) wakes those still registered,
    forgets them, and lets the notifier go (closed with the last share)."""

    def __init__(self, notifier: Notifier, key: str):
        #: the process's notifier for this store's listening DSN
        self.notifier = notifier
        self._key = key
        self._lock = threading.Lock()
        self._mine: set[Interest] = set()
        self._closed = False
        self._pid = os.getpid()

    @property
    def connected(self) -> threading.Event:
        """:attr:`Notifier.connected`: set while listening on every channel wanted."""
        return self.notifier.connected

    @property
    def connections(self) -> int:
        """How many times the process's notifier connected."""
        return self.notifier.connections

    @property
    def waiting(self) -> int:
        """How many interests this store's waiters have registered now."""
        with self._lock:
            return len(self._mine)

    def subscribe(self, interest: Interest) -> None:
        """:meth:`Notifier.subscribe`; BackendUnavailable once this share is closed."""
        with self._lock:
            if self._closed:
                raise BackendUnavailable("the queue is closed")
            if self._pid != os.getpid():  # a forked child: the parent's waiters are not here
                self._pid, self._mine = os.getpid(), set()
            self.notifier.subscribe(interest)
            self._mine.add(interest)

    def unsubscribe(self, interest: Interest) -> None:
        """:meth:`Notifier.unsubscribe`."""
        with self._lock:
            self._mine.discard(interest)
        self.notifier.unsubscribe(interest)

    def close(self) -> None:
        """Wake this store's waiters (a waiter about to look is told the queue is closed)
        and forget them; the notifier closes once no store holds a share."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            mine, self._mine = list(self._mine), set()
        pending = [i for i in mine if self.notifier.unsubscribe(i)]
        for interest in pending:
            interest.ready(BackendUnavailable("the queue is closed"))
        for interest in mine:
            interest.heard(None)
        _release(self._key, self.notifier)


def _running(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` is the event loop running in this thread."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


# -- the waiters ------------------------------------------------------------------------

def _unavailable(error: BaseException) -> BackendUnavailable:
    if isinstance(error, BackendUnavailable):
        return BackendUnavailable(str(error))
    return BackendUnavailable(f"PostgreSQL listener: {error}")


class _Part(Interest):
    """One channel of a waiter (a waiter may want several)."""

    __slots__ = ("channel", "loop", "_owner")

    def __init__(self, owner: _Waiter, channel: str):
        self.channel = channel
        self.loop = owner.loop
        self._owner = owner

    def ready(self, error: BaseException | None) -> None:
        """See :meth:`Interest.ready`."""
        self._owner._ready(error)

    def heard(self, payload: str | None) -> None:
        """See :meth:`Interest.heard`."""
        if self._owner._wakes(self.channel, payload):
            self._owner._wake_soon()


class _Waiter:
    """What the blocking and the asyncio waiters share: the channels, and which
    notification wakes the waiter (:meth:`_wakes`, on the notifier's thread)."""

    #: the event loop an asyncio waiter is woken on (None: a blocking waiter)
    loop: asyncio.AbstractEventLoop | None = None

    def __init__(self, notifier: Share, channels: Iterable[str]):
        self._notifier = notifier
        self._parts = [_Part(self, c) for c in channels]

    def _wakes(self, channel: str, payload: str | None) -> bool:
        """Whether a notification on ``channel`` (None: the listener connected again) wakes
        the waiter; called on the notifier's thread."""
        return True

    def _ready(self, error: BaseException | None) -> None:
        raise NotImplementedError

    def _wake_soon(self) -> None:
        raise NotImplementedError

    def _subscribe(self) -> None:
        done: list[_Part] = []
        try:
            for part in self._parts:
                self._notifier.subscribe(part)
                done.append(part)
        except BaseException:
            for part in done:
                self._notifier.unsubscribe(part)
            raise

    def _unsubscribe(self) -> None:
        for part in self._parts:
            self._notifier.unsubscribe(part)


class Wait(_Waiter):
    """A blocking waiter on the process's notifier: :meth:`open` returns once each of its
    channels is listened on; :meth:`wait` until woken; :meth:`close` to forget it."""

    def __init__(self, notifier: Share, channels: Iterable[str]):
        super().__init__(notifier, channels)
        self._state = threading.Lock()
        self._unready = len(self._parts)
        self._listening = threading.Event()
        self._woken = threading.Event()
        self._error: BaseException | None = None

    def _ready(self, error: BaseException | None) -> None:
        with self._state:
            if error is not None:
                self._error = self._error or error
            else:
                self._unready -= 1
            done = self._error is not None or self._unready <= 0
        if done:
            self._listening.set()

    def _wake_soon(self) -> None:
        self._woken.set()

    def open(self, timeout: float) -> Self:
        """Register with the notifier and return (this waiter) once every channel is
        listened on; BackendUnavailable when that could not be within ``timeout`` seconds."""
        self._subscribe()
        if not self._listening.wait(timeout) or self._error is not None:
            self._unsubscribe()
            raise _unavailable(self._error or TimeoutError(f"not listening after {timeout:g} s"))
        return self

    def wait(self, timeout: float) -> bool:
        """True when woken (a burst of notifications wakes it once), False after ``timeout`` seconds."""
        woken = self._woken.wait(max(0.0, timeout))
        self._woken.clear()
        return woken

    def close(self) -> None:
        """Stop listening (each channel is UNLISTENed once no other waiter wants it)."""
        self._unsubscribe()


class AsyncWait(_Waiter):
    """:class:`Wait` for asyncio code, on the running event loop (open it with :meth:`open`):
    the notifier's thread wakes it with ``loop.call_soon_threadsafe``."""

    def __init__(self, notifier: Share, channels: Iterable[str]):
        self._loop = self.loop = asyncio.get_running_loop()
        super().__init__(notifier, channels)
        self._unready = len(self._parts)
        self._listening: asyncio.Future[BaseException | None] = self._loop.create_future()
        self._woken = asyncio.Event()
        self._notified = False
        self._also: asyncio.Event | None = None

    def wake_also(self, event: asyncio.Event) -> None:
        """Set ``event`` too whenever this waiter is woken, in the same turn of the loop: whoever
        waits on ``event`` (the worker's claim loop) runs a turn sooner than if a task awaiting
        :meth:`wait` set it on waking."""
        self._also = event

    def _soon(self, fn: Callable[..., Any], *args: Any) -> None:
        if _running(self._loop):  # told on its own loop (the notifier's task runs there): now
            fn(*args)
            return
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # its loop closed: nobody waits any more
            pass

    def _ready(self, error: BaseException | None) -> None:
        self._soon(self._set_ready, error)

    def _set_ready(self, error: BaseException | None) -> None:
        if self._listening.done():
            return
        if error is not None:
            self._listening.set_result(error)
            return
        self._unready -= 1
        if self._unready <= 0:
            self._listening.set_result(None)

    def _wake_soon(self) -> None:
        self._soon(self._wake)

    def _wake(self) -> None:
        if self._also is not None:  # first: its waiter's turn comes before this waiter's own
            self._also.set()
        self._notified = True
        self._woken.set()

    async def open(self, timeout: float) -> Self:
        """:meth:`Wait.open`, awaited."""
        self._subscribe()
        # a timer, not asyncio.wait_for (see leaseq.core.timers.wait_event)
        timer = self._loop.call_later(timeout, self._set_ready, TimeoutError(f"not listening after {timeout:g} s"))
        try:
            error = await self._listening
        except BaseException:
            self._unsubscribe()
            raise
        finally:
            timer.cancel()
        if error is not None:
            self._unsubscribe()
            raise _unavailable(error)
        return self

    async def wait(self, timeout: float) -> bool:
        """:meth:`Wait.wait`, awaited."""
        if not self._notified:
            await wait_event(self._woken, max(0.0, timeout))
        self._woken.clear()
        woken, self._notified = self._notified, False
        return woken

    async def close(self) -> None:
        """:meth:`Wait.close`, awaited."""
        self._unsubscribe()


class _TaskInterest(_Waiter):
    """Which notifications wake a wait for task ``task_id``: its end, and with ``streams`` its
    emits too (shared by :class:`TaskWait` and :class:`AsyncTaskWait`)."""

    def __init__(self, notifier: Share, task_id: int, *, streams: bool = False):
        super().__init__(notifier, (task_channel(task_id),))
        self._streams = streams

    def _wakes(self, channel: str, payload: str | None) -> bool:
        return payload is None or heard(payload, self._streams)


class _WorkInterest(_Waiter):
    """Which notifications wake a wait for work: an enqueue on one of ``queues``, and the
    listener's connecting again (shared by :class:`WorkWait` and :class:`AsyncWorkWait`)."""

    def __init__(self, notifier: Share, queues: Iterable[str], channels: tuple[str, ...] = (WORK_CHANNEL,)):
        super().__init__(notifier, channels)
        self._queues = frozenset(queues)

    def _wakes(self, channel: str, payload: str | None) -> bool:
        return payload is None or payload in self._queues


class TaskWait(_TaskInterest, Wait):
    """A blocking wait's interest in task ``task_id`` (``streams``: its emits wake it too), as
    :meth:`leaseq.Queue.wait` and :meth:`leaseq.Queue.stream` use it."""


class AsyncTaskWait(_TaskInterest, AsyncWait):
    """:class:`TaskWait` for asyncio code."""


class WorkWait(_WorkInterest, Wait):
    """A blocking waiter woken when work is enqueued on one of ``queues`` (and after the
    listener connected again); see :meth:`leaseq.Queue.listener`. With ``on_interrupt``,
    also told (on the waiting thread, within :meth:`wait`) the id of each worker whose
    waiting claims a service process was asked to end (``notify_interrupt``).

    A notification heard between two waits is kept: the next wait returns at once."""

    def __init__(self, notifier: Share, queues: Iterable[str],
                 on_interrupt: Callable[[str], None] | None = None):
        super().__init__(notifier, queues,
                         (WORK_CHANNEL,) if on_interrupt is None else (WORK_CHANNEL, INTERRUPT_CHANNEL))
        self._on_interrupt = on_interrupt
        self._interrupts: collections.deque[str] = collections.deque()
        self._work = False

    def _wakes(self, channel: str, payload: str | None) -> bool:
        if channel == INTERRUPT_CHANNEL:
            if payload is None:
                return False
            self._interrupts.append(payload)
            return True
        if super()._wakes(channel, payload):
            self._work = True
            return True
        return False

    def wait(self, timeout: float) -> bool:
        """True when work may be waiting on one of the queues, False after ``timeout`` seconds."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            woken = super().wait(deadline - time.monotonic())
            while self._interrupts and self._on_interrupt is not None:
                self._on_interrupt(self._interrupts.popleft())
            if self._work:
                self._work = False
                return True
            if not woken or time.monotonic() >= deadline:
                return False


class AsyncWorkWait(_WorkInterest, AsyncWait):
    """:class:`WorkWait` for asyncio code (the worker runtime's claim loop)."""
