"""Task progress streams on every transport (sync, async, HTTP) and both backends: a handler's
ctx.emit appends under the lease, each attempt's entries begin with a reset entry, a stale
attempt cannot append, durable items replay from the ledger without being appended again, and
readers (Queue, AsyncQueue, RemoteQueue) resume after a cursor and follow until the task settles."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq.worker.context import TaskContext

from .support import run_out, snapshot
from .test_transports import over, transport  # noqa: F401  (the fixture: sync, async and HTTP transports)

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def _attempt(t: Any, w: leaseq.Worker) -> TaskContext:
    [claim] = t.claim(w)
    return TaskContext(t, w, claim, LOG)


def _shape(entries: list[leaseq.StreamItem]) -> list[tuple[Any, ...]]:
    return [(e.seq, e.generation, e.type, e.item, e.durable) for e in entries]


def test_each_attempt_begins_with_a_reset_and_the_stream_keeps_commit_order(q: leaseq.Queue,
                                                                            transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="story-1")
    first = _attempt(transport, w)
    assert first.emit({"step": "search"}) == 2  # after the attempt's reset, entry 1
    assert first.emit("half way") == 3
    transport.fail(w, first.claim, "crashed", delay=0)
    second = _attempt(transport, w)
    assert second.emit({"step": "search"}) == 5
    assert second.emit(None) == 6  # any JSON, null too
    transport.complete(w, second.claim, "done")
    entries = list(q.stream(task.id))  # the task has completed: following ends at once
    assert _shape(entries) == [(1, 1, "reset", None, False), (2, 1, "item", {"step": "search"}, False),
                               (3, 1, "item", "half way", False), (4, 2, "reset", None, False),
                               (5, 2, "item", {"step": "search"}, False), (6, 2, "item", None, False)]
    assert all(e.task_id == task.id and e.at is not None for e in entries) and entries[3].reset
    assert _shape(list(q.stream(task.id, after=3))) == _shape(entries[3:])  # resumed after a cursor
    assert list(q.stream(task.id, after=6)) == []
    started = [(e.generation, e.detail) for e in q.events(task.id) if e.type == "stream_started"]
    assert started == [(1, {"seq": 1}), (2, {"seq": 4})]  # the trail says where each attempt's entries begin
    stats = q.stream_stats(task.id)
    assert (stats["items"], stats["durable"], stats["last_seq"]) == (4, 0, 6)
    assert [(a["generation"], a["items"], a["first_seq"], a["last_seq"]) for a in stats["attempts"]] == \
        [(1, 2, 1, 3), (2, 2, 4, 6)]


def test_an_attempt_that_lost_its_lease_cannot_emit(q: leaseq.Queue, dsn: str, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="fenced-1")
    stale = _attempt(transport, w)
    stale.emit("from the first attempt")
    run_out(q, w, stale.claim)  # its lease ran out: the next claim is generation 2
    fresh = _attempt(transport, w)
    assert fresh.generation == stale.generation + 1
    fresh.emit("from the second attempt")
    before = snapshot(dsn)
    with pytest.raises(leaseq.LeaseLost):
        transport.emit(w, stale.claim, "written late by the stale attempt")
    with pytest.raises(leaseq.LeaseLost):
        stale.emit("again, through its context", durable=True)
    assert stale.lost and snapshot(dsn) == before  # refused: nothing written, the stale context stops
    with pytest.raises(leaseq.LeaseLost):
        stale.emit("once it knows, it does not even ask")
    transport.complete(w, fresh.claim, None)
    with pytest.raises(leaseq.LeaseLost):  # a completed task's attempt appends nothing either
        transport.emit(w, fresh.claim, "after the end")
    assert [(e.generation, e.item) for e in q.stream(task.id) if not e.reset] == \
        [(1, "from the first attempt"), (2, "from the second attempt")]


def test_durable_items_replay_from_the_ledger_without_being_emitted_again(q: leaseq.Queue,
                                                                         transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="plan-7")
    crash = threading.Event()

    def handler(ctx: TaskContext) -> str:
        plan = ctx.emit({"plan": ["search", "write"]}, durable=True)
        ctx.emit("searching")
        if crash.is_set():
            raise RuntimeError("the worker died here")
        ctx.emit({"found": 3}, durable=True)
        return f"plan at {plan}"

    crash.set()
    first = _attempt(transport, w)
    with pytest.raises(RuntimeError):
        handler(first)
    transport.fail(w, first.claim, "crashed", delay=0)
    crash.clear()
    second = _attempt(transport, w)
    assert handler(second) == "plan at 2"  # the durable emit replayed: the cursor it was first given
    transport.complete(w, second.claim, None)
    # what a reader sees: the durable plan once (in the attempt that first emitted it), each
    # attempt's reset, and the second attempt's own items after its reset
    assert _shape(list(q.stream(task.id))) == [
        (1, 1, "reset", None, False), (2, 1, "item", {"plan": ["search", "write"]}, True),
        (3, 1, "item", "searching", False),
        (4, 2, "reset", None, False), (5, 2, "item", "searching", False), (6, 2, "item", {"found": 3}, True)]
    ledger = [(fx.idempotency_key, fx.action, fx.status, fx.response) for fx in q.effects(task.id)]
    assert ledger == [("plan-7:emit:0", "leaseq.emit", "done",
                       {"seq": 2, "generation": 1, "item": {"plan": ["search", "write"]}}),
                      ("plan-7:emit:1", "leaseq.emit", "done", {"seq": 6, "generation": 2, "item": {"found": 3}})]
    assert q.stream_stats(task.id)["durable"] == 2


def test_a_durable_emit_replayed_within_an_attempt_appends_nothing(q: leaseq.Queue,
                                                                   transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="again-1")
    [claim] = transport.claim(w)
    first = transport.emit(w, claim, {"n": 1}, key="again-1:emit:0")
    assert first == {"seq": 2, "generation": claim.generation, "replayed": False}
    assert transport.emit(w, claim, {"n": 1}, key="again-1:emit:0") == {**first, "replayed": True}
    transport.complete(w, claim, None)
    assert [e.seq for e in q.stream(task.id)] == [1, 2]


def test_async_handlers_await_their_emits(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="async-1")

    async def handler(ctx: TaskContext) -> int:
        await ctx.emit("one")
        return int(await ctx.emit({"two": 2}, durable=True))

    ctx = _attempt(transport, w)
    ctx.handler_is_async = True
    assert asyncio.run(handler(ctx)) == 3
    transport.complete(w, ctx.claim, None)
    assert [(e.type, e.item, e.durable) for e in q.stream(task.id)] == \
        [("reset", None, False), ("item", "one", False), ("item", {"two": 2}, True)]


@pytest.mark.parametrize("reader", ["sync", "async", "http"])
def test_a_reader_follows_until_the_task_settles(q: leaseq.Queue, reader: str) -> None:
    w = q.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="follow-1")
    [claim] = q.claim(w)
    q.emit(w, claim, "before the reader came")
    got: list[leaseq.StreamItem] = []
    seen = threading.Condition()
    errors: list[BaseException] = []

    def follow(source: Any) -> None:
        try:
            if reader == "async":
                async def run() -> None:
                    async for entry in leaseq.AsyncQueue(q).stream(task.id, after=1, timeout=60):
                        with seen:
                            got.append(entry)
                            seen.notify_all()
                asyncio.run(run())
                return
            for entry in source.stream(task.id, after=1, timeout=60):
                with seen:
                    got.append(entry)
                    seen.notify_all()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def until(n: int) -> None:
        with seen:
            assert seen.wait_for(lambda: len(got) >= n or errors, timeout=30), got
        assert not errors, errors

    with over("http" if reader == "http" else "sync", q, "viewer") as source:
        if reader == "http":
            # the viewer token may read payloads for this test (a plain viewer gets them redacted)
            source = leaseq.client.RemoteQueue(source.url, leaseq.auth.create_token(
                q, name="reader", role="viewer", created_by="test", read_payloads=True)[0], timeout=10)
        thread = threading.Thread(target=follow, args=(source,))
        thread.start()
        until(1)  # what was there
        q.emit(w, claim, {"n": 1})  # each new entry reaches the reader while it follows
        until(2)
        q.emit(w, claim, {"n": 2})
        until(3)
        q.complete(w, claim, "done")  # the task settled: the reader reads what is left and stops
        thread.join(30)
        assert not thread.is_alive() and not errors, errors
        if reader == "http":
            source.close()
    assert [(e.seq, e.item) for e in got] == [(2, "before the reader came"), (3, {"n": 1}), (4, {"n": 2})]


def test_following_ends_at_its_timeout_and_not_following_reads_what_is_there(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    task = q.enqueue("agent", {})
    [claim] = q.claim(w)
    q.emit(w, claim, 1)
    assert [e.item for e in q.stream(task.id, follow=False)] == [None, 1]  # the reset, the item: then it ends
    started = time.monotonic()
    assert [e.item for e in q.stream(task.id, after=2, timeout=0.3)] == []  # running: it follows, then its time is up
    assert 0.25 <= time.monotonic() - started < 10
    q.complete(w, claim, None)


def test_many_entries_are_read_page_after_page(q: leaseq.Queue) -> None:
    from leaseq.engine.streams import PAGE

    w = q.register_worker("a")
    task = q.enqueue("agent", {})
    [claim] = q.claim(w)
    for i in range(PAGE + 5):
        q.emit(w, claim, i)
    q.complete(w, claim, None)
    assert [e.item for e in q.stream(task.id)][1:] == list(range(PAGE + 5))
    assert [e.seq for e in q.stream(task.id, follow=False, after=PAGE)] == list(range(PAGE + 1, PAGE + 7))


def test_bad_emits_and_reads_name_their_field_and_change_nothing(q: leaseq.Queue, dsn: str,
                                                                 transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {})
    [claim] = transport.claim(w)
    before = snapshot(dsn)
    for item, problem in ((object(), "JSON"), ({"text": "x" * 70_000}, "byte limit"), ("nul \x00", "NUL")):
        with pytest.raises(leaseq.InvalidInput, match=problem) as bad:
            transport.emit(w, claim, item)
        assert bad.value.field == "item"
    with pytest.raises(leaseq.InvalidInput) as bad:
        transport.emit(w, claim, 1, key="")
    assert bad.value.field == "key"
    ctx = TaskContext(transport, w, claim, LOG)
    with pytest.raises(leaseq.InvalidInput) as bad:
        ctx.emit(1, durable="yes")  # type: ignore[arg-type]
    assert bad.value.field == "durable"
    assert snapshot(dsn) == before
    for field, options in (("after", {"after": -1}), ("after", {"after": "3"}), ("after", {"after": True}),
                           ("follow", {"follow": "no"}), ("timeout", {"timeout": -1})):
        with pytest.raises(leaseq.InvalidInput) as bad:
            q.stream(task.id, **options)  # refused at the call, before any iteration
        assert bad.value.field == field, options
    with pytest.raises(leaseq.InvalidInput) as bad:
        q.stream("x")  # type: ignore[arg-type]
    assert bad.value.field == "task_id"
    with pytest.raises(leaseq.NotFound):
        list(q.stream(10**9))
    with pytest.raises(leaseq.NotFound):
        q.stream_stats(10**9)
    transport.complete(w, claim, None)


def test_concurrent_emits_and_a_following_reader_agree_on_one_order(dsn: str, q: leaseq.Queue) -> None:
    """Writers in threads append to one attempt's stream at once while a reader follows it: the
    cursors are 1..N with no gap and no repeat, each writer's items keep its own order, and the
    reader, which resumes after the last cursor it read each time, gets every entry once (the
    appends of one task are written one after the other: seq order is commit order)."""
    w = q.register_worker("a")
    task = q.enqueue("agent", {})
    [claim] = q.claim(w, lease_seconds=120)
    writers, each = 4, 25
    got: list[leaseq.StreamItem] = []
    reader = threading.Thread(target=lambda: got.extend(q.stream(task.id, timeout=120)))
    reader.start()
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        own = leaseq.connect(dsn)  # a connection (a SQLite file handle, a pool) of its own
        try:
            barrier.wait(30)
            for i in range(each):
                own.emit(w, claim, {"writer": n, "i": i})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    q.complete(w, claim, None)
    reader.join(120)
    assert not reader.is_alive()
    stored = list(q.stream(task.id))
    assert [e.seq for e in stored] == list(range(1, writers * each + 2))  # the reset, then every item
    assert [e.type for e in stored].count("reset") == 1
    for n in range(writers):
        assert [e.item["i"] for e in stored if not e.reset and e.item["writer"] == n] == list(range(each))
    assert _shape(got) == _shape(stored)  # the live reader saw each entry once, in order
