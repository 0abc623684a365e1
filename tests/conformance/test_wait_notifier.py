"""On PostgreSQL every waiter of a process is woken through one LISTEN connection (the
process's notifier for its DSN): a worker's claim loop, task waits in its handlers, and
every task wait and stream follow, however many wait at once, sync and async alike,
whichever queue object they came through; each is woken by its own task only, and a
listener connection that drops is replaced without a wait missing its task's end."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import leaseq
from pg_modes import own_connection

N = 50

#: the connections of a queue that LISTEN (their last statement was a LISTEN or an UNLISTEN)
LISTENING = ("SELECT pid FROM pg_stat_activity WHERE application_name = %s "
             "AND query ~ '^(UN)?LISTEN' ORDER BY pid")


@pytest.fixture
def named(q: leaseq.Queue, dsn: str) -> Iterator[tuple[leaseq.Queue, str]]:
    """A second queue on ``q``'s PostgreSQL schema whose connections carry a name of their
    own (``application_name``), so pg_stat_activity tells which are its, and that name."""
    if q.dialect != "postgres" or not q.capabilities.listen_notify:
        pytest.skip("only PostgreSQL notifies")
    app = f"notifier_{uuid.uuid4().hex[:10]}"
    queue = leaseq.connect(f"{dsn}{'&' if '?' in dsn else '?'}application_name={app}")
    try:
        yield queue, app
    finally:
        queue.close()


def _listening(dsn: str, app: str) -> list[int]:
    with own_connection(dsn) as conn:
        return [r[0] for r in conn.execute(LISTENING, (app,)).fetchall()]


def _watched(dsn: str, ids: list[int] | None = None) -> int:
    """How many tasks (of ``ids``) a wait has looked at, listening already."""
    with own_connection(dsn) as conn:
        return int(conn.execute("SELECT count(*) FROM leaseq_tasks WHERE watched AND (%s::bigint[] IS NULL "
                                "OR id = ANY(%s))", (ids, ids)).fetchone()[0])


def _until(check: Any, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _claimed(q: leaseq.Queue, n: int) -> tuple[str, dict[int, leaseq.Claim]]:
    w = q.register_worker("w").id
    for i in range(n):
        q.enqueue("job", {"i": i})
    claims = q.claim(w, limit=n)
    assert len(claims) == n
    return w, {c.task_id: c for c in claims}


def _thread_waits(queue: leaseq.Queue, ids: list[int], returned: dict[int, tuple[str, float]],
                  errors: list[BaseException]) -> list[threading.Thread]:
    def wait(task_id: int) -> None:
        try:
            task = queue.wait(task_id, timeout=90)
            returned[task_id] = (task.status, time.monotonic())
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in ids]
    for thread in threads:
        thread.start()
    return threads


def _end_and_check(q: leaseq.Queue, w: str, claims: dict[int, leaseq.Claim], ids: list[int],
                   returned: dict[int, tuple[str, float]], errors: list[BaseException]) -> None:
    """End the first half of ``ids``: exactly their waits return, each after its task's end;
    then the rest."""
    first, rest = ids[:len(ids) // 2], ids[len(ids) // 2:]
    ended: dict[int, float] = {}
    for batch in (first, rest):
        for task_id in batch:
            ended[task_id] = time.monotonic()
            q.complete(w, claims[task_id], result=task_id)
        _until(lambda: set(batch) <= set(returned) or errors, f"waits of {batch} did not all return")
        assert not errors, errors
        time.sleep(0.3)  # a wait woken by another task's end would have returned by now
        assert set(returned) == set(ended), sorted(set(returned) - set(ended))
    for task_id, (status, at) in returned.items():
        assert status == "completed" and at >= ended[task_id]


def test_fifty_blocking_waits_share_one_listen_connection(q: leaseq.Queue, dsn: str,
                                                           named: tuple[leaseq.Queue, str]) -> None:
    queue, app = named
    w, claims = _claimed(q, N)
    ids = sorted(claims)
    returned: dict[int, tuple[str, float]] = {}
    errors: list[BaseException] = []
    threads = _thread_waits(queue, ids, returned, errors)
    _until(lambda: _watched(dsn) == N or errors, "the waits never all looked")
    assert not errors, errors
    assert len(_listening(dsn, app)) == 1
    assert not returned
    _end_and_check(q, w, claims, ids, returned, errors)
    for thread in threads:
        thread.join(10)
    assert len(_listening(dsn, app)) <= 1
    notifier = queue.store.notifier.notifier  # type: ignore[attr-defined]
    queue.close()  # the last store on its DSN: stops the thread and closes its connection
    assert notifier._thread is None or not notifier._thread.is_alive()
    assert _listening(dsn, app) == []


def test_fifty_async_waits_share_one_listen_connection(q: leaseq.Queue, dsn: str,
                                                       named: tuple[leaseq.Queue, str]) -> None:
    queue, app = named
    w, claims = _claimed(q, N)
    ids = sorted(claims)
    returned: dict[int, tuple[str, float]] = {}

    async def main() -> None:
        aq = leaseq.AsyncQueue(queue)

        async def wait(task_id: int) -> None:
            task = await aq.wait(task_id, timeout=90)
            returned[task_id] = (task.status, time.monotonic())

        waits = [asyncio.ensure_future(wait(i)) for i in ids]
        try:
            deadline = time.monotonic() + 30
            while await asyncio.to_thread(_watched, dsn) < N:
                assert time.monotonic() < deadline, "the waits never all looked"
                for done in (f for f in waits if f.done()):
                    done.result()
                await asyncio.sleep(0.05)
            assert len(await asyncio.to_thread(_listening, dsn, app)) == 1
            assert not returned
            await asyncio.to_thread(_end_and_check, q, w, claims, ids, returned, [])
            await asyncio.wait_for(asyncio.gather(*waits), 10)
        finally:
            for f in waits:
                f.cancel()
            await aq.close_async()

    asyncio.run(main())


def test_stream_followers_and_waits_share_it_and_emits_wake_the_followers(
        q: leaseq.Queue, dsn: str, named: tuple[leaseq.Queue, str]) -> None:
    queue, app = named
    w, claims = _claimed(q, 12)
    followed, ids = sorted(claims)[:2], sorted(claims)[2:]
    returned: dict[int, tuple[str, float]] = {}
    errors: list[BaseException] = []
    got: dict[str, list[Any]] = {"sync": [], "async": []}
    seen = threading.Condition()

    def follow_sync() -> None:
        try:
            for entry in queue.stream(followed[0], timeout=60):
                with seen:
                    got["sync"].append(entry.item)
                    seen.notify_all()
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    def follow_async() -> None:
        async def run() -> None:
            async for entry in leaseq.AsyncQueue(queue).stream(followed[1], timeout=60):
                with seen:
                    got["async"].append(entry.item)
                    seen.notify_all()
        try:
            asyncio.run(run())
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    for task_id in followed:
        q.emit(w, claims[task_id], "before the readers came")
    readers = [threading.Thread(target=f, daemon=True) for f in (follow_sync, follow_async)]
    for reader in readers:
        reader.start()
    threads = _thread_waits(queue, ids, returned, errors)
    _until(lambda: _watched(dsn, ids) == len(ids) or errors, "the waits never all looked")
    with seen:  # each reader has read what was there: it follows now
        assert seen.wait_for(lambda: ("before the readers came" in got["sync"]
                                      and "before the readers came" in got["async"]) or errors, 30), got
    assert len(_listening(dsn, app)) == 1
    for n in (1, 2):
        for task_id in followed:
            q.emit(w, claims[task_id], {"n": n})
        with seen:  # woken by the emit itself: the readers' timeouts are a minute long
            assert seen.wait_for(lambda: sum(1 for i in got["sync"] if isinstance(i, dict)) >= n
                                 and sum(1 for i in got["async"] if isinstance(i, dict)) >= n or errors, 5), got
    assert not errors and not returned, (errors, returned)  # no emit woke a wait for another task's end
    for task_id in followed:
        q.complete(w, claims[task_id], result="done")
    for reader in readers:
        reader.join(10)
        assert not reader.is_alive()
    assert [i for i in got["sync"] if isinstance(i, dict)] == [{"n": 1}, {"n": 2}]
    assert [i for i in got["async"] if isinstance(i, dict)] == [{"n": 1}, {"n": 2}]
    for task_id in ids:
        q.complete(w, claims[task_id], result=task_id)
    for thread in threads:
        thread.join(10)
    assert not errors and sorted(returned) == ids


def test_waits_end_when_the_listener_connection_is_terminated(q: leaseq.Queue, dsn: str,
                                                              named: tuple[leaseq.Queue, str]) -> None:
    """The one listener's backend is terminated mid-wait: tasks that end before it is back
    (their NOTIFY goes nowhere) and after are all returned, by sync and async waits alike."""
    queue, app = named
    w, claims = _claimed(q, 20)
    ids = sorted(claims)
    sync_ids, async_ids = ids[:10], ids[10:]
    returned: dict[int, tuple[str, float]] = {}
    errors: list[BaseException] = []
    threads = _thread_waits(queue, sync_ids, returned, errors)

    def async_waits() -> None:
        async def run() -> None:
            aq = leaseq.AsyncQueue(queue)

            async def wait(task_id: int) -> None:
                task = await aq.wait(task_id, timeout=90)
                returned[task_id] = (task.status, time.monotonic())

            try:
                await asyncio.gather(*(wait(i) for i in async_ids))
            finally:
                await aq.close_async()
        try:
            asyncio.run(run())
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    threads.append(threading.Thread(target=async_waits, daemon=True))
    threads[-1].start()
    _until(lambda: _watched(dsn) == len(ids) or errors, "the waits never all looked")
    assert not errors, errors
    [pid] = _listening(dsn, app)
    with own_connection(dsn) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
    ended: dict[int, float] = {}
    for task_id in ids[::2]:  # at once: most, if not all, while no listener is connected
        ended[task_id] = time.monotonic()
        q.complete(w, claims[task_id], result=task_id)
    _until(lambda: set(ended) <= set(returned) or errors, "a wait missed its task's end while the listener was away")
    _until(lambda: (p := _listening(dsn, app)) != [] and pid not in p, "the listener never came back")
    assert len(_listening(dsn, app)) == 1
    time.sleep(0.3)
    assert set(returned) == set(ended) and not errors, (sorted(set(returned) - set(ended)), errors)
    for task_id in ids[1::2]:  # after: woken by NOTIFY on the new connection
        ended[task_id] = time.monotonic()
        q.complete(w, claims[task_id], result=task_id)
    for thread in threads:
        thread.join(15)
    assert not errors, errors
    assert sorted(returned) == ids
    for task_id, (status, at) in returned.items():
        assert status == "completed" and at >= ended[task_id]


def test_a_worker_a_handlers_wait_and_a_stream_share_one_listen_connection(
        q: leaseq.Queue, dsn: str, named: tuple[leaseq.Queue, str]) -> None:
    """A process running a worker (its claim loop waits for work), whose handler waits for
    another task, while a stream is followed through another queue object on the same DSN:
    one LISTEN connection for all three, and an enqueue still wakes the idle claim loop."""
    queue, app = named
    application = leaseq.App(queue.store.dsn)  # a queue object of its own: the worker's
    w = q.register_worker("elsewhere").id
    child, followed = q.enqueue("child", queue="later"), q.enqueue("followed", queue="later")
    claims = {c.task_id: c for c in q.claim(w, queue="later", limit=2)}
    q.emit(w, claims[followed.id], "before the reader came")
    pinged = threading.Event()

    @application.task("parent")
    def parent(ctx: Any, child_id: int) -> str:
        return application.queue.wait(child_id, timeout=60).status

    @application.task("ping")
    def ping(ctx: Any) -> None:
        pinged.set()

    waiting = parent.enqueue(child_id=child.id)
    runtime = application.worker(concurrency=2, poll_interval=30)
    errors: list[BaseException] = []
    got: list[Any] = []

    def run() -> None:
        try:
            asyncio.run(runtime.run())
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    def follow() -> None:
        try:
            for entry in queue.stream(followed.id, timeout=60):
                got.append(entry.item)
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=f, daemon=True) for f in (run, follow)]
    for thread in threads:
        thread.start()
    try:
        _until(lambda: _watched(dsn, [child.id]) == 1 or errors, "the handler's wait never looked")
        _until(lambda: "before the reader came" in got or errors, "the reader never read")
        assert not errors, errors
        time.sleep(0.5)  # the worker's claim loop has long been waiting for work
        assert len(_listening(dsn, app)) == 1
        pinged_at = time.monotonic()
        ping.enqueue()  # the idle claim loop is woken through that one connection, not by its 30 s poll
        assert pinged.wait(10), "the claim loop never woke"
        assert time.monotonic() - pinged_at < 10
        q.complete(w, claims[child.id], result="done")
        _until(lambda: q.get(waiting.id).status == "completed" or errors, "the handler's wait never returned")
        assert q.get(waiting.id).result == "completed"
        q.complete(w, claims[followed.id], result="done")
        threads[1].join(10)
        assert not threads[1].is_alive() and [i for i in got if i is not None] == ["before the reader came"]
    finally:
        runtime.stop()
        threads[0].join(15)
        application.queue.close()
    assert not errors, errors
    assert len(_listening(dsn, app)) == 1  # the stream's queue still holds its share


def test_closing_one_queue_ends_its_waits_and_leaves_another_queues_on_the_connection(
        q: leaseq.Queue, dsn: str, named: tuple[leaseq.Queue, str]) -> None:
    """Two queue objects on one DSN share the process's connection: closing one ends its
    waits at once (BackendUnavailable: they look again, on a closed queue) and refuses new
    ones, while the other's wait is still woken by its task's end, through the same
    connection, which stays open until the last of them closes."""
    queue, app = named
    other = leaseq.connect(queue.store.dsn)  # type: ignore[attr-defined]
    w, claims = _claimed(q, 2)
    mine, theirs = sorted(claims)
    outcome: dict[str, Any] = {}

    def wait(name: str, on: leaseq.Queue, task_id: int) -> None:
        try:
            outcome[name] = on.wait(task_id, timeout=60).status
        except BaseException as exc:
            outcome[name] = exc

    threads = [threading.Thread(target=wait, args=a, daemon=True)
               for a in (("closed", other, mine), ("open", queue, theirs))]
    try:
        for thread in threads:
            thread.start()
        _until(lambda: _watched(dsn, [mine, theirs]) == 2, "the waits never looked")
        assert len(_listening(dsn, app)) == 1
        closed_at = time.monotonic()
        other.close()
        threads[0].join(10)
        assert isinstance(outcome.get("closed"), leaseq.BackendUnavailable), outcome
        assert time.monotonic() - closed_at < 5
        with pytest.raises(leaseq.BackendUnavailable):
            other.wait(theirs, timeout=1)
        assert "open" not in outcome and len(_listening(dsn, app)) == 1
        q.complete(w, claims[theirs], result="done")
        threads[1].join(10)
        assert outcome["open"] == "completed"
    finally:
        other.close()


class _Gated:
    """The notifier's real connection, whose LISTENs wait for ``gate`` (so a test sees what
    the notifier says while a channel is not listened on yet)."""

    def __init__(self, dsn: str, gate: threading.Event):
        from leaseq.store.postgres import SharedListener

        self._listener = SharedListener(dsn)
        self._gate = gate

    def listen(self, channel: str) -> None:
        assert self._gate.wait(30)
        self._listener.listen(channel)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._listener, name)


class _Heard:
    def __init__(self, channel: str):
        self.channel = channel
        self.listening = threading.Event()
        self.payloads: list[str | None] = []

    def ready(self, error: BaseException | None) -> None:
        assert error is None
        self.listening.set()

    def heard(self, payload: str | None) -> None:
        self.payloads.append(payload)


def test_the_notifier_is_connected_only_once_it_listens_on_every_channel_wanted(
        named: tuple[leaseq.Queue, str]) -> None:
    """``connected`` (what the service's ``WorkSignal.listening`` is) is set only while every
    channel wanted is listened on: a channel one waiter adds to a connection already serving
    others clears it until the LISTEN is done, so a notification sent once it is set again
    is heard."""
    from leaseq.store.notifier import Notifier

    queue, _ = named
    conninfo = queue.store.conninfo  # type: ignore[attr-defined]
    gate = threading.Event()
    gate.set()
    notifier = Notifier(lambda: _Gated(conninfo, gate))  # type: ignore[arg-type, return-value]
    first, second = _Heard("leaseq_test_first"), _Heard("leaseq_test_second")
    try:
        notifier.subscribe(first)  # type: ignore[arg-type]
        assert first.listening.wait(10) and notifier.connected.wait(10)
        gate.clear()
        notifier.subscribe(second)  # type: ignore[arg-type]
        time.sleep(0.2)  # the thread is held at the second channel's LISTEN
        assert not notifier.connected.is_set() and not second.listening.is_set()
        gate.set()
        assert notifier.connected.wait(10) and second.listening.wait(10)
        with own_connection(conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_notify('leaseq_test_second', 'hello')")
        _until(lambda: second.payloads == ["hello"], "the second channel's notification never came")
    finally:
        gate.set()
        notifier.close()


def test_a_blocking_work_listener_is_told_interrupts_on_its_own_thread(named: tuple[leaseq.Queue, str]) -> None:
    """``store.listener(queues, on_interrupt=...)``: an interrupt (``notify_interrupt``) is
    handed to ``on_interrupt`` on the thread that waits, without ending the wait as work
    would; work on one of its queues ends it (True), work on another does not."""
    queue, _ = named
    conninfo = queue.store.conninfo  # type: ignore[attr-defined]
    told: list[tuple[str, str]] = []
    listener = queue.store.listener({"mine"}, on_interrupt=lambda worker: told.append(  # type: ignore[attr-defined]
        (worker, threading.current_thread().name)))
    try:
        with own_connection(conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_notify('leaseq_interrupt', 'w-1')")
            conn.execute("SELECT pg_notify('leaseq_work', 'theirs')")
        started = time.monotonic()
        assert listener.wait(1.0) is False
        assert time.monotonic() - started >= 0.9
        assert told == [("w-1", threading.current_thread().name)]
        with own_connection(conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_notify('leaseq_work', 'mine')")
        assert listener.wait(10) is True
    finally:
        listener.close()


def test_a_work_waiter_sets_the_claim_loops_event_itself_as_it_is_woken(named: tuple[leaseq.Queue, str]) -> None:
    """The worker's claim loop is woken in the turn the notification reaches the loop: the
    waiter sets the loop's event itself (``wake_also``), with no task awaiting its ``wait()``
    in between; an enqueue on another queue leaves it alone."""
    queue, _ = named
    lane, other = f"lane_{uuid.uuid4().hex[:8]}", f"other_{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        aq = leaseq.AsyncQueue(queue)
        listener = await aq.listener([lane])
        try:
            wake = asyncio.Event()
            listener.wake_also(wake)
            await aq.enqueue("k", queue=other)
            await aq.enqueue("k", queue=lane)
            # nothing awaits listener.wait(): the notification alone sets the event
            await asyncio.wait_for(wake.wait(), 10)
            assert await listener.wait(0)  # and the waiter still tells its own caller
            wake.clear()
            await aq.enqueue("k", queue=other)
            assert not await listener.wait(1.0) and not wake.is_set()
        finally:
            await listener.close()
            await aq.close_async()

    asyncio.run(main())


def test_the_notifier_runs_on_its_first_asyncio_waiters_loop_and_a_thread_takes_over_after(
        q: leaseq.Queue, dsn: str, named: tuple[leaseq.Queue, str]) -> None:
    """An asyncio process's first waiter puts the notifier on its event loop (a task whose
    loop watches the connection: no thread hands a notification over). It serves blocking
    waits of other threads too, reconnects on the loop when its backend is terminated (every
    waiter looks again), and when that loop ends a thread takes over the waits still open."""
    queue, app = named
    w, claims = _claimed(q, 3)
    first, second, third = sorted(claims)
    lane = f"lane_{uuid.uuid4().hex[:8]}"
    notifier = queue.store.notifier.notifier  # type: ignore[attr-defined]
    returned: dict[int, tuple[str, float]] = {}
    errors: list[BaseException] = []

    async def main() -> list[threading.Thread]:
        aq = leaseq.AsyncQueue(queue)
        listener = await aq.listener([lane])
        try:
            assert notifier._task is not None and notifier._thread is None
            threads = _thread_waits(queue, [first, second, third], returned, errors)
            while await asyncio.to_thread(_watched, dsn, [first, second, third]) < 3:
                await asyncio.sleep(0.05)
            [pid] = await asyncio.to_thread(_listening, dsn, app)
            with own_connection(dsn) as conn:
                assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
            assert await listener.wait(10), "the asyncio waiter was not told to look again"
            await asyncio.to_thread(q.complete, w, claims[first], result=1)
            while first not in returned and not errors:
                await asyncio.sleep(0.02)
            assert notifier._task is not None and notifier._thread is None  # reconnected on the loop
            assert not await listener.wait(0.2)
            await aq.enqueue("job", queue=lane)  # woken by its NOTIFY on the new connection
            assert await listener.wait(10)
            await asyncio.to_thread(q.complete, w, claims[second], result=2)
            while second not in returned and not errors:
                await asyncio.sleep(0.02)
            return threads
        finally:
            await listener.close()
            await aq.close_async()

    threads = asyncio.run(main())
    assert not errors, errors
    _until(lambda: notifier._thread is not None, "no thread took over when the loop ended")
    q.complete(w, claims[third], result=3)
    for thread in threads:
        thread.join(15)
    assert not errors, errors
    assert sorted(returned) == [first, second, third]
    assert all(status == "completed" for status, _ in returned.values())


def test_a_blocking_wait_on_the_thread_of_the_loop_that_reads_the_connection_is_woken(
        q: leaseq.Queue, named: tuple[leaseq.Queue, str]) -> None:
    """A blocking ``wait`` called inside a coroutine of the loop that reads the connection
    (that loop cannot read while it blocks): a thread takes the connection over, and the
    wait returns when its task ends, not at its timeout."""
    queue, _ = named
    w, claims = _claimed(q, 1)
    [task_id] = claims
    notifier = queue.store.notifier.notifier  # type: ignore[attr-defined]

    def complete_soon() -> None:
        _until(lambda: notifier._thread is not None, "no thread took over", 20)
        time.sleep(0.3)
        q.complete(w, claims[task_id], result="done")

    async def main() -> float:
        aq = leaseq.AsyncQueue(queue)
        listener = await aq.listener(["default"])
        try:
            assert notifier._task is not None and notifier._thread is None
            threading.Thread(target=complete_soon, daemon=True).start()
            began = time.monotonic()
            task = queue.wait(task_id, timeout=60)  # blocks this loop, on purpose
            assert task.status == "completed"
            return time.monotonic() - began
        finally:
            await listener.close()
            await aq.close_async()

    assert asyncio.run(main()) < 20
