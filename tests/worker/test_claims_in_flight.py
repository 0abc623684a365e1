"""A second claim in flight: the slots that free while the claim loop's own claim is on its way.

A real queue whose claims are slowed down on the way back (as over a slow
network), handlers of staggered lengths, and the worker really running: its
slots free one by one while a claim is out, and a second claim takes them.
Never more than two claims at once, never more handlers than the
concurrency, and every task completed once. Where the backend runs one
write at a time (SQLite) there is no second claim: it would only wait.
"""

from __future__ import annotations

import asyncio
import threading
import time

import leaseq
from leaseq.worker.transport import worker_port

CONCURRENCY = 4
#: how long each claim's answer is held on its way back: longer than any handler here
CLAIM_DELAY = 0.4


class SlowClaims:
    """The real queue; each claim's answer comes back ``CLAIM_DELAY`` late. Counts claims in flight."""

    def __init__(self, queue: leaseq.Queue):
        self._queue = worker_port(queue)
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0
        self.asked = 0          # slots the claims in flight asked for
        self.running = 0        # handlers running now (the test's handlers count themselves)
        self.overcommitted: list[tuple[int, int]] = []

    def __getattr__(self, name):
        return getattr(self._queue, name)

    def _enter(self, limit: int) -> None:
        with self.lock:
            self.in_flight += 1
            self.asked += limit
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            if self.asked + self.running > CONCURRENCY:
                self.overcommitted.append((self.asked, self.running))

    def _leave(self, limit: int) -> None:
        with self.lock:
            self.in_flight -= 1
            self.asked -= limit

    async def claim(self, worker, **options):
        self._enter(options["limit"])
        try:
            claims = await self._queue.claim(worker, **options)
            await asyncio.sleep(CLAIM_DELAY)
            return claims
        finally:
            self._leave(options["limit"])


def test_slots_freed_during_a_claim_are_claimed_beside_it(app: leaseq.App) -> None:
    transport = SlowClaims(app.queue)
    most_running = [0]

    @app.task("agent")
    async def agent(ctx, n: int) -> int:
        with transport.lock:
            transport.running += 1
            most_running[0] = max(most_running[0], transport.running)
        try:
            await asyncio.sleep(0.05 * (n % CONCURRENCY + 1))  # staggered: slots free one by one
        finally:
            with transport.lock:
                transport.running -= 1
        return n

    tasks = [agent.enqueue(n=i) for i in range(16)]
    stats = app.run_worker(transport=transport, until_idle=True, install_signals=False,
                           concurrency=CONCURRENCY, poll_interval=0.05)
    assert stats.completed == 16 and stats.failed == 0 and stats.lost == 0
    assert all(app.queue.get(t.id).result == i and app.queue.get(t.id).claim_generation == 1
               for i, t in enumerate(tasks))
    assert most_running[0] <= CONCURRENCY
    assert transport.overcommitted == []  # claims in flight never asked for more than the free slots
    beside = app.queue.store.capabilities.serial_writes is False
    assert transport.most_in_flight == (2 if beside else 1)


class WatchedClaims:
    """The real queue; at each claim sent, notes the tasks earlier claims returned whose
    handlers have not begun yet."""

    def __init__(self, queue: leaseq.Queue, started: set[int]):
        self._queue = worker_port(queue)
        self.started = started
        self.returned: set[int] = set()
        self.waiting_at_claim: list[set[int]] = []

    def __getattr__(self, name):
        return getattr(self._queue, name)

    def _sent(self) -> None:
        self.waiting_at_claim.append(self.returned - self.started)

    def _back(self, claims):
        self.returned.update(c.task_id for c in claims)
        return claims

    async def claim(self, worker, **options):
        self._sent()
        return self._back(await self._queue.claim(worker, **options))


def test_claimed_handlers_begin_before_the_next_claim_is_sent(app: leaseq.App) -> None:
    """Pickup latency ends when the handler begins: the claim that follows a claim with
    room to spare is not prepared and sent first."""
    started: set[int] = set()
    transport = WatchedClaims(app.queue, started)

    @app.task("quick")
    async def quick(ctx, n: int) -> int:
        started.add(ctx.task_id)
        return n

    for i in range(3):
        quick.enqueue(n=i)
    stats = app.run_worker(transport=transport, until_idle=True, install_signals=False,
                           concurrency=10, poll_interval=0.05)
    assert stats.completed == 3
    assert len(transport.waiting_at_claim) >= 2  # the claim with the tasks, then at least one after it
    assert all(not waiting for waiting in transport.waiting_at_claim), transport.waiting_at_claim


def test_a_worker_run_until_idle_ends_once_nothing_is_due(app: leaseq.App) -> None:
    # With two claims in flight, an idle worker must still see the queue empty and stop: the
    # claim beside the loop's goes out only for slots that were freed, never on a timer (on
    # one, the two took turns being in flight and the run ended only by chance, minutes later).
    transport = SlowClaims(app.queue)

    @app.task("agent")
    async def agent(ctx, n: int) -> int:
        await asyncio.sleep(0.05 * (n % CONCURRENCY + 1))  # staggered: slots free one by one
        return n

    tasks = [agent.enqueue(n=i) for i in range(16)]
    worker = app.worker(transport=transport, concurrency=CONCURRENCY, poll_interval=0.05)

    async def run() -> None:
        # the work takes about 4 s; 30 s is the bound of a run that ends, not a speed target
        await asyncio.wait_for(worker.run(until_idle=True), 30)

    asyncio.run(run())
    assert all(app.queue.get(t.id).status == "completed" for t in tasks)


def test_a_cancelled_run_leaves_no_claim_waiting_beside_it(app: leaseq.App) -> None:
    # The claim beside the loop's waits for a freed slot, on no timer: a run that ends
    # without the loop's own end (cancelled here) must not leave it waiting forever.
    @app.task("agent")
    async def agent(ctx, n: int) -> int:
        return n

    worker = app.worker(concurrency=CONCURRENCY, poll_interval=0.05)

    async def run() -> list[str]:
        running = asyncio.create_task(worker.run())
        while worker.worker is None:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await asyncio.sleep(0)
        return [t.get_name() for t in asyncio.all_tasks() if not t.done() and t is not asyncio.current_task()]

    assert "leaseq-claim-alongside" not in asyncio.run(run())
