"""The worker runtime and a task's budgets: Retry from a handler, a kind's
RetryPolicy, and attempt timeouts (async handlers cancelled, sync ones told
through ctx), on both backends.

The machine running these is shared and loaded: every bound on elapsed time
here is generous, and waits poll a condition rather than sleep a fixed time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime

import pytest

import leaseq
from leaseq.service.wire import parse_time

from .conftest import wait_for


def _events(app: leaseq.App, task_id: int) -> list[leaseq.Event]:
    return app.queue.events(task_id)


def test_a_handler_that_raises_retry_runs_again_after_the_delay(app: leaseq.App, start_worker) -> None:
    calls: list[int] = []

    @app.task("call.llm", max_attempts=1)  # one attempt: a Retry must not use it up
    async def call_llm(ctx, prompt: str) -> str:
        calls.append(ctx.generation)
        if len(calls) == 1:
            raise leaseq.Retry(after=0.5, reason="429 Too Many Requests, Retry-After: 0.5")
        return f"answer to {prompt}"

    task = call_llm.enqueue(prompt="hi")
    running = start_worker()
    wait_for(lambda: app.queue.get(task.id).status == "completed", timeout=20)
    running.stop()
    done = app.queue.get(task.id)
    assert (done.result, done.attempts, done.snoozes) == ("answer to hi", 1, 1)
    events = _events(app, task.id)
    [asked] = [e for e in events if e.type == "retry_requested"]
    assert asked.detail["reason"].startswith("429") and asked.detail["after"] == 0.5
    reclaimed = [e for e in events if e.type == "claimed"][1]
    # By the database's clock: the retry time is half a second after the retry
    # statement read the clock (the event, written just after it, reads it again)
    # and the claim came no earlier.
    retry_at = datetime.fromisoformat(asked.detail["retry_at"])
    assert 0.4 <= (retry_at - asked.at).total_seconds() <= 0.5
    assert reclaimed.at >= retry_at
    assert (running.runtime.stats.snoozed, running.runtime.stats.failed) == (1, 0)


def test_a_retry_policy_gives_up_on_its_exceptions_and_spaces_its_retries(app: leaseq.App, start_worker) -> None:
    policy = leaseq.RetryPolicy(base=0.3, cap=0.3, jitter=0, retry_on=(TimeoutError, ConnectionError),
                                give_up_on=(ConnectionRefusedError,))

    @app.task("fetch", retry=policy, max_attempts=5)
    def fetch(ctx, mode: str) -> str:
        if mode == "flaky" and ctx.task.attempts == 1:
            raise TimeoutError("upstream slow")
        if mode == "refused":
            raise ConnectionRefusedError("no such host")  # a ConnectionError, but given up on
        if mode == "other":
            raise KeyError("not retried: not in retry_on")
        return mode

    flaky, refused, other = (fetch.enqueue(mode=m) for m in ("flaky", "refused", "other"))
    running = start_worker(concurrency=3)
    wait_for(lambda: [app.queue.get(t.id).status for t in (flaky, refused, other)] == ["completed", "dead", "dead"],
             timeout=20)
    running.stop()
    for task in (refused, other):  # dead at once, with attempts to spare
        ended = app.queue.get(task.id)
        assert (ended.status, ended.attempts) == ("dead", 1), ended
    [failed] = [e for e in _events(app, flaky.id) if e.type == "failed"]
    waited = (parse_time(failed.detail["retry_at"]) - failed.at).total_seconds()
    assert 0.25 <= waited <= 0.35  # the policy's delay (no jitter), not the queue's 1 s - 1 h backoff


def test_an_async_handler_past_its_timeout_is_cancelled_and_its_lease_given_up(app: leaseq.App,
                                                                              start_worker) -> None:
    cancelled = threading.Event()

    @app.task("loop", timeout=1, max_attempts=1)
    async def runaway(ctx) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    started = time.monotonic()
    task = runaway.enqueue()
    assert task.timeout_seconds == 1
    running = start_worker()
    wait_for(lambda: app.queue.get(task.id).status == "dead", timeout=15)
    elapsed = time.monotonic() - started
    running.stop()
    assert cancelled.is_set()
    assert elapsed < 8, elapsed  # ~1 s of timeout; generous for a loaded machine, far below the 10 s sleep
    [released] = [e for e in _events(app, task.id) if e.type == "lease_released"]
    assert (released.detail["reason"], released.detail["routed_to"]) == ("timeout", "dead")
    assert running.runtime.stats.timed_out == 1 and running.runtime.stats.completed == 0


def test_a_sync_handler_past_its_timeout_sees_ctx_lost_and_its_result_is_dropped(app: leaseq.App,
                                                                                start_worker) -> None:
    saw = {}

    @app.task("crunch", timeout=1, max_attempts=2)
    def crunch(ctx) -> str:
        if ctx.task.attempts == 1:
            try:
                ctx.pause(10)  # wakes at once when the attempt is stopped
            except leaseq.LeaseLost as exc:
                saw["lost"], saw["reason"] = ctx.lost, exc.reason
            return "too late"  # not published: the lease was given up
        return "in time"

    started = time.monotonic()
    task = app.queue.enqueue("crunch")  # enqueued without a timeout: the kind's declared one applies
    running = start_worker()
    wait_for(lambda: app.queue.get(task.id).status == "completed", timeout=15)
    elapsed = time.monotonic() - started
    running.stop()
    assert saw["lost"] is True and "timeout" in saw["reason"]
    assert elapsed < 8, elapsed
    done = app.queue.get(task.id)
    assert (done.result, done.attempts) == ("in time", 2)
    types = [e.type for e in _events(app, task.id)]
    assert types.count("lease_released") == 1 and types.count("completed") == 1


def test_a_side_effect_task_past_its_timeout_with_an_open_intent_goes_to_reconciliation(
        app: leaseq.App, start_worker) -> None:
    @app.task("pay", effect="side_effect", timeout=1)
    async def pay(ctx, order: int) -> None:
        async with ctx.effect("orders.pay", key=f"pay-{order}"):
            await asyncio.sleep(10)  # the call hangs: did it go through?

    task = pay.enqueue(order=7)
    running = start_worker()
    wait_for(lambda: app.queue.get(task.id).status == "needs_reconciliation", timeout=15)
    running.stop()
    [released] = [e for e in _events(app, task.id) if e.type == "lease_released"]
    assert released.detail["reason"] == "timeout" and released.detail["open_intents"] == 1


def test_a_handler_that_returns_in_time_is_not_timed_out(app: leaseq.App, start_worker) -> None:
    @app.task("quick", timeout=5)
    async def quick(ctx) -> str:
        return "ok"

    task = quick.enqueue()
    running = start_worker()
    wait_for(lambda: app.queue.get(task.id).status == "completed")
    running.stop()
    assert running.runtime.stats.timed_out == 0


def test_task_declarations_check_their_budgets(app: leaseq.App) -> None:
    from datetime import datetime, timedelta, timezone

    for options, field in [({"timeout": 0}, "timeout"), ({"retry": {"base": 1}}, "retry"),
                           ({"deadline": datetime.now(timezone.utc)}, "deadline"), ({"deadline": 5}, "deadline")]:
        with pytest.raises(leaseq.InvalidInput) as info:
            app.task("k", **options)(lambda ctx: None)
        assert info.value.field == field

    @app.task("soon", deadline=timedelta(minutes=5), timeout=30)
    def soon(ctx) -> None: ...

    task = soon.enqueue()
    assert task.timeout_seconds == 30 and abs((task.deadline_at - task.created_at).total_seconds() - 300) < 1
    override = soon.options(timeout=2, deadline=timedelta(seconds=60)).enqueue()
    assert override.timeout_seconds == 2 and abs((override.deadline_at - override.created_at).total_seconds() - 60) < 1
