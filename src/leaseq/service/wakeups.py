"""Waking the requests that wait: one listener per service process, and what one token may hold.

Three kinds of request wait in the service: a long-poll claim (``POST
/v1/workers/{id}/claim`` with ``wait``), a wait for a task's end (``GET
/v1/tasks/{id}/wait``) and a dashboard live stream (``GET /live``). What
wakes them:

* on PostgreSQL, one ``LISTEN`` connection per process (opened when the first
  request waits), whatever the number of waiting requests: the process's
  :class:`~leaseq.store.notifier.Notifier`, the one its queue's own waits and
  streams, and an in-process worker's claim loop, are woken through too. An enqueue's
  ``NOTIFY`` names its queue and wakes only the claims waiting on that queue
  (each then claims again; the claim statement decides who gets what); a
  watched task's end is notified on that task's own channel, which the
  connection listens on while a request waits for the task, and wakes only
  those requests;
* anything enqueued or sent back to the queue through this same process
  (its enqueue route calls :meth:`WorkSignal.wake`), on either backend;
* a re-check every ``recheck`` seconds, for what no notification announces:
  a delayed task coming due, an expired lease to route, a change to a SQLite
  file (SQLite cannot notify, so its re-check is short), or a notification
  missed while the listener reconnected (it wakes every waiting request once
  it is back).

What one token may cost: it holds at most ``per_token`` waiting requests at
once, and the process at most ``per_process`` (:meth:`WorkSignal.slot`; past
either, 429 ``rate_limited`` with ``Retry-After``); and every look a waiting
request takes after its first is charged to the token's rate bucket
(:meth:`WorkSignal.paced`): an empty bucket makes the request look later,
never more often. The listener knows nothing of leases; it only says "look
again".
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from ..core.errors import RateLimited
from ..core.timers import wait_event
from ..queue import Queue
from ..store.base import STREAM_PAYLOAD
from ..store.notifier import INTERRUPT_CHANNEL, WORK_CHANNEL, Interest, Share, task_channel

#: Re-check period of a waiting claim where LISTEN/NOTIFY wakes it (PostgreSQL)...
NOTIFIED_RECHECK = 1.0
#: ...and where nothing but this process's own enqueues can (SQLite).
POLLED_RECHECK = 0.2
#: Most waiting requests (claims, task waits, live streams) one token may hold in one process...
WAITS_PER_TOKEN = 100
#: ...and all tokens together.
WAITS_PER_PROCESS = 1000
#: The ``Retry-After`` of a wait refused for being past a cap (seconds): a slot frees
#: only when a wait ends, seconds later, so asking again sooner is wasted. Each refusal
#: asks for between this and twice this (:func:`cap_retry_after`): clients refused together
#: come back spread out, not in one burst every five seconds.
CAP_RETRY_AFTER = 5.0


def cap_retry_after() -> float:
    """A refused wait's ``retry_after``: :data:`CAP_RETRY_AFTER` to twice that, at random."""
    return CAP_RETRY_AFTER * random.uniform(1.0, 2.0)


#: The part of the service's limit on a waiting request that is drawn at random for each
#: request (:func:`drawn_limit`).
LIMIT_SPREAD = 0.2


def drawn_limit(limit: float) -> float:
    """The service's ``limit`` on one waiting request (``wait_limit``, ``claim_wait_limit``,
    ``stream_seconds``), drawn for each request from its last :data:`LIMIT_SPREAD`.

    Requests that began waiting together (a flood's first wave, opened at once) would all
    end together at the limit, and their client ask again all at once: a hundred waits'
    first transactions queued in one burst, which held every other request up by a second
    and more (issue 29). Drawn, they end spread over a fifth of the limit. A request asking
    for less than the draw waits what it asked."""
    return limit * random.uniform(1.0 - LIMIT_SPREAD, 1.0)
#: The longest a new task wait waits for the listener to listen on its task's channel
#: before it looks anyway (it then relies on its re-check).
SUBSCRIBE_SECONDS = 2.0
#: A stream's reader that got nothing new for this long is given a keep-alive (seconds), so
#: proxies keep its connection open.
STREAM_KEEPALIVE = 15.0


class _Wakeable:
    """A waiting request's wake-up."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        """Until woken or ``timeout`` seconds pass; then ready to be woken again (a
        cancelled request stops here: :func:`~leaseq.core.timers.wait_event`)."""
        await wait_event(self.event, timeout)
        self.event.clear()


class Waiter(_Wakeable):
    """One waiting claim request."""

    __slots__ = ("queue", "worker_id", "interrupted")

    def __init__(self, queue: str, worker_id: str):
        super().__init__()
        self.queue = queue
        self.worker_id = worker_id
        #: the worker asked to stop waiting (it is shutting down): claim nothing more
        self.interrupted = False


class TaskWaiter(_Wakeable):
    """One request waiting for a task's end (``streams``: or following its stream)."""

    __slots__ = ("task_id", "listening", "streams")

    def __init__(self, task_id: int, streams: bool = False):
        super().__init__()
        self.task_id = task_id
        #: woken by the task's emits too (a stream's reader), not only by its end
        self.streams = streams
        #: set once the shared listener listens on the task's channel (at once where nothing notifies)
        self.listening = asyncio.Event()


class _Channel(Interest):
    """What the service's notifier tells :class:`WorkSignal` of a channel it always listens on
    (``leaseq_work``: ``on_note`` with the queue; ``leaseq_interrupt``: with the worker)."""

    def __init__(self, channel: str, on_ready: Callable[[], None], on_note: Callable[[str], None],
                 on_reconnect: Callable[[], None]):
        self.channel = channel
        self._on_ready = on_ready
        self._on_note = on_note
        self._on_reconnect = on_reconnect

    def ready(self, error: BaseException | None) -> None:
        """See :meth:`Interest.ready`."""
        if error is None:
            self._on_ready()

    def heard(self, payload: str | None) -> None:
        """See :meth:`Interest.heard`."""
        if payload is None:
            self._on_reconnect()
        else:
            self._on_note(payload)


class _TaskChannel(Interest):
    """A :class:`TaskWaiter`'s interest in its task's channel (the service's notifier)."""

    def __init__(self, signal: WorkSignal, waiter: TaskWaiter):
        self.channel = task_channel(waiter.task_id)
        self._signal = signal
        self._waiter = waiter

    def ready(self, error: BaseException | None) -> None:
        """See :meth:`Interest.ready` (not listening: the waiter's re-check looks)."""
        if error is None:
            self._signal._on_loop(self._waiter.listening.set)

    def heard(self, payload: str | None) -> None:
        """See :meth:`Interest.heard`."""
        if payload is not None:
            self._signal.task_notifications += 1
        if payload is None or self._waiter.streams or payload != STREAM_PAYLOAD:
            self._signal._on_loop(self._waiter.event.set)


class WorkSignal:
    """Wakes the waiting requests of one service process, and bounds how many may wait.

    ``recheck`` (seconds): how often a waiting claim looks again on its own;
    by default :data:`NOTIFIED_RECHECK` where the backend notifies, else
    :data:`POLLED_RECHECK`. ``charge(token_id)``: takes one look from the
    token's rate bucket, returning 0 or the seconds until it could (the
    service's :class:`~leaseq.service.access.TokenBuckets`); None charges nothing.
    """

    def __init__(self, queue: Queue, *, recheck: float | None = None, per_token: int = WAITS_PER_TOKEN,
                 per_process: int = WAITS_PER_PROCESS, charge: Callable[[str], float] | None = None):
        self.queue = queue
        self.notifies = queue.capabilities.listen_notify
        self.recheck = recheck if recheck is not None else (NOTIFIED_RECHECK if self.notifies else POLLED_RECHECK)
        self.per_token = per_token
        self.per_process = per_process
        self._charge = charge
        self._waiters: set[Waiter] = set()
        self._tasks: dict[int, set[TaskWaiter]] = {}
        self._held: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the queue's share of the process's one LISTEN connection (its own thread), which listens
        #: for the waiting requests once one first waits
        self._notifier: Share | None = queue.store.notifier if self.notifies else None
        #: this process's interests in the channels it always listens on, once a request waited
        self._channels: list[_Channel] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        #: set while the shared listener is connected (tests wait on it)
        self.listening = self._notifier.connected if self._notifier is not None else threading.Event()
        #: work notifications heard (each woke the claims waiting on its queue)
        self.notifications = 0
        #: task notifications heard (each woke the requests waiting for that task)
        self.task_notifications = 0

    @property
    def waiting(self) -> int:
        """How many claim requests wait now."""
        return len(self._waiters)

    @property
    def held(self) -> int:
        """How many waiting requests (claims, task waits, live streams) hold a slot now."""
        return sum(self._held.values())

    # -- what one token may hold ------------------------------------------------------

    @contextmanager
    def slot(self, token_id: str) -> Iterator[None]:
        """One waiting request of ``token_id`` for as long as the block lasts; RateLimited
        (429, ``Retry-After``) when the token, or the process, holds its most already."""
        with self._lock:
            self._check_room(token_id)
            self._held[token_id] = self._held.get(token_id, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._held[token_id] - 1
                if left:
                    self._held[token_id] = left
                else:
                    del self._held[token_id]

    def check_room(self, token_id: str) -> None:
        """RateLimited when :meth:`slot` would refuse ``token_id`` now."""
        with self._lock:
            self._check_room(token_id)

    def _check_room(self, token_id: str) -> None:
        mine = self._held.get(token_id, 0)
        if mine >= self.per_token:
            raise RateLimited(f"token {token_id} already holds {mine} waiting requests (waits, long-poll "
                              f"claims, live streams), the most one token may hold at once", cap_retry_after())
        if sum(self._held.values()) >= self.per_process:
            raise RateLimited(f"this service process already holds {self.per_process} waiting requests, "
                              "the most it serves at once", cap_retry_after())

    async def paced(self, token_id: str, deadline: float) -> bool:
        """Charge one more look of a waiting request to ``token_id``'s rate bucket, waiting
        while the bucket is empty; False when ``deadline`` (monotonic) passes first."""
        if self._charge is None:
            return time.monotonic() < deadline
        while True:
            owed = self._charge(token_id)
            left = deadline - time.monotonic()
            if not owed:
                return left > 0
            if owed >= left:
                return False
            await asyncio.sleep(owed)

    # -- claims ---------------------------------------------------------------------

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
        """Run ``fn(*args)`` on the waiting requests' loop, if any request waits (from any thread)."""
        loop = self._loop
        if loop is None or loop.is_closed() or not (self._waiters or self._tasks):
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

    # -- task waits -------------------------------------------------------------------

    @contextmanager
    def task_waiter(self, task_id: int, *, streams: bool = False) -> Iterator[TaskWaiter]:
        """Register a request waiting for task ``task_id``'s end (on the running event loop);
        ``streams``: following its stream, woken by its emits too.

        Await its ``listening`` before the first look: a change notified after
        that look is then heard, and not missed."""
        self._loop = asyncio.get_running_loop()
        w = TaskWaiter(task_id, streams)
        with self._lock:
            self._tasks.setdefault(task_id, set()).add(w)
        interest = None
        if self._notifier is None:
            w.listening.set()  # nothing to listen to: the re-check looks
        elif not self._closed.is_set():  # else the application is stopping: the re-check looks
            self._ensure_listener()
            interest = _TaskChannel(self, w)
            try:
                self._notifier.subscribe(interest)  # listened on at once, not at the next turn
            except Exception:  # the queue is closed (the application is stopping): the re-check looks
                interest = None
        try:
            yield w
        finally:
            if interest is not None and self._notifier is not None:
                self._notifier.unsubscribe(interest)
            with self._lock:
                waiting = self._tasks.get(task_id)
                if waiting is not None:
                    waiting.discard(w)
                    if not waiting:
                        del self._tasks[task_id]

    @property
    def _listened(self) -> set[int]:
        """The tasks whose channels the shared listener listens on for a waiting request now."""
        with self._lock:
            return {t for t, ws in self._tasks.items() if any(w.listening.is_set() for w in ws)} \
                if self._notifier is not None else set()

    def _wake_task(self, task_id: int | None, streams_only: bool = False) -> None:
        """Wake the requests waiting for ``task_id`` (None: every task's); ``streams_only``: an
        emit, which wakes only the stream's readers."""
        with self._lock:
            found = [w for ws in self._tasks.values() for w in ws] if task_id is None else \
                list(self._tasks.get(task_id, ()))
        for w in found:
            if w.streams or not streams_only:
                w.event.set()

    def wake_stream(self, task_id: int) -> None:
        """Wake the readers of task ``task_id``'s stream (an emit through this process). Callable
        from any thread."""
        self._on_loop(self._wake_task, task_id, True)

    def _wake_all(self, _: None = None) -> None:
        self._wake(None)
        self._wake_task(None)

    # -- the shared listener ------------------------------------------------------

    def _ensure_listener(self) -> None:
        """Listen on ``leaseq_work`` and ``leaseq_interrupt`` from now on (the first waiting request)."""
        notifier = self._notifier
        if notifier is None:
            return
        with self._lock:
            if self._channels or self._closed.is_set():
                return
            self._channels = [
                # claims that looked before the listener connected look again once it has
                _Channel(WORK_CHANNEL, lambda: self._on_loop(self._wake, None), self._heard_work,
                         lambda: self._on_loop(self._wake_all)),
                _Channel(INTERRUPT_CHANNEL, lambda: None, lambda worker: self._on_loop(self.interrupt, worker),
                         lambda: None),
            ]
            channels = list(self._channels)
        for channel in channels:
            try:
                notifier.subscribe(channel)
            except Exception:  # closed meanwhile (the application is stopping)
                pass

    def _heard_work(self, queue: str) -> None:
        """Work was enqueued on ``queue`` (the listener's thread)."""
        self.notifications += 1
        self.wake(queue)

    def close(self) -> None:
        """Stop listening for the waiting requests (the application's shutdown), and wake
        them: each looks again. The queue's own waiters are the queue's (its ``close()``)."""
        with self._lock:
            self._closed.set()
            channels, self._channels = self._channels, []
        if self._notifier is not None:
            for channel in channels:
                self._notifier.unsubscribe(channel)
        self._on_loop(self._wake_all)


async def wait_for_task(signal: WorkSignal, task_id: int, timeout: float, token_id: str) -> tuple[Any, bool]:
    """A request's wait for task ``task_id``'s end, up to ``timeout`` seconds: ``(task, settled)``.

    Woken by the task's own notification (the shared listener), else by the
    re-check; each look after the first is charged to ``token_id``'s bucket
    (:meth:`WorkSignal.paced`). NotFound when there is no such task."""
    from .. import engine

    queue = signal.queue
    deadline = time.monotonic() + timeout
    recheck = signal.recheck if not signal.notifies else engine.waits.LONGEST_SLEEP
    with signal.task_waiter(task_id) as w:
        if not w.listening.is_set():
            await wait_event(w.listening, min(SUBSCRIBE_SECONDS, timeout))
            if not w.listening.is_set():
                recheck = signal.recheck  # not heard by the listener (it is away): look on our own
        task = await engine.adrive(queue.store, engine.waits.watch(queue.settings, task_id))
        while task.status not in engine.waits.SETTLED:
            left = deadline - time.monotonic()
            if left <= 0:
                return task, False
            await w.wait(min(left, recheck))
            if not await signal.paced(token_id, deadline):
                return task, False
            task = await engine.adrive(queue.store, engine.reads.get(queue.settings, task_id))
        return task, True


async def follow_stream(signal: WorkSignal, cursor: Any, token_id: str) -> AsyncGenerator[Any, None]:
    """A request's reading of a task's stream (``GET /v1/tasks/{id}/stream``): the entries after
    ``cursor`` (a :class:`leaseq.engine.streams.Cursor`: where to begin, whether to follow, for
    how long and how many), page by page, and None now and then while nothing comes (a
    keep-alive). Woken by the task's emits and its end (the shared listener), else by the
    re-check; each look after the first is charged to ``token_id``'s bucket. NotFound when
    there is no such task."""
    from .. import engine

    queue = signal.queue
    recheck = signal.recheck if not signal.notifies else STREAM_KEEPALIVE
    with signal.task_waiter(cursor.task_id, streams=True) as w:
        if cursor.follow and not w.listening.is_set():
            await wait_event(w.listening, SUBSCRIBE_SECONDS)
            if not w.listening.is_set():
                recheck = signal.recheck  # not heard by the listener (it is away): look on our own
        page = await _read(queue, cursor.read(queue.settings, first=True))
        quiet_since = time.monotonic()
        while True:
            for item in cursor.take(page):
                quiet_since = time.monotonic()
                yield item
            if cursor.done or cursor.capped:
                return
            pause = cursor.pause()
            if pause is None:
                return
            if pause:
                await w.wait(min(pause, recheck, STREAM_KEEPALIVE))
                if time.monotonic() - quiet_since >= STREAM_KEEPALIVE:
                    quiet_since = time.monotonic()
                    yield None
            deadline = cursor.deadline if cursor.deadline is not None else time.monotonic() + STREAM_KEEPALIVE
            if not await signal.paced(token_id, deadline):
                return
            page = await _read(queue, cursor.read(queue.settings))


async def _read(queue: Queue, op: Any) -> Any:
    """A stream's read, on the event loop where the backend has an asyncio driver; else in a
    thread the request waits for even when it is cancelled (its client went away), so no
    statement of a stream outlives the stream."""
    from .. import engine

    if queue.store.capabilities.native_async:
        return await engine.adrive(queue.store, op)
    return await anyio.to_thread.run_sync(engine.drive, queue.store, op)
