"""The renewer: keeps every lease a worker holds alive, in one guarded call per tick.

Heartbeat traffic grows with workers, not with tasks. A lease missing from
the answer was refused (expired, cancelled, revoked or reclaimed) and is
lost: the queue said so. A lease whose renewal has not succeeded within its
own length is *presumed* lost, measured on the monotonic clock from the
moment the last successful renewal was *sent* (no wall clock is trusted):
the worker only inferred it, and a renewal whose answer was lost may have
extended the lease after all, so the runtime still sends a success the
handler returns, and the queue's guard decides. A renewal that fails in
transit (a dropped connection, a restarting server) is retried with backoff,
not at once in a loop, for as long as the leases last. What is in transit is
decided by :func:`leaseq.core.errors.is_transient`, as everywhere in the
runtime: any other answer (a right withdrawn), or an exception outside the
error registry (a bug), stops the worker (``stop``) and is logged, the bug
with its traceback; the renewals go on meanwhile, for the leases still held
through the graceful shutdown.

Leases whose handler has returned are still renewed while their outcome is
being recorded, but the renewer does not judge them: the completer's guarded
write does, by the same deadline. It stops renewing such a lease once a
renewal of it is refused (the write may have ended it already, or it expired)
or that deadline has passed (a renewal sent since, unanswered, does not move
it): renewing it again could not help the write, and
a lease whose renewal stays due would be renewed again at once, call after
call, for as long as the write waits for its answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.errors import LeaseqError, UnknownWorker, is_transient
from ..core.timers import wait_event
from .completer import INITIAL_BACKOFF, MAX_BACKOFF, lease_deadline, next_backoff

if TYPE_CHECKING:  # pragma: no cover
    from ..core.model import Worker
    from .context import AttemptKey, TaskContext

logger = logging.getLogger("leaseq.worker")

#: Renew when a third of the shortest held lease has passed.
RENEW_FRACTION = 1 / 3
MIN_RENEW_INTERVAL = 0.05


def renew_interval(ctx: TaskContext) -> float:
    """How long after its last renewal a lease is due for the next one."""
    return max(MIN_RENEW_INTERVAL, ctx.claim.lease_seconds * RENEW_FRACTION)


class Renewer:
    """Renews the leases in ``held``; reports the lost ones through ``lose``."""

    def __init__(self, transport: Any, worker: Worker, held: dict[AttemptKey, TaskContext],
                 running: set[AttemptKey], lose: Callable[..., None], count: Callable[[], None],
                 stop: Callable[[BaseException], None] | None = None):
        #: the port renewals are awaited on
        self.transport = transport
        self.worker = worker
        self._held = held
        #: ``stop(exc)``: a renewal met what no retry will help (an answer, or a bug)
        self._stop = stop
        #: leases whose handler still runs (the others are being recorded)
        self._running = running
        #: ``lose(ctx, reason, inferred=False)``
        self._lose = lose
        self._count = count
        self._wake = asyncio.Event()
        #: monotonic time the renewer sleeps until (None: awake, or idle with nothing held)
        self._sleeping_until: float | None = None
        #: after a renewal failed in transit: no new try before this monotonic time
        self._retry_at = 0.0
        self._backoff = INITIAL_BACKOFF

    def lease_started(self, ctx: TaskContext) -> None:
        """A new lease is held: wake the renewer if it is due before the renewer means to wake."""
        due = ctx.renewed_at + renew_interval(ctx)
        if self._sleeping_until is None or due < self._sleeping_until:
            self._wake.set()

    def renewable(self, ctx: TaskContext, now: float) -> bool:
        """Whether ``ctx``'s lease is still renewed: not lost, and its handler running, or
        its outcome being recorded while the completer still tries to (until the same deadline)."""
        if ctx.lost or ctx.renewals_ended:
            return False
        return ctx.key in self._running or now < lease_deadline(ctx)

    def next_renewal(self) -> float | None:
        """Monotonic time at which the most urgent renewed lease is due for renewal."""
        now = time.monotonic()
        due = min((ctx.renewed_at + renew_interval(ctx) for ctx in self._held.values() if self.renewable(ctx, now)),
                  default=None)
        return None if due is None else max(due, self._retry_at)

    async def run(self) -> None:
        """Renew until cancelled."""
        while True:
            due = self.next_renewal()
            wait = 1.0 if due is None else due - time.monotonic()
            if wait > 0:
                self._wake.clear()
                self._sleeping_until = due
                await wait_event(self._wake, wait)
                self._sleeping_until = None
                continue
            await self.renew_now()

    async def renew_now(self) -> None:
        """Renew every held lease in one call; mark the ones that are gone as lost."""
        sent = time.monotonic()
        live = [ctx for ctx in self._held.values() if self.renewable(ctx, sent)]
        if not live:
            return
        for ctx in live:
            ctx.renewal_sent_at = sent
        # A renewal stuck on a dead connection must not keep leases alive
        # locally: wait no longer than the most urgent lease has left.
        budget = max(MIN_RENEW_INTERVAL, min(c.renewed_at + c.claim.lease_seconds for c in live) - sent)
        renewed: dict[int, Any] | None = None
        call = asyncio.ensure_future(self.transport.renew_leases(self.worker, [ctx.claim for ctx in live]))
        try:
            # asyncio.wait, not wait_for: on Python 3.11 wait_for returns the answer of a call
            # that ended just as the renewer was cancelled and drops the cancellation, and a
            # renewer that outlives its cancellation keeps the worker's shutdown waiting forever.
            finished, _ = await asyncio.wait({call}, timeout=budget)
        except asyncio.CancelledError:
            call.cancel()
            if call.done() and not call.cancelled():
                call.exception()  # retrieved: the renewer stops, and what the call said no longer matters
            raise
        try:
            if not finished:
                call.cancel()
                raise asyncio.TimeoutError
            renewed = call.result()
        except asyncio.TimeoutError:
            logger.warning("worker %s: renewal did not answer within %.2fs", self.worker.id, budget)
            self._retry_at = time.monotonic()  # it already waited: try again at once
        except UnknownWorker as exc:  # revoked: its leases ended with it
            self._count()  # a call sent and answered, as every other
            for ctx in live:
                if ctx.key in self._running:
                    self._lose(ctx, f"heartbeat refused: {exc}")
            return
        except Exception as exc:
            if not is_transient(exc):
                if isinstance(exc, LeaseqError):
                    logger.error("worker %s: renewal refused, stopping: %s", self.worker.id, exc)
                else:
                    logger.error("worker %s: renewal raised %r, a bug, not the queue's answer: stopping",
                                 self.worker.id, exc, exc_info=exc)
                if self._stop is not None:
                    self._stop(exc)
            pause, self._backoff = next_backoff(self._backoff, exc)
            self._backoff = min(self._backoff, MAX_BACKOFF)
            self._retry_at = time.monotonic() + pause
            logger.warning("worker %s: renewal failed (%r); retrying in %.2fs", self.worker.id, exc, pause)
        else:
            self._backoff, self._retry_at = INITIAL_BACKOFF, 0.0
        self._count()
        for ctx in live:
            if renewed is not None and ctx.task_id in renewed:
                ctx.renewed_at = sent
            elif ctx.key not in self._running:
                # The handler returned and its outcome is being recorded: that guarded write
                # decides. A refusal ends the renewals (a failure in transit does not).
                ctx.renewals_ended = renewed is not None
            elif renewed is not None:
                self._lose(ctx, "heartbeat refused: the lease was expired, cancelled, revoked or reclaimed")
            elif time.monotonic() - ctx.renewed_at >= ctx.claim.lease_seconds:
                self._lose(ctx, "no successful renewal within the lease length", inferred=True)
