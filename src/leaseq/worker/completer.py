"""Recording outcomes: complete, fail, release, and the worker's loss reports.

A handler's outcome is recorded by one guarded write. The write can meet
two kinds of trouble, and they must never be confused:

* the lease guard refuses it (:class:`~leaseq.LeaseLost`, a revoked worker):
  the lease is gone, nothing was written, and the runtime treats the task
  as lost;
* the queue cannot be reached (a dropped connection, a restarting server
  or service, a rate limit): nothing is known to be wrong with the lease.
  The write is retried with backoff for as long as the lease can still be
  met: until the deadline the last successful renewal proves, on the
  monotonic clock. An infrastructure error never becomes a handler failure;
  a success that cannot be recorded in time is reported as a loss (the
  recovery policy in SQL routes the task when its lease ends).

Which is which is decided in one place, :func:`leaseq.core.errors.is_transient`
(the error registry's ``transient`` classes, and the operating system's
network errors). Any other error of the registry is the queue's answer; an
exception outside the registry is a bug, not an answer: the write ends
unrecorded and the worker stops, with its traceback, as the claim loop does.

A lease the worker only *presumed* lost on its own clock (no successful
renewal within its length) may still be live in the database: a renewal
whose answer was lost can have extended it. Its success is still sent, at
least once and until the last renewal sent plus the lease length; the
guard accepts it or refuses it with zero rows.

Each recording runs as its own task, shielded from the handler's task: a
handler cancelled while its completion is in flight (lease lost, a reclaim,
shutdown) does not cancel the write, and a batch's other completions still
resolve. The runtime hears of every outcome exactly once, through the
``settle`` callback, whether or not anyone still awaits it.

Completions are batched where the transport can (one guarded statement per
batch): those that arrive while a batch is being written form the next one,
so a busy worker commits once per batch and an idle one at once. A batch
holds at most :data:`BATCH_LIMIT` completions (what the service takes in
one request); more wait for the next. Where the
transport can also claim in the same round trip
(``capabilities.claim_with_completion``, the HTTP service), a batch asks
for the tasks that will take its slots (:class:`Refill`, the claim loop's
side): a busy remote worker makes one request per batch, not two.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import random
import sysconfig
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..core.errors import (CredentialMissing, InvalidInput, InvalidTransition, LeaseLost, LeaseqError, NotFound,
                           Permanent, RateLimited, ToolCallDiverged, UnknownWorker, is_transient)
from ..core.retry import Retry, RetryPolicy
from .transport import Capabilities

if TYPE_CHECKING:  # pragma: no cover
    from ..core.model import Claim, Worker
    from .context import TaskContext

logger = logging.getLogger("leaseq.worker")

#: First pause after a failed write; doubled after each failure up to MAX_BACKOFF.
INITIAL_BACKOFF = 0.05
MAX_BACKOFF = 2.0
MAX_ERROR_TEXT = 4000
#: The reason a lease is given up with when its attempt ran past its timeout.
TIMEOUT_REASON = "timeout"
#: Most completions one batch carries (the service's limit for one request).
BATCH_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class RefillAsk:
    """The claim sent with a batch of completions; its ``limit`` slots are reserved meanwhile."""

    queue: str
    limit: int
    lease_seconds: float | None
    kinds: list[str] | None
    #: when it was sent (monotonic): the leases began no earlier
    sent: float


class Refill(Protocol):
    """The claim loop's side of claims sent with completions."""

    def reserve(self, ctxs: list[TaskContext]) -> RefillAsk | None:
        """The claim to send with the completions of ``ctxs`` (slots reserved), or None for none."""

    def deliver(self, ask: RefillAsk, claims: list[Claim]) -> None:
        """Start what ``ask`` leased (or give it back when stopping); ends the reservation."""

    def cancel(self, ask: RefillAsk) -> None:
        """The request failed: end the reservation; nothing was leased."""


def next_backoff(backoff: float, exc: BaseException) -> tuple[float, float]:
    """(this pause, the next one): jittered doubling, or the service's Retry-After."""
    if isinstance(exc, RateLimited):
        return max(0.0, exc.retry_after), backoff
    return backoff * random.uniform(0.5, 1.0), min(MAX_BACKOFF, backoff * 2)


class Verdict(enum.Enum):
    """How a recording ended."""

    RECORDED = "recorded"            # the write was made
    LOST = "lost"                    # the guard refused it: the lease is gone, nothing was written
    UNCONFIRMED = "unconfirmed"      # refused after a try that failed in transit and may have been written
    UNRECORDABLE = "unrecordable"    # the queue could not be reached before the lease ended
    UNUSABLE = "unusable"            # refused as invalid input (nothing written)


@dataclass(frozen=True)
class Outcome:
    """The end of one recording: ``op`` is what was written (or tried)."""

    op: str
    verdict: Verdict
    detail: str = ""
    value: Any = None


def _decided(op: str, exc: BaseException, tries: int) -> Outcome:
    """The outcome of a decisive refusal after ``tries`` failed tries in transit."""
    if isinstance(exc, (LeaseLost, UnknownWorker, NotFound, InvalidTransition)):
        reason = exc.reason if isinstance(exc, LeaseLost) else f"{op} refused: {exc}"
        return Outcome(op, Verdict.UNCONFIRMED if tries else Verdict.LOST, reason)
    if isinstance(exc, InvalidInput):
        return Outcome(op, Verdict.UNUSABLE, str(exc))
    return Outcome(op, Verdict.UNRECORDABLE, f"{op} refused: {exc!r}")  # AccessDenied, a bug: no retry will help


#: Where the frames that called a handler live (leaseq's worker, and the asyncio or thread
#: pool that ran it): they are not the user's story.
_OWN_SOURCE = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_STDLIB = tuple(os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib"))
_INSTALLED = tuple(os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("purelib", "platlib"))


def _caller_frame(filename: str) -> bool:
    path = os.path.realpath(filename)
    return path.startswith(_OWN_SOURCE) or (path.startswith(_STDLIB) and not path.startswith(_INSTALLED))
#: Most frames an error text keeps: the handler's own frame and the innermost others.
MAX_ERROR_FRAMES = 8


def error_text(exc: BaseException) -> str:
    """A handler's exception as the task's ``last_error``: its type and message, then its frames.

    The first line is the exception (the repeated-failure rule fingerprints it).
    The frames start at the user's code: the frames that called the handler
    (the worker's, the event loop's or the thread pool's) are left out; leaseq frames the handler itself called (``ctx.check``
    raising ``LeaseLost``) stay, innermost last, as Python prints them. The
    line breaks are kept, one frame and its source line per line.
    """
    head = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    frames = traceback.extract_tb(exc.__traceback__)
    first = next((i for i, f in enumerate(frames) if not _caller_frame(f.filename)), 0)
    kept = list(frames[first:])
    lines = traceback.format_list(kept)
    if len(kept) > MAX_ERROR_FRAMES:
        hidden = len(kept) - MAX_ERROR_FRAMES
        lines = lines[:1] + [f"  ... {hidden} frame{'s' if hidden > 1 else ''} left out ...\n"] + \
            lines[-(MAX_ERROR_FRAMES - 1):]
    tail = "Traceback (most recent call last):\n" + "".join(lines) if lines else ""
    return (head + ("\n" + tail if tail else "")).rstrip()[:MAX_ERROR_TEXT]


def lease_deadline(ctx: TaskContext) -> float:
    """Monotonic time until which a write is worth retrying: the lease is proven to
    last until its last successful renewal + its length. A lease only presumed lost
    may last until its last renewal *sent* + its length (that renewal may have
    committed unanswered): the guard in the database decides."""
    if ctx.loss_inferred:
        return ctx.may_last_until()
    return ctx.renewed_at + ctx.claim.lease_seconds


class Completer:
    """Records the outcomes of one worker's tasks through its transport."""

    def __init__(self, transport: Any, capabilities: Capabilities, worker: Worker,
                 settle: Callable[[TaskContext, Outcome], None], refill: Refill | None = None,
                 bug: Callable[[str, BaseException], None] | None = None):
        #: the port every write is awaited on
        self.transport = transport
        self.capabilities = capabilities
        self.worker = worker
        #: claims sent with batched completions, where the port can
        self._refill = refill if (capabilities.claim_with_completion and capabilities.batched_completion) else None
        self._settle = settle
        #: ``bug(what, exc)``: a write raised what no port raises on purpose (outside the error
        #: registry): the worker stops with its traceback rather than retrying it
        self._bug = bug if bug is not None else _log_bug
        self._pending: list[_Pending] = []
        #: the task writing batches, one at a time (done once none is left)
        self._flusher: asyncio.Task[None] | None = None
        #: most completions one batch carries
        self.batch_limit = BATCH_LIMIT
        #: every recording and loss report still running (a set keeps each task referenced)
        self.in_flight: set[asyncio.Future[Any]] = set()

    # -- the three outcomes -------------------------------------------------------------

    async def complete(self, ctx: TaskContext, result: Any) -> Outcome:
        """Record a success (batched where the transport can); retried through outages."""
        if self.capabilities.batched_completion:
            done: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
            self._pending.append(_Pending(ctx, result, done))
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._flush(), name="leaseq-completions")
            # The flusher settles the outcome itself: a waiter cancelled here only
            # cancels its own future, which the flusher then leaves alone.
            return await done
        return await self._track(ctx, asyncio.ensure_future(self._complete_one(ctx, result)), "complete")

    async def fail(self, ctx: TaskContext, exc: BaseException, policy: RetryPolicy | None = None) -> Outcome:
        """Record a handler failure; retried through outages, never turned into another failure.
        ``policy``: the kind's retry policy (which failures retry, after how long)."""
        return await self._track(ctx, asyncio.ensure_future(self._fail_one(ctx, exc, policy)), "fail")

    async def release(self, ctx: TaskContext, reason: str, *, until: float | None = None) -> Outcome:
        """Give the lease back (through the recovery policy); retried until ``until`` at the
        latest (a monotonic time), after which the lease is left to expire instead."""
        attempt = self._attempts(ctx, "release", lambda: self.transport.release(self.worker, ctx.claim, reason),
                                 until=until, stop_when_lost=False)
        return await self._track(ctx, asyncio.ensure_future(attempt), "release")

    async def retry(self, ctx: TaskContext, request: Retry) -> Outcome:
        """Record a handler's :class:`leaseq.Retry`: the attempt ends and the task runs again
        ``request.after`` seconds later; retried through outages as a failure is."""
        attempt = self._attempts(ctx, "retry", lambda: self.transport.retry(self.worker, ctx.claim, request.after,
                                                                                      request.reason))
        return await self._track(ctx, asyncio.ensure_future(attempt), "retry")

    async def time_out(self, ctx: TaskContext) -> Outcome:
        """Give the lease of an attempt that ran past its timeout back, with reason ``timeout``:
        the recovery policy routes the task. Retried while the lease lasts."""
        attempt = self._attempts(ctx, "timeout", lambda: self.transport.release(self.worker, ctx.claim,
                                                                                        TIMEOUT_REASON),
                                 stop_when_lost=False)
        return await self._track(ctx, asyncio.ensure_future(attempt), "timeout")

    def report_loss(self, ctx: TaskContext, reason: str) -> None:
        """Add the worker's account of a lost lease to the evidence trail, in the
        background (best effort: the guards already held)."""
        if not self.capabilities.loss_reports:
            return
        task = asyncio.ensure_future(self._report(ctx, reason))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the recordings and reports still running."""
        if self.in_flight:
            await asyncio.wait(list(self.in_flight), timeout=timeout)

    # -- plumbing ------------------------------------------------------------------------

    async def _track(self, ctx: TaskContext, done: asyncio.Future[Outcome], op: str) -> Outcome:
        """Settle ``done`` once when it resolves, and await it shielded from the caller's cancellation."""
        self.in_flight.add(done)

        def settled(fut: asyncio.Future[Outcome]) -> None:
            self.in_flight.discard(fut)
            if fut.cancelled():
                return
            outcome = fut.result() if fut.exception() is None else Outcome(
                op, Verdict.UNRECORDABLE, f"recording failed: {fut.exception()!r}")
            self._settle(ctx, outcome)

        done.add_done_callback(settled)
        return await asyncio.shield(done)

    async def _attempts(self, ctx: TaskContext, op: str, send: Callable[[], Awaitable[Any]], *,
                        until: float | None = None, stop_when_lost: bool = True) -> Outcome:
        """Send one write until it is decided or the lease can no longer be met."""
        backoff, tries = INITIAL_BACKOFF, 0
        while True:
            try:
                value = await send()
            except Exception as exc:
                if not is_transient(exc):
                    if not isinstance(exc, LeaseqError):
                        self._bug(op, exc)
                    return _decided(op, exc, tries)
                tries += 1
                left = (lease_deadline(ctx) if until is None else min(until, lease_deadline(ctx))) - time.monotonic()
                if left <= 0 or (stop_when_lost and ctx.loss_told):
                    return Outcome(op, Verdict.UNRECORDABLE, f"{op} not recorded after {tries} tries: {exc!r}")
                pause, backoff = next_backoff(backoff, exc)
                (ctx.log.warning if tries == 1 else ctx.log.debug)(
                    "task=%s gen=%s: %s failed (%r); retrying while the lease lasts (%.1fs left)",
                    ctx.task_id, ctx.generation, op, exc, left)
                await asyncio.sleep(min(pause, left))
            else:
                return Outcome(op, Verdict.RECORDED, value=value)

    async def _complete_one(self, ctx: TaskContext, result: Any) -> Outcome:
        outcome = await self._attempts(ctx, "complete", lambda: self.transport.complete(self.worker, ctx.claim,
                                                                                            result))
        if outcome.verdict is Verdict.UNUSABLE:  # only this task's result was refused: fail it, no retry
            return await self._fail_one(ctx, Permanent(f"handler returned an unusable result: {outcome.detail}"))
        return outcome

    async def _fail_one(self, ctx: TaskContext, exc: BaseException, policy: RetryPolicy | None = None) -> Outcome:
        # a diverged run diverges again on every retry: its recorded calls replay the same
        retry = not isinstance(exc, (Permanent, ToolCallDiverged))
        block = isinstance(exc, CredentialMissing)
        text = error_text(exc)
        options: dict[str, Any] = {}
        if policy is not None and retry and not block:
            # the kind's policy: give_up_on / retry_on decide whether to retry, and its backoff how long to wait
            retry = policy.retries(exc)
            if retry:
                options["delay"] = policy.delay(ctx.task.attempts)
        outcome = await self._attempts(ctx, "fail", lambda: self.transport.fail(self.worker, ctx.claim, text,
                                                                                        retry=retry, block=block,
                                                                                        **options))
        if outcome.verdict is Verdict.RECORDED:  # the log line names the handler's error
            outcome = Outcome(outcome.op, outcome.verdict, repr(exc), outcome.value)
        return outcome

    async def _report(self, ctx: TaskContext, reason: str) -> None:
        try:
            await self.transport.report_loss(self.worker, ctx.claim, f"worker saw: {reason}")
        except Exception as exc:  # evidence is best effort; the guards already held
            ctx.log.debug("task=%s gen=%s: could not record the loss: %s", ctx.task_id, ctx.generation, exc)

    # -- batched completions ----------------------------------------------------------------

    async def _flush(self) -> None:
        """Write pending completions in batches until none is left; never leaves a waiter hanging."""
        await asyncio.sleep(0)  # let handlers finishing in this same turn join the batch
        while self._pending:
            batch, self._pending = self._pending[:self.batch_limit], self._pending[self.batch_limit:]
            try:
                await self._write_batch(batch)
            except BaseException as exc:
                failed = batch
                if isinstance(exc, asyncio.CancelledError):  # nobody is left to write the rest
                    failed, self._pending = batch + self._pending, []
                for item in failed:
                    self._resolve(item, Outcome("complete", Verdict.UNRECORDABLE, f"completion failed: {exc!r}"))
                if isinstance(exc, asyncio.CancelledError):
                    raise
                logger.exception("completion batch failed unexpectedly")

    async def _send_batch(self, batch: list[_Pending]) -> set[int]:
        pairs = [(item.ctx.claim, item.result) for item in batch]
        done: set[int]
        refill = self._refill
        ask = refill.reserve([item.ctx for item in batch]) if refill is not None else None
        if refill is None or ask is None:
            done = await self.transport.complete_many(self.worker, pairs)
            return done
        try:
            done, claims = await self.transport.complete_and_claim(self.worker, pairs, queue=ask.queue,
                                                                   limit=ask.limit, lease_seconds=ask.lease_seconds,
                                                                   kinds=ask.kinds)
        except BaseException as exc:
            refill.cancel(ask)
            if isinstance(exc, InvalidInput) and not exc.field.startswith("claim"):
                raise  # one of the batch's results: handled as without a claim
            if isinstance(exc, LeaseqError) and not is_transient(exc):
                # Refused as a whole (an old service, a right withdrawn): nothing was written.
                # Complete plainly from now on; the claim loop claims on its own.
                logger.info("worker %s: completions with a claim refused (%r); completing without",
                            self.worker.id, exc)
                self._refill = None
                done = await self.transport.complete_many(self.worker, pairs)
                return done
            raise
        refill.deliver(ask, claims)
        return done

    @property
    def refills(self) -> bool:
        """Whether batched completions ask for the tasks that take their slots."""
        return self._refill is not None

    def give_back(self, claim: Claim, reason: str) -> None:
        """Release a lease the worker was handed but will not start (it is stopping), in the
        background, with the attempt it was counted (``started=False``); :meth:`drain` waits
        for it. A failure leaves the lease to expire (the attempt then stays counted)."""
        task = asyncio.ensure_future(self.transport.release(self.worker, claim, reason, started=False))
        self.in_flight.add(task)
        task.add_done_callback(self._given_back)

    def _given_back(self, task: asyncio.Future[Any]) -> None:
        self.in_flight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.debug("worker %s: could not give a lease back: %r", self.worker.id, task.exception())

    async def _write_batch(self, batch: list[_Pending]) -> None:
        backoff, tries = INITIAL_BACKOFF, 0
        while batch:
            try:
                held = await self._send_batch(batch)
            except InvalidInput:
                # One unusable result (or one task twice) refuses the whole batch before
                # any write: complete one by one, so only that task fails.
                outcomes = await asyncio.gather(*(self._complete_one(item.ctx, item.result) for item in batch))
                for item, outcome in zip(batch, outcomes):
                    self._resolve(item, outcome)
                return
            except Exception as exc:
                if not is_transient(exc):
                    if not isinstance(exc, LeaseqError):
                        self._bug("complete", exc)
                    for item in batch:
                        self._resolve(item, _decided("complete", exc, tries))
                    return
                tries += 1
                now, keep = time.monotonic(), []
                for item in batch:
                    ctx = item.ctx
                    if ctx.loss_told:
                        self._resolve(item, Outcome("complete", Verdict.LOST, ctx.lost_reason or "lease lost"))
                    elif lease_deadline(ctx) <= now:
                        self._resolve(item, Outcome("complete", Verdict.UNRECORDABLE,
                                                    f"complete not recorded after {tries} tries: {exc!r}"))
                    else:
                        keep.append(item)
                # Completions that arrived meanwhile join the retry (a batch's worth): still one
                # statement per try.
                joined = keep + self._pending
                batch, self._pending = joined[:self.batch_limit], joined[self.batch_limit:]
                if not batch:
                    return
                left = min(lease_deadline(item.ctx) for item in batch) - now
                pause, backoff = next_backoff(backoff, exc)
                (logger.warning if tries == 1 else logger.debug)(
                    "worker %s: completing %d task(s) failed (%r); retrying while their leases last",
                    self.worker.id, len(batch), exc)
                await asyncio.sleep(max(0.0, min(pause, left)))
                continue
            for item in batch:
                if item.ctx.task_id in held:
                    self._resolve(item, RECORDED_COMPLETION)
                else:
                    self._resolve(item, Outcome("complete", Verdict.UNCONFIRMED if tries else Verdict.LOST,
                                                "complete refused: lease no longer held"))
            return

    def _resolve(self, item: _Pending, outcome: Outcome) -> None:
        """Settle one batched completion once, and wake its waiter if it still waits
        (a cancelled waiter cancelled only its own future)."""
        if item.settled:
            return
        item.settled = True
        if not item.done.done():
            item.done.set_result(outcome)
        self._settle(item.ctx, outcome)


def _log_bug(op: str, exc: BaseException) -> None:
    logger.error("%s raised %r, a bug, not the queue's answer", op, exc, exc_info=exc)


@dataclass(slots=True)
class _Pending:
    """A completion waiting for its batch."""

    ctx: TaskContext
    result: Any
    done: asyncio.Future[Outcome]
    settled: bool = False


RECORDED_COMPLETION = Outcome("complete", Verdict.RECORDED)
