"""The claim loop, and the second claim in flight beside it.

The loop claims in batches up to free capacity, then waits for a wake-up (a
finished handler, a notification, the poll interval, an empty rate bucket's
refill). A claim that fails in transit is retried with backoff; one the queue
refuses for good (a revoked worker, a refused credential) stops claiming, and
the runtime goes through its graceful shutdown. Beside it,
:meth:`ClaimLoop._claim_alongside` takes the slots that free up while the
loop's own claim is on its way, so handlers that end together are replaced by
two claims in flight, not one after another.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..core.errors import LeaseqError, is_transient
from ..core.model import Claim, Claims
from ..core.timers import wait_event
from .context import TaskContext
from .completer import INITIAL_BACKOFF, Refill, RefillAsk, next_backoff
from .handling import Handling

logger = logging.getLogger("leaseq.worker")

#: The longest pause between claims that failed in transit.
MAX_CLAIM_BACKOFF = 5.0
#: The shortest pause after a claim a rate limit came back short: a limit
#: never makes a worker spin.
MIN_LIMIT_WAIT = 0.02
#: How long an idle worker's claim waits on the queue's side for work, where the
#: transport can (``capabilities.long_poll``): no polling while idle.
CLAIM_WAIT = 5.0
#: Claims one worker has in flight at most: the claim loop's own and one beside it
#: (none beside it where the backend runs one write at a time: it would only wait).
CLAIMS_IN_FLIGHT = 2


class ClaimLoop(Handling):
    """Claiming, a part of :class:`~leaseq.worker.WorkerRuntime` (whose state it reads and updates)."""

    async def _claim(self, queue: str, limit: int, wait: float = 0.0) -> list[Claim]:
        waiting = {"wait": wait} if wait else {}  # only long-poll ports take it
        claims: list[Claim] = await self.transport.claim(self.worker, queue=queue, limit=limit,
                                                         lease_seconds=self.lease_seconds, kinds=self.kinds, **waiting)
        return claims

    async def _claim_reserving(self, queue: str, limit: int, wait: float) -> list[Claim]:
        """Claim up to ``limit`` tasks and start them; while the claim is on its way its
        slots are reserved, so a claim beside it does not ask for them too. A worker that
        began stopping meanwhile gives what it was handed back unstarted (the attempts
        with it), as it does the tasks that come with completions."""
        self._claims_in_flight += 1
        self._reserved += limit
        sent = time.monotonic()
        try:
            claims = await self._claim(queue, limit, wait)
        finally:
            self._claims_in_flight -= 1
            self._reserved -= limit
        for claim in claims:  # no await since the reservation ended: the slots pass to the tasks at once
            if self._stopping:  # began stopping while the claim was on its way: start no new work
                self._completer.give_back(claim, "worker stopping: the task was never started")
            else:
                self._start(claim, sent)
        if claims and not self._stopping:
            # The handlers just started run first, before the caller prepares its next claim
            # (a task's pickup latency ends when its handler begins, not after that claim is sent).
            await asyncio.sleep(0)
        return claims

    # -- claims sent with completions (claim_with_completion) ----------------------------------

    def _refill(self) -> Refill:
        return _Refill(self)

    async def _claim_alongside(self) -> None:
        """The second claim in flight: while the claim loop waits for its own claim, the
        slots freed meanwhile are claimed here instead of after it. It never waits on the
        queue's side and never polls: it claims only beside a claim of the loop's. Errors
        are left to the loop, whose next claim meets them and backs off or stops."""
        queue = self.queues[0]
        while not self._stopping and not self._claims_closed:
            # Only a slot that was freed wakes it, never a timer: an idle worker whose two
            # claims took turns being in flight would never see both come back empty at
            # once, and a run with until_idle would not end (the end of the claim loop
            # sets the event to let this go).
            await self._freed.wait()
            self._freed.clear()
            free = self._free
            if self._stopping or self._claims_closed or not self._claims_in_flight or free <= 0:
                continue
            try:
                await self._claim_reserving(queue, free, 0.0)
            except Exception as exc:  # the loop's own claim will meet it too
                logger.debug("worker %s: claim beside the loop's failed: %r", self._registered.id, exc)
                self._wake.set()

    async def _claim_loop(self, until_idle: bool) -> None:
        turn, backoff = 0, INITIAL_BACKOFF
        # One queue and no idle exit: an empty claim may wait on the queue's side instead of polling.
        wait = CLAIM_WAIT if self._caps.long_poll and len(self.queues) == 1 and not until_idle else 0.0
        while not self._stopping:
            self._wake.clear()
            free = self._free
            got, pause, waited, limited = 0, None, False, None
            ended = self._ended  # a task that ends after this claims again: its limit slot came back
            for i in range(len(self.queues)):
                if free - got <= 0 or self._stopping:
                    break
                queue = self.queues[(turn + i) % len(self.queues)]
                sent = time.monotonic()
                try:
                    claims = await self._claim_reserving(queue, free - got, wait)
                except Exception as exc:
                    if not is_transient(exc):
                        # An answer (refused for good: no retry will help), or a bug (an error no
                        # transport raises on purpose: retrying it forever would hide it). Stop
                        # claiming; the running tasks still get the graceful shutdown.
                        if isinstance(exc, LeaseqError):
                            logger.error("worker %s: claim refused, stopping: %s", self._registered.id, exc)
                        else:
                            logger.error("worker %s: claim raised %r, a bug, not the queue's answer: stopping",
                                         self._registered.id, exc, exc_info=exc)
                        self._fatal = exc
                        self._stopping = True
                        return
                    # in transit (unreachable, restarting, rate limited): retry
                    self.stats.transient_errors += 1
                    pause, backoff = next_backoff(backoff, exc)
                    backoff = min(backoff, MAX_CLAIM_BACKOFF)
                    logger.warning("worker %s: claim failed (%r); retrying in %.2fs", self._registered.id, exc, pause)
                    break
                backoff = INITIAL_BACKOFF
                waited = bool(wait) and not claims and time.monotonic() - sent >= self._poll_every
                if isinstance(claims, Claims) and claims.limit_wait is not None:  # a rate bucket is empty
                    limited = claims.limit_wait if limited is None else min(limited, claims.limit_wait)
                got += len(claims)
            turn += 1
            if pause is not None:
                if not self._stopping:
                    await wait_event(self._wake, pause)
                continue
            if until_idle and got == 0 and not self._tasks and not self._claims_in_flight and self._ended == ended:
                return
            if got == 0 and waited:
                continue  # the claim itself waited for work: ask again at once
            if got == 0 or got >= free:
                # Nothing due, or no capacity left: wait for a finished task,
                # a notification (a freed limit slot sends one too), or the
                # poll interval; no longer than an empty rate bucket needs.
                idle = self._poll_every
                if limited is not None and got < free:
                    idle = min(idle, max(MIN_LIMIT_WAIT, limited))
                await wait_event(self._wake, idle)


class _Refill:
    """The tasks a batch of completions asks for, to take the slots the batch frees.

    A batch may ask for its own slots (those its tasks still hold) and the free
    ones; all are reserved while the request is on its way, so no other claim
    asks for them too. The answer's leases start at once; a worker that began
    stopping meanwhile gives them back unstarted.
    """

    def __init__(self, runtime: ClaimLoop):
        self.rt = runtime

    def reserve(self, ctxs: list[TaskContext]) -> RefillAsk | None:
        rt = self.rt
        if rt._stopping or rt._claims_closed or len(rt.queues) != 1:
            return None  # the slots the batch holds are freed as its tasks end
        held = [ctx for ctx in ctxs if ctx.refill_slot]
        free = max(0, rt._free)
        if not held and not free:
            return None
        for ctx in held:  # their reservations pass to this claim
            ctx.refill_slot = False
        rt._claims_in_flight += 1
        rt._reserved += free
        return RefillAsk(rt.queues[0], len(held) + free, rt.lease_seconds, rt.kinds, time.monotonic())

    def deliver(self, ask: RefillAsk, claims: list[Claim]) -> None:
        rt = self.rt
        rt._claims_in_flight -= 1
        rt._reserved -= ask.limit
        for claim in claims:  # no await since the reservation ended: the slots pass to the tasks at once
            if rt._stopping:
                rt._completer.give_back(claim, "worker stopping: the task was never started")
            else:
                rt._start(claim, ask.sent)
        if len(claims) < ask.limit:  # slots the answer left free: the claim loop claims for them
            rt._wake.set()
            rt._freed.set()

    def cancel(self, ask: RefillAsk) -> None:
        self.deliver(ask, [])
