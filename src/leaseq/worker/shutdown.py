"""Stopping: a stop request or a signal, and the graceful shutdown.

Claiming stops first; running tasks may finish within the grace period; the
handlers still running are then stopped and their leases released through
the recovery policy. A second signal exits at once (the leases expire and are
recovered).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any

from .losses import Losses

logger = logging.getLogger("leaseq.worker")

#: How long shutdown keeps trying to release a lease before leaving it to expire.
RELEASE_BUDGET = 5.0


class Shutdown(Losses):
    """Stopping, a part of :class:`~leaseq.worker.WorkerRuntime` (whose state it reads and updates)."""

    # -- stop requests ---------------------------------------------------------------------

    def stop(self, reason: str = "stop requested") -> None:
        """Ask the runtime to stop claiming and shut down (thread-safe); ``reason`` is
        recorded with its clean exit (:meth:`leaseq.Queue.stop_worker`)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        loop = self._loop
        if loop is None or loop.is_closed():
            self._stopping = True
            return
        loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        self._stopping = True
        self._wake.set()
        # Before the transport is open there are no capabilities and no claim to end.
        caps = self.capabilities
        if caps is not None and caps.long_poll and self.worker is not None and self._loop is not None:
            # A claim waiting on the queue's side would hold the shutdown up: end it now.
            try:
                self._loop.create_task(self.transport.interrupt_claims(self.worker),
                                       name="leaseq-interrupt-claims").add_done_callback(_ignore_failure)
            except RuntimeError:  # the runtime already finished: nothing waits
                pass

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._stop_reason is None:
            self._stop_reason = f"signal {signal.Signals(signum).name}"
        if self._signals == 1:
            logger.info("worker %s: signal %s: finishing running tasks (grace %.0fs); again to exit at once",
                        self.worker.id if self.worker else self.name, signum, self.grace)
            self._request_stop()
        else:
            logger.warning("second signal: exiting now; held leases will expire and be recovered")
            logging.shutdown()
            os._exit(130)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until the runtime has finished (for code running it in a thread)."""
        return self._stopped.wait(timeout)

    # -- the graceful shutdown -------------------------------------------------------------

    async def _shutdown(self) -> None:
        # Tasks claimed ahead (prefetch) and still waiting for a handler slot never start:
        # their leases go back at once, unstarted, their attempts with them.
        if self._slots is not None:
            for key in list(self._handling):
                ctx = self.held[key]
                if not ctx.slot_held and not ctx.lost:
                    self._give_back_waiting(ctx)
                    self._tasks[key].cancel()
        pending = list(self._tasks.values())
        if pending:
            logger.info("worker %s: waiting up to %.1fs for %d running task(s)", self._registered.id, self.grace,
                        len(pending))
            await asyncio.wait(pending, timeout=self.grace)
        # Handlers still running are stopped and their leases released; outcomes
        # being recorded are left to finish (within their leases): a success is
        # worth more than a faster exit.
        for ctx in [c for key, c in list(self.held.items()) if key in self._handling and c.loss_inferred]:
            self._lose(ctx, "worker shut down before the handler returned")  # a presumed loss stands
        leftovers = [ctx for key, ctx in list(self.held.items()) if key in self._handling and not ctx.lost]
        until = time.monotonic() + RELEASE_BUDGET
        releases = []
        for ctx in leftovers:
            ctx.mark_lost("worker shutting down")
            task = self._tasks.get(ctx.key)
            if task is not None:
                task.cancel()
            releases.append(self._completer.release(ctx, "worker shut down before the task finished", until=until))
        if releases:
            await asyncio.gather(*releases, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=None if not leftovers else 1.0)
        await self._completer.drain(timeout=1.0)


def _ignore_failure(done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and done.exception() is not None:  # best effort: the wait ends by itself
        logger.debug("could not interrupt a waiting claim: %r", done.exception())
