"""What a task handler sees: ``ctx``, its lease, and its effects.

A handler holds a lease only as long as the runtime keeps renewing it. When
the lease is lost, ``ctx.lost`` turns true, ``ctx.check()`` and every new
``ctx.effect(...)`` raise :class:`leaseq.LeaseLost`, and the handler's result
will not be published. The guards in the database refuse a stale worker
anyway; the context makes it stop early instead of wasting tool calls.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.errors import LeaseLost
from ..core.model import Claim, Effect, Task, Worker

if TYPE_CHECKING:  # pragma: no cover
    from .transport import Transport


#: Guards every context's loss flag; held for a few instructions at a time.
_LOSS_LOCK = threading.Lock()


class TaskContext:
    """The handler's view of one claimed task."""

    def __init__(self, transport: Transport, worker: Worker, claim: Claim, log: logging.LoggerAdapter):
        self._transport = transport
        self.worker = worker
        self.claim = claim
        self.log = log
        self._lost = False
        #: made on the first ctx.sleep(): most handlers never sleep on it
        self._lost_event: threading.Event | None = None
        self.lost_reason: str | None = None
        #: monotonic time at which the last successful renewal was *sent*:
        #: the lease cannot outlive it by more than its length.
        self.renewed_at = time.monotonic()
        #: set by the runtime: called (from any thread) when the context finds out itself
        self.on_lost: Callable[[TaskContext, str], None] | None = None

    # -- the lease ------------------------------------------------------------

    @property
    def task(self) -> Task:
        """The task as claimed."""
        return self.claim.task

    @property
    def task_id(self) -> int:
        return self.claim.task_id

    @property
    def key(self) -> tuple[int, int]:
        """(task id, generation): one attempt. A worker may hold a stale and a new
        attempt of the same task at once, so the runtime tracks attempts, not tasks."""
        return (self.claim.task_id, self.claim.generation)

    @property
    def generation(self) -> int:
        """The claim generation: this attempt's fencing token."""
        return self.claim.generation

    @property
    def lost(self) -> bool:
        """True once this worker no longer holds the lease."""
        return self._lost

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is gone. Call it between steps."""
        if self._lost:
            raise LeaseLost(self.task_id, self.generation, self.lost_reason or "lease lost")

    def sleep(self, seconds: float) -> None:
        """Sleep (sync handlers), waking early with :class:`LeaseLost` if the lease is lost."""
        with _LOSS_LOCK:
            if self._lost_event is None:
                self._lost_event = threading.Event()
                if self._lost:
                    self._lost_event.set()
            event = self._lost_event
        if event.wait(seconds):
            self.check()

    def mark_lost(self, reason: str) -> bool:
        """Record the loss (runtime use). Returns False if it was already lost."""
        with _LOSS_LOCK:  # one caller wins, whichever threads race here
            if self._lost:
                return False
            self.lost_reason = reason
            self._lost = True
            event = self._lost_event
        if event is not None:
            event.set()
        return True

    def _refused(self, exc: LeaseLost) -> None:
        """A guarded call of this context was refused: the lease is gone."""
        if self.mark_lost(exc.reason) and self.on_lost is not None:
            self.on_lost(self, exc.reason)

    # -- effects --------------------------------------------------------------

    def effect(self, action: str, key: str | None = None) -> EffectScope:
        """Record the intent of a tool call, guarded by the lease, before making it.

        Use as ``with ctx.effect("email.send") as fx:`` (or ``async with``)::

            with ctx.effect("email.send", key=f"welcome:{user}") as fx:
                if not fx.replayed:
                    fx.record(mailer.send(..., idempotency_key=fx.idempotency_key,
                                          fencing_token=fx.fencing_token))
            response = fx.response

        If an earlier attempt already recorded a response under the same key,
        ``fx.replayed`` is true and ``fx.response`` holds it: do not call again.
        Leaving the block normally without :meth:`EffectScope.record` records
        an empty response; leaving it with an exception leaves the intent open,
        which is the ambiguous case the recovery policy sends to reconciliation.
        """
        return EffectScope(self, action, key)

    def call_effect(self, action: str, fn: Callable[[EffectScope], Any], *, key: str | None = None) -> Any:
        """Run ``fn(fx)`` as the effect ``action`` unless an earlier attempt already
        did; return its recorded response either way."""
        with self.effect(action, key) as fx:
            if not fx.replayed:
                fx.record(fn(fx))
        return fx.response


class EffectScope:
    """One tool call's entry in the action ledger, while it is being made."""

    def __init__(self, ctx: TaskContext, action: str, key: str | None):
        self._ctx = ctx
        self.action = action
        self._key = key
        self.effect: Effect | None = None
        self._recorded = False

    # The intent is written on entry, under the lease guard.
    def _begin(self) -> EffectScope:
        self._ctx.check()
        try:
            self.effect = self._ctx._transport.begin_effect(self._ctx.worker, self._ctx.claim, self.action, self._key)
        except LeaseLost as exc:
            self._ctx._refused(exc)
            raise
        self._recorded = self.effect.replayed
        return self

    def __enter__(self) -> EffectScope:
        return self._begin()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None and not self._recorded:
            self.record(None)

    async def __aenter__(self) -> EffectScope:
        return await asyncio.to_thread(self._begin)

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None and not self._recorded:
            await self.arecord(None)

    @property
    def replayed(self) -> bool:
        """True when an earlier attempt already recorded this action's response."""
        return bool(self.effect and self.effect.replayed)

    @property
    def response(self) -> Any:
        """The recorded response (the earlier attempt's, when replayed)."""
        return self.effect.response if self.effect else None

    @property
    def idempotency_key(self) -> str:
        """Stable across attempts: send it to the downstream API."""
        assert self.effect is not None
        return self.effect.idempotency_key

    @property
    def fencing_token(self) -> int:
        """This attempt's claim generation: newer attempts carry larger tokens."""
        assert self.effect is not None
        return self.effect.generation

    @property
    def token(self) -> str | None:
        """A signed action token scoped to this one action of this attempt, when the
        queue has a signing key (``LEASEQ_ACTION_KEYS``); else None."""
        return self.effect.token if self.effect else None

    def record(self, response: Any) -> None:
        """Record the external response, under the lease guard."""
        if self._recorded:
            return
        assert self.effect is not None, "record() outside the effect block"
        try:
            self.effect = self._ctx._transport.finish_effect(self._ctx.worker, self._ctx.claim, self.effect, response)
        except LeaseLost as exc:
            self._ctx._refused(exc)
            raise
        self._recorded = True

    async def arecord(self, response: Any) -> None:
        """:meth:`record` for async handlers."""
        await asyncio.to_thread(self.record, response)
