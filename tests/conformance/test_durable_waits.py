"""Durable waits on every transport (sync, async, HTTP) and both backends: a sleep or a
signal wait ends the attempt under the lease, the task waits holding no lease, and the
next attempt replays the wait from the ledger."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import leaseq
from leaseq.core.errors import Suspended
from leaseq.worker.context import TaskContext

from .support import snapshot
from .test_transports import transport  # noqa: F401  (the fixture: sync, async and HTTP transports)

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def _attempt(t: Any, w: leaseq.Worker) -> TaskContext:
    [claim] = t.claim(w)
    return TaskContext(t, w, claim, LOG)


def _until_claimed(t: Any, w: leaseq.Worker, timeout: float = 10.0) -> TaskContext:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        claims = t.claim(w)
        if claims:
            return TaskContext(t, w, claims[0], LOG)
        time.sleep(0.05)
    raise AssertionError("nothing became claimable")


def test_a_sleep_ends_the_attempt_and_the_next_one_resumes_after_it(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="nap-1", max_attempts=1)
    ran: list[str] = []

    def handler(ctx: TaskContext) -> str:
        ran.append("before")
        ctx.sleep(0.5)
        ran.append("after")
        return "done"

    ctx = _attempt(transport, w)
    with pytest.raises(Suspended) as ended:
        handler(ctx)
    assert ended.value.waiting_for == "its sleep" and ctx.lost and ctx.suspended is not None
    waiting = q.get(task.id)
    assert (waiting.status, waiting.lease_owner, waiting.lease_expires_at, waiting.attempts) == \
        ("waiting", None, None, 0)  # no lease, and the attempt was given back
    assert waiting.wake_at is not None and waiting.wake_at > q.now()
    assert transport.claim(w) == []  # not before its wake time
    [entry] = q.effects(task.id)
    assert (entry.idempotency_key, entry.action, entry.status, entry.effect) == \
        ("nap-1:sleep:0", "leaseq.sleep", "done", "read_only")
    assert abs(entry.response["until"] - waiting.wake_at.timestamp()) < 1e-3
    again = _until_claimed(transport, w)
    assert again.generation == ctx.generation + 1 and q.get(task.id).attempts == 1
    result = handler(again)  # from the top: the sleep is over, the handler goes on after it
    transport.complete(w, again.claim, result)
    assert ran == ["before", "before", "after"] and q.get(task.id).status == "completed"
    types = [e.type for e in q.events(task.id)]
    assert types == ["enqueued", "claimed", "suspended", "woke", "claimed", "completed"]
    suspended = [e for e in q.events(task.id) if e.type == "suspended"][0]
    assert suspended.detail["waiting_for"] == "sleep" and suspended.detail["key"] == "nap-1:sleep:0"
    assert suspended.detail["until"] == waiting.wake_at.isoformat()


def test_sleep_until_and_async_handlers(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="nap-2")

    async def handler(ctx: TaskContext) -> int:
        await ctx.sleep(0)  # over at once: recorded, no suspension
        await ctx.sleep_until(datetime.now(timezone.utc) + timedelta(seconds=0.4))
        return 7

    ctx = _attempt(transport, w)
    ctx.handler_is_async = True
    with pytest.raises(Suspended):
        asyncio.run(handler(ctx))
    assert q.get(task.id).status == "waiting"
    again = _until_claimed(transport, w)
    again.handler_is_async = True
    assert asyncio.run(handler(again)) == 7
    transport.complete(w, again.claim, 7)
    assert [e.idempotency_key for e in q.effects(task.id)] == ["nap-2:sleep:0", "nap-2:sleep:1"]


def test_a_signal_sent_before_the_wait_is_kept_and_consumed_once(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="sig-1")
    first = q.signal(task.id, "approved", {"by": "ann"}, by="ann")
    second = q.signal(task.id, "approved", {"by": "bob"}, by="bob")  # sent twice
    assert first["woke"] is False and first["sent_by"] == "ann"
    ctx = _attempt(transport, w)
    assert ctx.wait_for_signal("approved") == {"by": "ann"}  # the first, kept from before the wait
    transport.fail(w, ctx.claim, "crashed after the wait", delay=0)
    again = _attempt(transport, w)
    assert again.wait_for_signal("approved") == {"by": "ann"}  # replayed from the ledger, not consumed again
    assert again.wait_for_signal("approved") == {"by": "bob"}  # the next wait takes the next signal
    transport.complete(w, again.claim, None)
    signals = q.signals(task.id)
    assert [(s["id"], s["consumed_key"]) for s in signals] == [(first["id"], "sig-1:signal:approved:0"),
                                                                (second["id"], "sig-1:signal:approved:1")]
    received = [e for e in q.events(task.id) if e.type == "signal_received"]
    assert [e.detail["sent_by"] for e in received] == ["ann", "bob"]  # each consumed once
    assert [e.detail["by"] for e in q.events(task.id) if e.type == "signal_sent"] == ["ann", "bob"]


def test_a_signal_wakes_a_task_waiting_for_it_at_once(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="sig-2")
    ctx = _attempt(transport, w)
    with pytest.raises(Suspended):
        ctx.wait_for_signal("go")
    waiting = q.get(task.id)
    assert (waiting.status, waiting.wait_signal, waiting.wake_at, waiting.lease_owner) == \
        ("waiting", "go", None, None)
    q.signal(task.id, "other")  # another name: still waiting
    assert q.get(task.id).status == "waiting" and transport.claim(w) == []
    sent = q.signal(task.id, "go", [1, 2], by="ops")
    assert sent["woke"] is True and q.get(task.id).status == "queued"
    again = _attempt(transport, w)
    assert again.wait_for_signal("go") == [1, 2]
    transport.complete(w, again.claim, None)
    woke = [e for e in q.events(task.id) if e.type == "woke"]
    assert [(e.detail["reason"], e.detail["signal"], e.detail["by"]) for e in woke] == [("signal", "go", "ops")]


def test_a_signal_wait_times_out(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="sig-3")
    ctx = _attempt(transport, w)
    with pytest.raises(Suspended):
        ctx.wait_for_signal("answer", timeout=0.3)
    assert q.get(task.id).wake_at is not None
    again = _until_claimed(transport, w)
    with pytest.raises(leaseq.WaitTimedOut, match="'answer'"):
        again.wait_for_signal("answer", timeout=0.3)
    transport.fail(w, again.claim, "no answer", delay=0)
    third = _attempt(transport, w)  # the timeout is recorded: raised again, not waited anew
    assert third.wait_for_signal("answer", timeout=0.3, default="no") == "no"
    q.signal(task.id, "answer", "late")  # too late for that wait: kept for a next one
    assert third.wait_for_signal("answer") == "late"
    transport.complete(w, third.claim, None)
    assert [e.detail["reason"] for e in q.events(task.id) if e.type == "woke"] == ["timeout"]


def test_waits_spend_no_attempt_and_are_no_failure(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="naps", max_attempts=1)

    def handler(ctx: TaskContext) -> int:
        for _ in range(3):
            ctx.sleep(0.05)
        return 3

    for _ in range(3):
        ctx = _until_claimed(transport, w)
        with pytest.raises(Suspended):
            handler(ctx)
    last = _until_claimed(transport, w)
    transport.complete(w, last.claim, handler(last))
    done = q.get(task.id)
    assert (done.status, done.attempts, done.error_streak, done.last_error) == ("completed", 1, 0, None)


def test_a_waiting_task_can_be_cancelled_and_expiry_leaves_it_alone(q: leaseq.Queue, dsn: str,
                                                                    transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    sleeper = q.enqueue("agent", {}, idempotency_key="long-nap")
    waiter = q.enqueue("agent", {}, idempotency_key="long-wait")
    for _ in range(2):
        ctx = _attempt(transport, w)
        with pytest.raises(Suspended):
            ctx.sleep(3600) if ctx.task_id == sleeper.id else ctx.wait_for_signal("go")
    before = snapshot(dsn)
    assert q.sweep() == 0 and snapshot(dsn) == before  # no lease to expire, nothing due
    q.cancel(sleeper.id, "not needed", by="ops")
    assert q.get(sleeper.id).status == "cancelled"
    with pytest.raises(leaseq.InvalidTransition, match="cancelled"):
        q.signal(sleeper.id, "go")
    q.cancel(waiter.id, "not needed", by="ops")
    assert transport.claim(w) == []


def test_a_deadline_that_passes_while_the_task_waits_ends_it_and_says_so(q: leaseq.Queue,
                                                                        transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="nap-past-deadline", deadline=timedelta(seconds=0.5))
    ctx = _attempt(transport, w)
    with pytest.raises(Suspended):
        ctx.sleep(3600)
    deadline_at = q.get(task.id).deadline_at
    while q.now() <= deadline_at:
        time.sleep(0.05)
    q.sweep()
    ended = q.get(task.id)
    assert (ended.status, ended.last_error) == ("expired", "deadline passed while the task waited")
    [event] = [e for e in q.events(task.id) if e.type == "deadline_passed"]
    assert (event.detail["previous_status"], event.detail["reason"]) == ("waiting", ended.last_error)


def test_bad_waits_name_their_field(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    q.enqueue("agent", {})
    [claim] = transport.claim(w)
    with pytest.raises(leaseq.InvalidInput) as bad:
        transport.sleep(w, claim, "k", seconds=-1)
    assert bad.value.field == "seconds"
    with pytest.raises(leaseq.InvalidInput) as bad:
        transport.wait_signal(w, claim, "k", "", timeout=1)
    assert bad.value.field == "name"
    with pytest.raises(leaseq.InvalidInput) as bad:
        q.signal(claim.task_id, "go", payload=object())
    assert bad.value.field == "payload"
    with pytest.raises(leaseq.NotFound):
        q.signal(10**9, "go")
