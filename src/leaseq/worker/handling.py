"""Running one attempt: starting its handler, its timeout, and settling its outcome.

Async handlers run as tasks on the loop, sync ones in a thread pool. The
handler's slot frees the moment it returns; its outcome is handed to the
completer (:mod:`.completer`), which records it under the lease, and the
recorded verdict is accounted for in :meth:`Handling._settled`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import sys
import time
from collections.abc import Awaitable

from ..core.errors import LeaseLost, Permanent, QueuePaused, Suspended, ToolCallDiverged
from ..core.model import Claim
from ..core.retry import Retry
from ..observability.hooks import TaskLog
from ..signature import call_problem, payload_arguments
from . import tools
from .completer import Outcome, Verdict
from .context import TaskContext
from .losses import Losses

#: How long after a suspended task's wake time its worker claims again: a little, so the
#: database's clock has passed it too.
WAKE_MARGIN = 0.01

logger = logging.getLogger("leaseq.worker")


class Handling(Losses):
    """Running handlers, a part of :class:`~leaseq.worker.WorkerRuntime` (whose state it reads and updates)."""

    # -- starting an attempt, and its timeout ----------------------------------------------

    def _start(self, claim: Claim, sent: float) -> None:
        log = TaskLog(logger, {"task_id": claim.task_id, "kind": claim.task.kind, "generation": claim.generation,
                               "attempt": claim.task.attempts, "worker_id": self._registered.id})
        loop = asyncio.get_running_loop()  # the runtime's: a claim's handlers start on it, its port is awaited on it
        ctx = TaskContext(self.transport, self._registered, claim, log, loop=loop)
        ctx.registry = self.registry  # ctx.spawn takes a declared kind's options from it
        ctx.renewed_at = sent  # the lease started no earlier than the claim was sent
        ctx.on_lost = lambda c, reason: loop.call_soon_threadsafe(self._after_loss, c, reason)
        older = self._generations.setdefault(claim.task_id, set())
        for stale in [self.held[key] for key in older if not self.held[key].loss_told]:
            # This worker reclaimed a task it had not yet seen lost: the older
            # attempt's lease is certainly gone.
            self._lose(stale, f"reclaimed under generation {claim.generation}")
        older.add(ctx.key)
        self.held[ctx.key] = ctx
        self._handling.add(ctx.key)
        self.stats.claimed += 1
        self._renewer.lease_started(ctx)
        self._tasks[ctx.key] = asyncio.create_task(self._run_task(ctx), name=f"leaseq-task-{claim.task_id}",
                                                   context=self.observe.started(ctx, self._registered.id, sent,
                                                                                waits=self._slots is not None))
        if self._slots is None:  # with prefetch, the timeout starts with the handler (_take_slot)
            self._arm_timeout(ctx)

    def _arm_timeout(self, ctx: TaskContext) -> None:
        timeout = self._timeout_of(ctx.claim)
        if timeout is not None:
            self._timers[ctx.key] = asyncio.get_running_loop().call_later(timeout, self._time_out, ctx, timeout)

    async def _take_slot(self, ctx: TaskContext) -> bool:
        """With prefetch: wait for a handler slot (in claim order), holding the lease meanwhile
        (the renewer renews it as a running one). False when the worker began stopping first:
        the task is then given back unstarted, with its attempt."""
        assert self._slots is not None
        await self._slots.acquire()  # a lost lease, or the shutdown, cancels the wait
        if self._stopping:  # began stopping while this task waited: it never starts
            self._slots.release()
            self._give_back_waiting(ctx)
            return False
        ctx.slot_held = True
        self.observe.slot_taken(ctx)  # the handler's duration starts here, not at the claim
        self._arm_timeout(ctx)
        return True

    def _timeout_of(self, claim: Claim) -> float | None:
        """How long the attempt may run: the task's own timeout, else its kind's declared one."""
        if claim.task.timeout_seconds is not None:
            return float(claim.task.timeout_seconds)
        definition = self.registry.get(claim.task.kind)
        return getattr(definition, "timeout", None)  # a bare registry's handlers may declare none

    def _time_out(self, ctx: TaskContext, seconds: float) -> None:
        """The attempt ran past its timeout: stop the handler (cancelled if async; a sync one
        sees ``ctx.lost`` and ``ctx.check()`` raise) and give its lease up with reason
        ``timeout``, for the recovery policy to route the task."""
        self._timers.pop(ctx.key, None)
        if ctx.key not in self._handling or ctx.lost:
            return  # the handler returned (its outcome is being recorded), or the lease is gone already
        if not ctx.mark_lost(f"timeout: the attempt ran past {seconds:g}s"):
            return
        self.stats.timed_out += 1
        ctx.log.warning(self._msg(ctx, f"timed out after {seconds:g}s: stopping the handler and giving the "
                                       "lease up"))
        task = self._tasks.get(ctx.key)
        if task is not None:
            task.cancel()  # an async handler stops at its next await; a thread's result is dropped
        recording = asyncio.ensure_future(self._completer.time_out(ctx))
        self._timeouts.add(recording)
        recording.add_done_callback(self._timeouts.discard)

    # -- running the handler ---------------------------------------------------------------

    async def _run_task(self, ctx: TaskContext) -> None:
        try:
            recording = await self._run_handler(ctx)
            if recording is not None:
                await recording  # shielded inside: its accounting happens in _settled
        except asyncio.CancelledError:
            if not ctx.lost:
                raise
            # Cancelled because the lease was lost: nothing may be published.
        finally:
            self._forget(ctx)

    async def _run_handler(self, ctx: TaskContext) -> Awaitable[Outcome] | None:
        """Run the handler; return the recording of its outcome (None: nothing to record)."""
        if self._slots is not None and not await self._take_slot(ctx):
            return None
        definition = self.registry.get(ctx.task.kind)
        try:
            try:
                if definition is None:
                    raise Permanent(f"no handler for task kind {ctx.task.kind!r} in this worker")
                args, kwargs = payload_arguments(ctx.task.payload)
                # @leaseq.tool functions find the running handler's context here
                current = tools.current_context.set(ctx)
                ctx.handler_is_async = inspect.iscoroutinefunction(definition.fn)
                try:
                    if ctx.handler_is_async:
                        result = await definition.fn(ctx, *args, **kwargs)
                    else:
                        loop = asyncio.get_running_loop()  # the thread runs in this task's context (its span)
                        self._threaded.add(ctx.key)
                        result = await loop.run_in_executor(self._handlers, contextvars.copy_context().run,
                                                            functools.partial(definition.fn, ctx, *args, **kwargs))
                except TypeError as exc:
                    # Asked only now, not before every call (a signature bind per task): a payload
                    # that does not fit raises before the handler's first line runs, and would on
                    # every attempt, so it is not retried; a TypeError from inside the handler is
                    # the handler's failure, as any other.
                    problem = call_problem(definition.fn, ctx, args, kwargs)
                    if problem is None:
                        raise
                    raise Permanent(f"the payload does not fit the handler for {ctx.task.kind!r}: {problem}") \
                        from exc
                finally:
                    tools.current_context.reset(current)
            finally:
                self.observe.returned(ctx, sys.exc_info()[1])
                self._threaded.discard(ctx.key)
                self._handling.discard(ctx.key)
                if ctx.slot_held:  # the next task claimed ahead starts now
                    ctx.slot_held = False
                    assert self._slots is not None
                    self._slots.release()
                if sys.exc_info()[1] is None and not ctx.lost and self._completer.refills:
                    # The success's completion will ask for the task that takes this
                    # slot (one request for both): held for it meanwhile.
                    ctx.refill_slot = True
                    self._reserved += 1
                else:
                    # The slot is free once the handler returns: the next claim
                    # overlaps with recording this outcome.
                    self._wake.set()
                    self._freed.set()
        except Suspended as ended:
            # The handler began a durable wait: the guarded write that recorded it ended the
            # lease (the task waits, holding no lease and no slot). Nothing more to record.
            ctx.outcome_recorded = True
            self.stats.suspended += 1
            self.observe.suspended(ctx, str(ended))
            if ended.until is not None:
                # Claimable again at its wake time: this worker claims then, not at its next poll
                # (a PostgreSQL worker's poll is seconds apart; its notifications say nothing of
                # a time that comes). The time is the database's; a clock of this host's that is
                # behind it makes the claim early, and the poll finds the task instead.
                delay = max(0.0, ended.until - time.time()) + WAKE_MARGIN
                asyncio.get_running_loop().call_later(delay, self._wake.set)
            if ctx.log.isEnabledFor(logging.INFO):
                ctx.log.info(self._msg(ctx, f"suspended: waits for {ended.waiting_for}"))
            return None
        except ToolCallDiverged as exc:
            # The handler's code no longer matches its recorded run: the guarded write that
            # found it ended the attempt (the task needs reconciliation). Nothing more to record.
            ctx.outcome_recorded = True
            ctx.mark_lost(f"diverged from its recorded run at {exc.idempotency_key!r}")
            ctx.log.warning(self._msg(ctx, f"needs reconciliation: {exc}"))
            return None
        except asyncio.CancelledError:
            if not ctx.lost:
                raise
            return None
        except LeaseLost as exc:
            self._lose(ctx, exc.reason)
            return None
        except QueuePaused as exc:
            return self._completer.release(ctx, f"queue paused: {exc}")
        except Retry as exc:  # asked to run later: not a failure
            if ctx.lost:
                ctx.log.warning(self._msg(ctx, f"retry not recorded: lease lost ({ctx.lost_reason}): {exc}"))
                return None
            return self._completer.retry(ctx, exc)
        except Exception as exc:  # the handler failed: route it by kind of failure
            if ctx.lost:
                ctx.log.warning(self._msg(ctx, f"failure not recorded: lease lost ({ctx.lost_reason}): {exc!r}"))
                return None
            return self._completer.fail(ctx, exc, getattr(definition, "retry", None))
        if ctx.loss_told:
            ctx.log.warning(self._msg(ctx, f"result not published: lease lost ({ctx.lost_reason})"))
            return None
        if ctx.lost:
            # Presumed lost on this worker's clock only: the database may still hold
            # the lease (a renewal can commit unanswered). Send the success; the guard
            # accepts it or refuses it with zero rows.
            ctx.log.info(self._msg(ctx, f"handler returned after its lease was presumed lost ({ctx.lost_reason}): "
                                        "sending its success for the queue to judge"))
            self._presumed_sent.add(ctx.key)
        return self._completer.complete(ctx, result)

    def _forget(self, ctx: TaskContext) -> None:
        if ctx.loss_inferred and not ctx.outcome_recorded and ctx.key not in self._presumed_sent:
            # The attempt ended with nothing sent: the presumed loss stands.
            self._lose(ctx, ctx.lost_reason or "lease presumed lost")
        self.observe.finished(ctx)
        timer = self._timers.pop(ctx.key, None)
        if timer is not None:
            timer.cancel()
        self._handling.discard(ctx.key)
        if ctx.refill_slot:  # no completion took the slot over (lost, refused, stopping): free it
            ctx.refill_slot = False
            self._reserved -= 1
        if self.held.pop(ctx.key, None) is not None:
            generations = self._generations.get(ctx.task_id)
            if generations is not None:
                generations.discard(ctx.key)
                if not generations:
                    del self._generations[ctx.task_id]
        self._tasks.pop(ctx.key, None)
        self._ended += 1
        self._wake.set()
        self._freed.set()

    # -- settling the outcome --------------------------------------------------------------

    def _settled(self, ctx: TaskContext, outcome: Outcome) -> None:
        """Account for one recorded outcome (called once per recording, from the loop)."""
        self.observe.settled(ctx, outcome)
        verdict, op = outcome.verdict, outcome.op
        if ctx.key in self._presumed_sent:  # a success sent after the lease was presumed lost
            self._presumed_sent.discard(ctx.key)
            if verdict is not Verdict.RECORDED:
                if verdict is Verdict.UNCONFIRMED:
                    self.stats.unconfirmed += 1
                ctx.log.warning(self._msg(ctx, f"result not published: sent after the lease was presumed lost, "
                                               f"{op} not recorded ({outcome.detail})"))
                self._lose(ctx, outcome.detail if verdict is Verdict.LOST else
                           f"{op} after a presumed loss not recorded: {outcome.detail}")
                return
            if op == "complete":
                self.stats.recovered += 1
        if verdict is Verdict.RECORDED:
            ctx.outcome_recorded = True
            if op == "complete":
                self.stats.completed += 1
                if ctx.log.isEnabledFor(logging.INFO):
                    ctx.log.info(self._msg(ctx, "completed"))
            elif op == "fail":
                self.stats.failed += 1
                ctx.log.warning(self._msg(ctx, f"failed -> {getattr(outcome.value, 'status', '?')}: {outcome.detail}"))
            elif op == "retry":
                self.stats.snoozed += 1
                ctx.log.info(self._msg(ctx, f"retry requested -> {getattr(outcome.value, 'status', '?')}"))
            else:
                self.stats.released += 1
                ctx.log.info(self._msg(ctx, "released"))
        elif verdict is Verdict.LOST:
            self._lose(ctx, outcome.detail)
        elif verdict is Verdict.UNCONFIRMED:
            self.stats.unconfirmed += 1
            ctx.log.warning(self._msg(ctx, f"{op} unconfirmed: an earlier try failed in transit and the retry was "
                                           f"refused ({outcome.detail}); the first try may have been written"))
        elif op in ("release", "timeout"):
            self.stats.transient_errors += 1
            ctx.log.warning(self._msg(ctx, f"release not recorded ({outcome.detail}); the lease will expire instead"))
        else:
            # Never a handler failure: the lease ends and the recovery policy routes the task.
            if verdict is Verdict.UNRECORDABLE:
                self.stats.transient_errors += 1
            what = {"complete": "succeeded", "retry": "asked to retry"}.get(op, "failed")
            self._lose(ctx, f"the handler {what} but its {op} could not be recorded before the lease ended: "
                            f"{outcome.detail}")
