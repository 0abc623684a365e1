"""Losing a lease: stop the handler, count it, and report how the worker found out.

A loss told by the queue (a refused guard) is final. A loss presumed on the
worker's own clock (a deadline passed unrenewed) stops the handler too, but a
success a sync handler still returns is sent, and the guard decides.
"""

from __future__ import annotations

import asyncio
import logging

from .context import TaskContext
from .runtime_base import RuntimeBase

logger = logging.getLogger("leaseq.worker")


class Losses(RuntimeBase):
    """Lease losses, a part of :class:`~leaseq.worker.WorkerRuntime` (whose state it reads and updates)."""

    def _lose(self, ctx: TaskContext, reason: str, *, inferred: bool = False) -> None:
        """The lease is gone (``inferred``: presumed gone, on this worker's clock only):
        stop the handler and record how we found out."""
        if ctx.mark_lost(reason, inferred=inferred):
            self._after_loss(ctx, reason)

    def _after_loss(self, ctx: TaskContext, reason: str) -> None:
        task = self._tasks.get(ctx.key)
        if ctx.loss_inferred:
            # Stop the handler as for any loss, but keep a sync handler's result:
            # a success it still returns is sent, and the guard decides. The loss
            # is counted and reported once the attempt ends without a recorded outcome.
            self.stats.presumed_lost += 1
            ctx.log.warning(self._msg(ctx, f"lease presumed lost: {reason}"))
            if task is not None and task is not asyncio.current_task() and ctx.key not in self._threaded:
                task.cancel()
            return
        self.observe.lost(ctx, reason)
        self.stats.lost += 1
        self.stats.lost_reasons[reason] = self.stats.lost_reasons.get(reason, 0) + 1
        ctx.log.warning(self._msg(ctx, f"lease lost: {reason}"))
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # async handlers stop at their next await; sync ones see ctx.lost
        self._completer.report_loss(ctx, reason)

    def _give_back_waiting(self, ctx: TaskContext) -> None:
        """A task claimed ahead that will not start now (the worker is stopping): its lease goes
        back unstarted, its attempt with it."""
        if ctx.mark_lost("worker stopping: the task was never started"):
            self._completer.give_back(ctx.claim, "worker stopping: the task was never started")
