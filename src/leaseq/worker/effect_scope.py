"""One tool call's entry in the action ledger, while the handler makes it (``with ctx.effect(...) as fx``).

The intent is written under the lease guard on entry, the response on
:meth:`EffectScope.record` (or an empty one on a clean exit); a response
recorded by an earlier attempt is replayed instead. Created by
:meth:`leaseq.TaskContext.effect` and :meth:`leaseq.TaskContext.tool`.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ..core.errors import LeaseLost
from ..core.model import Effect
from ..observability import tracing

if TYPE_CHECKING:  # pragma: no cover
    from .context import TaskContext


class EffectScope:
    """One tool call's entry in the action ledger, while it is being made."""

    def __init__(self, ctx: TaskContext, action: str, key: str | None, resource: str | None = None, *,
                 effect: str | None = None, args_digest: str | None = None):
        self._ctx = ctx
        self.action = action
        self._key = key
        #: a tool call's class and argument digest (None: a plain ctx.effect)
        self._call = {} if effect is None else {"effect": effect, "args_digest": args_digest}
        #: the resource the action token is bound to (None: not bound)
        self.resource = resource
        self.effect: Effect | None = None
        self._recorded = False
        #: monotonic time the current token was asked for; a renewal sent later
        #: moved the lease deadline past the token's expiry
        self._token_asked = 0.0
        self._span: Any = None

    def _call_begin(self, key: str | None) -> Effect:
        ctx = self._ctx
        extra = dict(self._call) if self.resource is None else {"resource": self.resource, **self._call}
        self._token_asked = time.monotonic()
        try:
            return ctx._transport.begin_effect(ctx.worker, ctx.claim, self.action, key, **extra)
        except LeaseLost as exc:
            ctx._refused(exc)
            raise

    # The intent is written on entry, under the lease guard.
    def _begin(self) -> EffectScope:
        self._ctx.check()
        self._span = tracing.start_effect(self._ctx, self.action, self._key)
        try:
            self.effect = self._call_begin(self._key)
        except BaseException as exc:
            tracing.end_effect(self._span, exc)
            raise
        self._recorded = self.effect.replayed
        return self

    def __enter__(self) -> EffectScope:
        return self._begin()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        error = exc
        try:
            if exc_type is None and not self._recorded:
                self.record(None)
        except BaseException as failed:
            error = failed
            raise
        finally:
            tracing.end_effect(self._span, error, replayed=self.replayed)

    async def __aenter__(self) -> EffectScope:
        return await asyncio.to_thread(self._begin)

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        error = exc
        try:
            if exc_type is None and not self._recorded:
                await self.arecord(None)
        except BaseException as failed:
            error = failed
            raise
        finally:
            tracing.end_effect(self._span, error, replayed=self.replayed)

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
    def generation(self) -> int:
        """This attempt's claim generation."""
        assert self.effect is not None
        return self.effect.generation

    @property
    def fencing_token(self) -> str:
        """This attempt's fencing token, ``"<task_id>.<generation>"``, for
        :meth:`leaseq.fencing.FencedStore.apply`. It names its task: a fence
        compares it only with the same task's attempts."""
        assert self.effect is not None
        return f"{self.effect.task_id}.{self.effect.generation}"

    @property
    def token(self) -> str | None:
        """A signed action token for this one action of this attempt, when the queue
        has a signing key (``LEASEQ_ACTION_KEYS``); else None. See :meth:`fresh_token`."""
        return self.fresh_token()

    def fresh_token(self) -> str | None:
        """The action token, valid until the current lease deadline.

        A token expires at the lease deadline it was issued under. Once the
        runtime has renewed the lease since, this asks the queue (one round
        trip, under the lease guard, writing nothing) for a token carrying
        the new deadline, so the downstream call always gets a current one.
        Raises :class:`LeaseLost` if the lease is gone. Async handlers:
        ``await fx.atoken()``.
        """
        fx = self.effect
        if fx is None or fx.token is None:
            return None
        if not self._recorded and self._ctx.renewed_at > self._token_asked:
            self._ctx.check()
            self.effect = fx = self._call_begin(fx.idempotency_key)
        return fx.token

    async def atoken(self) -> str | None:
        """:meth:`fresh_token` for async handlers."""
        return await asyncio.to_thread(self.fresh_token)

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
