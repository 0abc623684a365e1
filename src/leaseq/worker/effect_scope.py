"""One tool call's entry in the action ledger, while the handler makes it (``with ctx.effect(...) as fx``).

The intent is written under the lease guard on entry, the response on
:meth:`EffectScope.record` (or an empty one on a clean exit); a response
recorded by an earlier attempt is replayed instead. Created by
:meth:`leaseq.TaskContext.effect` and :meth:`leaseq.TaskContext.tool`.

A ledger write that meets the infrastructure's trouble (the database
unreachable or failing over, the service restarting, rate limited) is tried
again, with backoff, while the lease may still be live: the queue's trouble
is never the handler's failure. Once the lease can no longer be met, the
write raises :class:`leaseq.LeaseLost`: the attempt ends as a lost lease,
and the recovery policy, not the handler's retry budget, routes the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..core.errors import InvalidTransition, LeaseLost, is_transient
from ..core.model import Effect, format_fencing_token
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

    def _begin_args(self, key: str | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The begin_effect call's arguments; notes when the action token was asked for."""
        ctx = self._ctx
        self._token_asked = time.monotonic()
        extra = dict(self._call) if self.resource is None else {"resource": self.resource, **self._call}
        return (ctx.worker, ctx.claim, self.action, key), extra

    @contextlib.contextmanager
    def _guarded(self) -> Iterator[None]:
        """A ledger call: a refusal by the lease guard is the handler's lost lease."""
        try:
            yield
        except LeaseLost as exc:
            self._ctx._refused(exc)
            raise

    def _pause(self, op: str, exc: BaseException, tries: int) -> float:
        """After a ledger write's ``tries``-th failure in transit: how long to wait before the next try,
        or :class:`LeaseLost` when the lease could run out first (never the handler's failure)."""
        return self._ctx.transit_pause(f"{op} of {self.action!r}", exc, tries)

    def _call_begin(self, key: str | None) -> Effect:
        args, extra = self._begin_args(key)
        tries = 0
        while True:
            try:
                with self._guarded():
                    effect: Effect = self._ctx.port_call("begin_effect", *args, **extra)
                    return effect
            except Exception as exc:
                if not is_transient(exc):
                    raise
                tries += 1
                time.sleep(self._pause("begin_effect", exc, tries))

    async def _acall_begin(self, key: str | None) -> Effect:
        args, extra = self._begin_args(key)
        tries = 0
        while True:
            try:
                with self._guarded():
                    effect: Effect = await self._ctx.aport_call("begin_effect", *args, **extra)
                    return effect
            except Exception as exc:
                if not is_transient(exc):
                    raise
                tries += 1
                await asyncio.sleep(self._pause("begin_effect", exc, tries))

    # The intent is written on entry, under the lease guard.
    @contextlib.contextmanager
    def _opening(self) -> Iterator[None]:
        self._ctx.check()
        self._span = tracing.start_effect(self._ctx, self.action, self._key)
        try:
            yield
        except BaseException as exc:
            tracing.end_effect(self._span, exc)
            raise
        assert self.effect is not None
        self._recorded = self.effect.replayed

    def _begin(self) -> EffectScope:
        with self._opening():
            self.effect = self._call_begin(self._key)
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
        with self._opening():
            self.effect = await self._acall_begin(self._key)
        return self

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
        """The key to send to the downstream API: ``"<task_id>:<ledger key>"``.

        Stable across attempts and namespaced by the task, so no other task
        can use it first (see :attr:`leaseq.Effect.downstream_key`); the
        action token names the same key.
        """
        assert self.effect is not None
        return self.effect.downstream_key

    @property
    def ledger_key(self) -> str:
        """The entry's key in the task's action ledger (``key=``, or the default one)."""
        assert self.effect is not None
        return self.effect.idempotency_key

    @property
    def generation(self) -> int:
        """This attempt's claim generation."""
        assert self.effect is not None
        return self.effect.generation

    @property
    def fencing_token(self) -> str:
        """This attempt's fencing token, ``"<task_id>.<epoch>.<generation>"`` (``"<task_id>.<generation>"``
        when the claim's lease epoch is 0, as on SQLite), for :meth:`leaseq.fencing.FencedStore.apply`.
        It names its task: a fence compares it only with the same task's attempts, the lease epoch
        first, so an attempt made before the queue's database failed over is older than any after."""
        assert self.effect is not None
        return format_fencing_token(self.effect.task_id, self.effect.generation, self._ctx.claim.epoch)

    @property
    def token(self) -> str | None:
        """The action token for this one action of this attempt: a reference the queue's
        database minted (checked online downstream), or, in the offline mode (the queue has
        ``LEASEQ_ACTION_KEYS``), an HMAC-signed one; None for a read_only entry or a replay
        of an answered one. See :meth:`fresh_token`."""
        return self.fresh_token()

    def fresh_token(self) -> str | None:
        """The action token, valid until the current lease deadline.

        A token expires at the lease deadline it was issued under. Once the
        runtime has renewed the lease since, this asks the queue (one round
        trip, under the lease guard; a reference token is one new row) for a
        token carrying the new deadline, so the downstream call always gets a
        current one.
        Raises :class:`LeaseLost` if the lease is gone. Async handlers:
        ``await fx.atoken()``.
        """
        if self._token_outdated():
            assert self.effect is not None
            self.effect = self._call_begin(self.effect.idempotency_key)
        return None if self.effect is None else self.effect.token

    def _token_outdated(self) -> bool:
        """Whether the action token was issued under a lease deadline renewed since (and
        the call is still open): then it is asked for again, the lease checked first."""
        fx = self.effect
        if fx is None or fx.token is None or self._recorded or self._ctx.renewed_at <= self._token_asked:
            return False
        self._ctx.check()
        return True

    async def atoken(self) -> str | None:
        """:meth:`fresh_token` for async handlers."""
        if self._token_outdated():
            assert self.effect is not None
            self.effect = await self._acall_begin(self.effect.idempotency_key)
        return None if self.effect is None else self.effect.token

    def record(self, response: Any) -> None:
        """Record the external response, under the lease guard."""
        if self._recorded:
            return
        assert self.effect is not None, "record() outside the effect block"
        tries = 0
        while True:
            try:
                with self._guarded():
                    self.effect = self._ctx.port_call("finish_effect", self._ctx.worker, self._ctx.claim, self.effect,
                                                      response)
                break
            except Exception as exc:
                if tries and isinstance(exc, InvalidTransition):
                    self.effect = self._written_in_transit(response)
                    break
                if not is_transient(exc):
                    raise
                tries += 1
                time.sleep(self._pause("finish_effect", exc, tries))
        self._recorded = True

    def _written_in_transit(self, response: Any) -> Effect:
        """A try lost in transit was written: the retry, under the lease guard still held by this
        attempt, found the entry no longer open under it, and no other attempt can have closed it."""
        assert self.effect is not None
        return dataclasses.replace(self.effect, status="done", response=response)

    async def arecord(self, response: Any) -> None:
        """:meth:`record` for async handlers."""
        if self._recorded:
            return
        assert self.effect is not None, "arecord() outside the effect block"
        # The call was made: its response is recorded even if the handler is cancelled
        # meanwhile (a timeout), as a blocking call in a thread would be, so that the
        # next attempt replays it rather than sending the task to reconciliation.
        writing = asyncio.ensure_future(self._afinish(response))
        with self._guarded():
            try:
                self.effect = await asyncio.shield(writing)
            except asyncio.CancelledError:
                writing.add_done_callback(_retrieved)
                raise
        self._recorded = True

    async def _afinish(self, response: Any) -> Effect:
        """finish_effect, awaited, tried again after a failure in transit (see :meth:`record`)."""
        assert self.effect is not None
        tries = 0
        while True:
            try:
                effect: Effect = await self._ctx.aport_call("finish_effect", self._ctx.worker, self._ctx.claim,
                                                            self.effect, response)
                return effect
            except Exception as exc:
                if tries and isinstance(exc, InvalidTransition):
                    return self._written_in_transit(response)
                if not is_transient(exc):
                    raise
                tries += 1
                await asyncio.sleep(self._pause("finish_effect", exc, tries))


def _retrieved(writing: asyncio.Future[Any]) -> None:
    """A response written on after its handler was cancelled: its outcome is read, and dropped."""
    if not writing.cancelled():
        writing.exception()
