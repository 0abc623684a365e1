"""The worker runtime under real leases, on both backends."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq.worker import Registry, WorkerRuntime
from leaseq.worker.transport import worker_port

from .conftest import wait_for


def drain(app: leaseq.App, **options) -> leaseq.worker.WorkerStats:
    options.setdefault("poll_interval", 0.05)
    return app.run_worker(until_idle=True, install_signals=False, **options)


def run_until_finished(app: leaseq.App, start_worker, task_id: int) -> None:
    """Run a worker until the task rests in a final state (retries included)."""
    running = start_worker(concurrency=1)
    wait_for(lambda: app.queue.get(task_id).status in ("completed", "dead", "needs_reconciliation"))
    running.stop()


def test_sync_and_async_handlers_complete(app: leaseq.App) -> None:
    threads: set[str] = set()

    @app.task("add")
    def add(ctx, a: int, b: int) -> dict:
        threads.add(threading.current_thread().name)
        return {"sum": a + b}

    @app.task("mul")
    async def mul(ctx, a: int, b: int) -> dict:
        await asyncio.sleep(0)
        return {"product": a * b, "generation": ctx.generation}

    sums = [add.enqueue(a=i, b=1) for i in range(10)]
    products = [mul.enqueue(a=i, b=2) for i in range(10)]
    stats = drain(app, concurrency=4)
    q = app.queue
    assert stats.completed == 20 and stats.failed == 0 and stats.lost == 0
    assert [q.get(t.id).result for t in sums] == [{"sum": i + 1} for i in range(10)]
    assert [q.get(t.id).result for t in products] == [{"product": 2 * i, "generation": 1} for i in range(10)]
    assert all(name.startswith("leaseq-task") for name in threads), "sync handlers run in the handler pool"


def test_renewal_keeps_a_long_task_alive(app: leaseq.App) -> None:
    @app.task("long", lease_seconds=0.6)
    def long(ctx) -> str:
        ctx.pause(2.4)  # four lease lengths; renewed every 0.2 s, so a loaded machine has room
        return "done"

    task = long.enqueue()
    stats = drain(app, concurrency=1)
    assert stats.completed == 1 and stats.lost == 0
    done = [e for e in app.queue.events(task.id) if e.type == "completed"]
    assert done and done[0].detail["heartbeats"] >= 3
    assert app.queue.get(task.id).claim_generation == 1


class CountingTransport:
    """The real queue, with renew_leases calls counted (not replaced)."""

    def __init__(self, queue: leaseq.Queue):
        self._queue = worker_port(queue)
        self.renew_batches: list[int] = []

    def __getattr__(self, name: str):
        return getattr(self._queue, name)

    async def renew_leases(self, worker, claims):
        self.renew_batches.append(len(claims))
        return await self._queue.renew_leases(worker, claims)


def test_all_leases_renewed_in_one_call_per_tick(app: leaseq.App) -> None:
    @app.task("hold", lease_seconds=0.4)
    def hold(ctx) -> None:
        ctx.pause(1.0)

    for _ in range(8):
        hold.enqueue()
    transport = CountingTransport(app.queue)
    runtime = WorkerRuntime(app, transport, concurrency=8, poll_interval=0.05)
    stats = asyncio.run(runtime.run(until_idle=True))
    assert stats.completed == 8 and stats.lost == 0
    assert max(transport.renew_batches) == 8, "one call renews every held lease"
    # Per-task heartbeats would need ~8x as many calls.
    assert len(transport.renew_batches) <= 15, transport.renew_batches


class LateAnswers(CountingTransport):
    """The real queue, answering completions ``delay`` seconds after they committed (a slow
    link or a loaded service): meanwhile the lease is gone from the database, while the
    worker still holds it, waiting to hear how its write ended."""

    def __init__(self, queue: leaseq.Queue, delay: float):
        super().__init__(queue)
        self.delay = delay

    async def complete_many(self, worker, done):
        completed = await self._queue.complete_many(worker, done)
        await asyncio.sleep(self.delay)
        return completed


class StuckRenewals(LateAnswers):
    """:class:`LateAnswers`, and renewals that hang for ``delay`` seconds before they are
    even sent (a connection gone dead under them)."""

    async def renew_leases(self, worker, claims):
        self.renew_batches.append(len(claims))
        await asyncio.sleep(self.delay)
        return await self._queue.renew_leases(worker, claims)


@pytest.mark.parametrize("transport_class", [LateAnswers, StuckRenewals], ids=["refused", "past_deadline"])
def test_a_lease_whose_outcome_is_being_recorded_is_not_renewed_again(app: leaseq.App, transport_class) -> None:
    """A lease whose handler returned is left to the completer's write, by the deadline the
    write is retried until:

    * refused: once a renewal of it is refused, the renewer sends no more (before, the
      refused lease kept its renewal due in the past: thousands of calls a second, 6,977
      on PostgreSQL, against a queue that was slow already);
    * past_deadline: renewals that hang (each given up after what the lease has left) stop
      once the lease can no longer be alive (before, each renewal sent moved the lease's
      possible end, and a new one went out every 50 ms while threads were free).

    Either way the completion committed before the lease's end, and its late answer says so."""
    @app.task("quick", lease_seconds=0.3)
    def quick(ctx) -> str:
        return "done"

    task = quick.enqueue()
    transport = transport_class(app.queue, delay=1.5)
    stats = asyncio.run(WorkerRuntime(app, transport, concurrency=1, poll_interval=0.05).run(until_idle=True))
    assert stats.completed == 1 and stats.lost == 0
    assert app.queue.get(task.id).status == "completed"
    # A renewal every 0.1 s would be 15: one is sent, and refused or given up.
    assert 1 <= len(transport.renew_batches) <= 2, len(transport.renew_batches)


class StopWhileClaiming(CountingTransport):
    """The real queue; its first claim that leases anything asks the worker to stop before
    it answers (a SIGTERM landing while the claim is on its way)."""

    def __init__(self, queue: leaseq.Queue):
        super().__init__(queue)
        self.on_claim: Any = None

    async def claim(self, worker, **kwargs):
        claims = await self._queue.claim(worker, **kwargs)
        if claims and self.on_claim is not None:
            self.on_claim()
            self.on_claim = None
            await asyncio.sleep(0)  # the stop request lands before the answer does
        return claims


def test_tasks_claimed_as_the_worker_begins_stopping_are_given_back_unstarted(app: leaseq.App) -> None:
    """A stopping worker starts no new work: what its claim in flight brings back is
    released unstarted, with the attempts the claim counted, so a task on its last attempt
    is queued again rather than started, cut off at the end of the grace, and ended."""
    ran: list[int] = []

    @app.task("job", max_attempts=1)
    def job(ctx, n: int) -> int:
        ran.append(n)
        return n

    ids = [job.enqueue(n=n).id for n in range(3)]
    transport = StopWhileClaiming(app.queue)
    runtime = WorkerRuntime(app, transport, concurrency=3, poll_interval=0.05)
    transport.on_claim = runtime.stop
    stats = asyncio.run(runtime.run())
    assert ran == [] and stats.claimed == 0
    for task_id in ids:
        task = app.queue.get(task_id)
        assert (task.status, task.attempts, task.claim_generation) == ("queued", 0, 1), task
        [released] = [e for e in app.queue.events(task_id) if e.type == "lease_released"]
        assert released.detail["started"] is False and "never started" in released.detail["reason"]


def test_cancel_cancels_an_async_handler_and_nothing_is_published(app: leaseq.App, start_worker) -> None:
    started = threading.Event()
    outcome: list[str] = []

    @app.task("agent", lease_seconds=0.3)
    async def agent(ctx) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            outcome.append(f"cancelled, lost={ctx.lost}")
            raise
        return "should never be stored"

    task = agent.enqueue()
    running = start_worker(concurrency=1)
    assert started.wait(10)
    app.queue.cancel(task.id, reason="operator stop", by="test")
    wait_for(lambda: outcome)
    running.stop()
    final = app.queue.get(task.id)
    assert final.status == "cancelled" and final.result is None
    assert outcome == ["cancelled, lost=True"]
    types = [e.type for e in app.queue.events(task.id)]
    assert "lease_lost" in types and "completed" not in types
    assert running.runtime.stats.lost == 1


def test_a_sync_handler_that_ignores_ctx_still_cannot_complete(app: leaseq.App, start_worker) -> None:
    started = threading.Event()
    finished = threading.Event()

    @app.task("stubborn", lease_seconds=0.3)
    def stubborn(ctx) -> str:
        started.set()
        time.sleep(1.0)  # never looks at ctx
        finished.set()
        return "stale result"

    task = stubborn.enqueue()
    running = start_worker(concurrency=1)
    assert started.wait(10)
    app.queue.cancel(task.id, reason="stop it", by="test")
    assert finished.wait(10)
    wait_for(lambda: not running.runtime.held)
    running.stop()
    final = app.queue.get(task.id)
    assert final.status == "cancelled" and final.result is None
    assert running.runtime.stats.completed == 0 and running.runtime.stats.lost == 1


def test_failures_are_routed_by_kind(app: leaseq.App) -> None:
    @app.task("flaky", max_attempts=1)
    def flaky(ctx) -> None:
        raise ValueError("transient 42")

    @app.task("broken")
    def broken(ctx) -> None:
        raise leaseq.Permanent("bad input, retrying will not help")

    @app.task("locked_out")
    def locked_out(ctx) -> None:
        raise leaseq.CredentialMissing("API key revoked")

    a, b, c = flaky.enqueue(), broken.enqueue(), locked_out.enqueue()
    stats = drain(app, concurrency=3)
    q = app.queue
    assert stats.failed == 3
    assert q.get(a.id).status == "dead" and "ValueError: transient 42" in q.get(a.id).last_error
    assert q.get(b.id).status == "dead" and q.get(b.id).attempts == 1
    assert q.get(c.id).status == "blocked"


def test_a_failed_attempt_is_retried_after_backoff(app: leaseq.App, start_worker) -> None:
    attempts: list[int] = []

    @app.task("second_time_lucky")
    def lucky(ctx) -> int:
        attempts.append(ctx.task.attempts)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")
        return ctx.generation

    task = lucky.enqueue()
    running = start_worker(concurrency=1)
    wait_for(lambda: app.queue.get(task.id).status == "completed")
    running.stop()
    assert running.runtime.stats.failed == 1 and running.runtime.stats.completed == 1
    final = app.queue.get(task.id)
    assert final.status == "completed" and final.result == 2 and attempts == [1, 2]
    failed = [e for e in app.queue.events(task.id) if e.type == "failed"][0]
    assert "retry_at" in failed.detail


def test_effect_is_replayed_not_repeated_on_the_next_attempt(app: leaseq.App, start_worker) -> None:
    calls: list[str] = []

    @app.task("notify", effect="idempotent")
    def notify(ctx, user: str) -> dict:
        with ctx.effect("email.send") as fx:
            if not fx.replayed:
                calls.append(fx.idempotency_key)
                fx.record({"message_id": f"m-{user}", "token": fx.generation})
        if ctx.task.attempts == 1:
            raise RuntimeError("crash after the email went out")
        return {"replayed": fx.replayed, "response": fx.response}

    task = notify.enqueue(user="ada")
    run_until_finished(app, start_worker, task.id)
    final = app.queue.get(task.id)
    assert final.status == "completed"
    assert final.result == {"replayed": True, "response": {"message_id": "m-ada", "token": 1}}
    assert calls == [f"{task.id}:{task.idempotency_key}:email.send"], "the email was sent exactly once"


def test_call_effect_runs_once_and_returns_the_recorded_response(app: leaseq.App, start_worker) -> None:
    calls: list[int] = []

    @app.task("charge", effect="idempotent")
    def charge(ctx) -> dict:
        response = ctx.call_effect("payments.charge", lambda fx: calls.append(1) or {"charged": fx.generation})
        if ctx.task.attempts == 1:
            raise RuntimeError("lost the result")
        return response

    task = charge.enqueue()
    run_until_finished(app, start_worker, task.id)
    assert app.queue.get(task.id).result == {"charged": 1} and calls == [1]


def test_off_switch_stops_new_effects_and_new_claims(app: leaseq.App, start_worker) -> None:
    started, go = threading.Event(), threading.Event()
    refused: list[str] = []

    @app.task("tool_user", effect="side_effect")
    def tool_user(ctx) -> str:
        started.set()
        go.wait(10)
        try:
            with ctx.effect("db.write"):
                pass
        except leaseq.QueuePaused as exc:
            refused.append(str(exc))
            raise
        return "wrote"

    task = tool_user.enqueue()
    running = start_worker(concurrency=1)
    assert started.wait(10)
    app.queue.pause("default", by="test")
    go.set()
    wait_for(lambda: refused and app.queue.get(task.id).status == "queued")
    time.sleep(0.3)  # several poll intervals: a paused queue hands out nothing
    assert app.queue.get(task.id).status == "queued"
    assert app.queue.effects(task.id) == []
    app.queue.resume("default", by="test")
    wait_for(lambda: app.queue.get(task.id).status == "completed")
    running.stop()
    assert "paused" in refused[0]


def test_a_worker_claims_only_the_kinds_it_has_handlers_for(app: leaseq.App) -> None:
    """Workers with different handlers can share a queue: a task no handler
    of this worker knows stays queued (untouched) for a worker that does."""
    @app.task("known")
    def known(ctx) -> str:
        return "known"

    other = app.queue.enqueue("handled_elsewhere", {})
    mine = app.queue.enqueue("known", {})
    drain(app, concurrency=1)
    assert app.queue.get(mine.id).status == "completed"
    untouched = app.queue.get(other.id)
    assert (untouched.status, untouched.attempts, untouched.claim_generation) == ("queued", 0, 0)

    elsewhere = leaseq.App(app.queue.store.dsn)
    try:
        @elsewhere.task("handled_elsewhere")
        def handled(ctx) -> str:
            return "elsewhere"

        drain(elsewhere, concurrency=1)
        assert (app.queue.get(other.id).status, app.queue.get(other.id).result) == ("completed", "elsewhere")
    finally:
        elsewhere.queue.close()


def test_notification_wakes_an_idle_worker(app: leaseq.App, start_worker) -> None:
    if app.queue.dialect != "postgres":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite workers poll")
    if not app.queue.capabilities.listen_notify:
        pytest.skip("this DSN declares that nothing notifies (a transaction-mode pooler with no "
                    "LEASEQ_LISTEN_DSN, or the portable mode): its workers poll")
    done = threading.Event()

    @app.task("ping")
    def ping(ctx) -> None:
        done.set()

    start_worker(concurrency=1, poll_interval=30)
    time.sleep(0.3)  # the worker has made its first (empty) claim and is waiting
    ping.enqueue()
    assert done.wait(5), "an idle worker must wake on NOTIFY, not after its 30 s poll"


def test_enqueue_async(app: leaseq.App) -> None:
    @app.task("hello")
    async def hello(ctx, name: str) -> str:
        return f"hello {name}"

    task = asyncio.run(hello.enqueue_async(name="world"))
    drain(app, concurrency=1)
    assert app.queue.get(task.id).result == "hello world"


def test_effects_carry_a_signed_action_token_scoped_to_one_action(dsn: str) -> None:
    from leaseq.fencing.errors import InvalidActionToken
    from leaseq.fencing.tokens import ActionSigner

    signer = ActionSigner({"k1": b"s" * 32}, "k1")
    app = leaseq.App(dsn, signer=signer)
    seen: list[tuple[str, int, str]] = []

    @app.task("send", effect="idempotent")
    def send(ctx) -> None:
        with ctx.effect("email.send") as fx:
            seen.append((fx.token, fx.generation, fx.idempotency_key))

    task = send.enqueue()
    drain(app, concurrency=1)
    app.queue.close()
    [(token, generation, key)] = seen
    claims = signer.verify(token, action="email.send", idempotency_key=key)
    assert (claims.task_id, claims.generation) == (task.id, generation) == (task.id, 1)
    with pytest.raises(InvalidActionToken):
        signer.verify(token, action="payments.charge")  # scoped to one action
    with pytest.raises(InvalidActionToken):
        ActionSigner({"k1": b"t" * 32}, "k1").verify(token)  # not from this queue's key


def test_a_stop_while_the_transport_is_still_connecting_raises_nothing_on_the_loop(caplog):
    """stop() before the transport is open (connect deferred, the queue out of reach):
    the stop request must not read the capabilities of a transport not bound yet."""
    registry = Registry("deferred")
    registry.add(leaseq.App(name="deferred").task("job")(lambda ctx: None))
    attempts = threading.Event()

    def unreachable() -> Any:
        attempts.set()
        raise leaseq.BackendUnavailable("the queue is out of reach")

    runtime = WorkerRuntime(registry, connect=unreachable, poll_interval=0.05)
    thread = threading.Thread(target=lambda: asyncio.run(runtime.run()), daemon=True)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        thread.start()
        assert attempts.wait(10)
        runtime.stop()
        thread.join(10)
    assert not thread.is_alive() and runtime.worker is None
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


class BrokenClaims(CountingTransport):
    """The real queue, whose claim raises ``error`` from its second call on: a bug of a
    transport (or of what it calls), or one of the queue's answers."""

    def __init__(self, queue: leaseq.Queue, error: BaseException):
        super().__init__(queue)
        self.error, self.claims = error, 0

    async def claim(self, worker, **kwargs):
        self.claims += 1
        if self.claims > 1:
            raise self.error
        return await self._queue.claim(worker, **kwargs)


@pytest.mark.parametrize("error", [TypeError("unsupported operand"), leaseq.NotFound("queue went away")],
                         ids=["a bug", "an answer"])
def test_a_claim_that_raises_what_is_not_transient_stops_the_worker(app: leaseq.App, error) -> None:
    """Only "out of reach for now" (leaseq.core.errors.is_transient) is retried: a TypeError
    from a claim is a bug, and a refusal is an answer; either stops the worker at once, and
    is raised from run(), rather than being retried forever."""
    @app.task("job")
    def job(ctx) -> None:
        return None

    job.enqueue()
    transport = BrokenClaims(app.queue, error)
    runtime = WorkerRuntime(app, transport, concurrency=1, poll_interval=0.05)
    with pytest.raises(type(error)):
        asyncio.run(asyncio.wait_for(runtime.run(), 20))
    assert transport.claims == 2 and runtime.stats.transient_errors == 0


def test_a_claim_out_of_reach_for_now_is_retried(app: leaseq.App) -> None:
    @app.task("job")
    def job(ctx) -> None:
        return None

    transport = BrokenClaims(app.queue, leaseq.BackendUnavailable("restarting"))
    runtime = WorkerRuntime(app, transport, concurrency=1, poll_interval=0.05)

    async def run() -> None:
        running = asyncio.ensure_future(runtime.run())
        while runtime.stats.transient_errors < 2:
            await asyncio.sleep(0.02)
        runtime.stop()
        await asyncio.wait_for(running, 20)

    asyncio.run(run())
    assert transport.claims >= 3
