# Generated from effects_async.py by `python -m leaseq.queue.generate`: do not edit.
"""The action ledger: a tool call's intent recorded before it is made, its response after.

Both writes are guarded by the lease; a response recorded under a key is
replayed to a later attempt instead of calling again.
"""

from __future__ import annotations

from typing import Any

from .. import engine
from ..core.model import Claim, Effect, Worker
from .base import QueueBase


class EffectOps(QueueBase):
    """The action ledger operations of :class:`leaseq.Queue`."""

    def begin_effect(self, worker: Worker | str, claim: Claim, action: str, key: str | None = None, *,
                     resource: str | None = None, effect: str | None = None,
                     args_digest: str | None = None) -> Effect:
        """Record the intent of a tool call before making it, under the lease guard.

        ``key`` (the action's idempotency key) defaults to one derived from the
        task's idempotency key and ``action``, so it is the same on every
        attempt. If an earlier attempt already recorded a response under that
        key, that effect is returned with ``replayed=True``: do not call again.
        Raises :class:`QueuePaused` while the queue's off-switch is on, and
        :class:`InvalidInput` (field ``action``) for an action the task may
        not take: one it did not declare (``actions=``), or any action of a
        read_only task.

        With a signing key the effect carries ``token``, naming the task, the
        generation, the action, the key and ``resource`` when given; it
        expires at the lease deadline (or after ``action_token_ttl``, if
        sooner). Calling again for the same pending effect returns it with a
        token re-issued from the current deadline (the worker does so after
        each renewal); nothing is written then.

        ``effect`` and ``args_digest`` make the entry a tool call (what
        :meth:`leaseq.TaskContext.tool` sends): ``effect`` is the call's own
        class (read_only, idempotent, side_effect; default: the task's), and
        only an open side_effect entry sends an expired or failed attempt to
        reconciliation. A read_only call is no action: any task may make it.
        A replayed tool call writes a ``tool_replayed`` event, and one whose
        recorded action, class or ``args_digest`` differs ends the attempt (the
        task goes to needs_reconciliation, with a ``diverged`` event naming the
        entry) and raises :class:`leaseq.ToolCallDiverged`.
        """
        return self._run(engine.effects.begin_effect(self.settings, worker, claim, action, key,
                                                     resource=resource, effect=effect,
                                                     args_digest=args_digest))

    def finish_effect(self, worker: Worker | str, claim: Claim, effect: Effect, response: Any = None) -> Effect:
        """Record the response of a tool call whose intent :meth:`begin_effect` recorded."""
        return self._run(engine.effects.finish_effect(self.settings, worker, claim, effect, response))

    # -- durable waits (a handler's ctx.sleep and ctx.wait_for_signal) --------

    def sleep(self, worker: Worker | str, claim: Claim, key: str, *, seconds: float | None = None,
              until: Any = None) -> dict[str, Any]:
        """A durable sleep of the attempt, recorded in the ledger under ``key`` (what ``ctx.sleep`` sends).

        The first attempt to reach ``key`` records the wake time: ``seconds`` from now by the
        database's clock, or ``until`` (an aware datetime or Unix seconds). Once that time has
        passed the answer is ``{"state": "resumed", "until": ...}`` and the handler goes on; before
        it, the attempt ends under the lease guard (``{"state": "suspended"}``): the lease is
        released, the attempt is given back (a sleep is no failure and no try), and the task waits
        in ``waiting``, claimable again at its wake time. Raises :class:`LeaseLost` without
        authority.
        """
        return self._run(engine.durable.sleep(self.settings, worker, claim, key, seconds=seconds, until=until))

    def wait_signal(self, worker: Worker | str, claim: Claim, key: str, name: str, *,
                    timeout: float | None = None, ask: dict[str, Any] | None = None) -> dict[str, Any]:
        """A durable wait for the signal ``name`` (:meth:`signal`), recorded under ``key`` (what
        ``ctx.wait_for_signal`` sends).

        A signal of that name kept for the task is consumed now, once, under the lease guard,
        and recorded in the ledger (``{"state": "received", "payload": ..., "sent_by": ...}``;
        a later attempt gets the same answer, ``replayed``). Else, past ``timeout`` seconds from
        the first attempt that waited, ``{"state": "timed_out"}``; else the attempt ends as a
        sleep does (``{"state": "suspended"}``) and the task waits, claimable at once when the
        signal comes, or at the timeout.

        With ``ask`` (``{"question": text, "schema": JSON schema}``: what ``ctx.ask`` sends)
        the wait is for a person's answer (``name`` is ``"leaseq.answer"``): the question and
        its schema are recorded with the wait, listed by :meth:`asks` while it is open, and
        :meth:`answer` sends the answer once it fits the schema.
        """
        return self._run(engine.durable.wait_signal(self.settings, worker, claim, key, name, timeout=timeout,
                                                    ask=ask))

    # -- streams (a handler's ctx.emit) ----------------------------------------

    def emit(self, worker: Worker | str, claim: Claim, item: Any, *, key: str | None = None) -> dict[str, Any]:
        """Append ``item`` (JSON, at most 64 KiB) to the task's stream, under the lease guard (what
        ``ctx.emit`` sends). Answers ``{"seq": ..., "generation": ..., "replayed": False}``: ``seq``
        is the entry's cursor in the stream (see :meth:`stream`).

        The first entry an attempt appends comes after a ``reset`` entry of its generation.
        With ``key`` the item is durable: it is recorded in the action ledger under ``key`` in
        the same transaction, and a later attempt that emits under the same key gets the
        recorded entry back (``"replayed": True``) and appends nothing. Raises
        :class:`LeaseLost` without authority.
        """
        return self._run(engine.streams.emit(self.settings, worker, claim, item, key=key))

    # -- usage settled after the call (a handler's ctx.consume) ---------------

    def consume(self, worker: Worker | str, claim: Claim, key: str, limit_key: str, units: int) -> dict[str, Any]:
        """Charge ``units`` of ``limit_key`` that this attempt actually used, under the lease guard,
        recorded in the ledger under ``key`` (what ``ctx.consume`` sends).

        The entry is written once: an attempt that reaches a recorded ``key`` is answered
        ``{"state": "replayed"}`` and nothing is charged again. Otherwise the units are
        charged (``{"state": "charged", "spent": ..., "budget": ...}``): for a limit the task
        names, its claim's reservation is drawn down first and only the rest is charged to the
        limit's bucket and windows now (the reservation left unused comes back when the
        attempt ends); for any other key, all of them. They count in the key's spend of the day
        (:meth:`limit_spend`) and the task's ``spent``. When that passes the task's
        ``budget`` of the key, the attempt ends too (``{"state": "paused"}``): the lease and the
        attempt are given back and the task waits in ``awaiting_approval`` (the request's
        ``reason`` is ``"budget"``). Raises :class:`LeaseLost` without authority.
        """
        return self._run(engine.budgets.consume(self.settings, worker, claim, key, limit_key, units))

    def effects(self, task_id: int) -> list[Effect]:
        """The action ledger of a task, oldest first."""
        return self._run(engine.effects.effects(self.settings, task_id))
