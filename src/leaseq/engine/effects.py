"""Effects: the intent and the response of a task's calls to the outside world.

Both are written under the lease: ``lock_lease`` checks the lease guard and
locks the task row for the transaction, so no cancel or expiry routing can
slip between the check and the write that follows it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any, overload

from ..core import action_tokens, checks
from ..core.errors import InvalidInput, InvalidTransition, LeaseLost, QueuePaused
from ..core.model import Held, Effect, EffectKind, Worker
from .common import Settings, check_claim, event, require_task, rows_of_task, to_effect, worker_id
from .replay import diverge
from .steps import BEGIN, COMMIT, Op, one, rows

#: Most actions one task may declare.
MAX_ACTIONS = 100
#: Most resources one task may declare.
MAX_RESOURCES = 1000
#: The classes a ledger entry may have (a tool call's ``effect=``).
EFFECT_CLASSES = tuple(k.value for k in EffectKind)


@overload
def check_actions(actions: None, effect: str) -> None: ...
@overload
def check_actions(actions: Iterable[str], effect: str) -> str: ...
@overload
def check_actions(actions: Iterable[str] | None, effect: str) -> str | None: ...
def check_actions(actions: Iterable[str] | None, effect: str) -> str | None:
    """The declared actions as JSON text for the task row (None: undeclared), or InvalidInput.

    A read_only task takes no actions: it may declare none (an empty list
    says the same and is stored as such).
    """
    if actions is None:
        return None
    if isinstance(actions, (str, bytes)) or not isinstance(actions, Iterable):
        raise InvalidInput("actions", f"must be a list of action names, or None (got {actions!r})")
    names = list(dict.fromkeys(checks.check_kind(a, f"actions[{i}]") for i, a in enumerate(actions)))
    if len(names) > MAX_ACTIONS:
        raise InvalidInput("actions", f"names {len(names)} actions; at most {MAX_ACTIONS}")
    if names and effect == "read_only":
        raise InvalidInput("actions", "a read_only task may take no actions; declare the task "
                                      "effect='idempotent' or effect='side_effect'")
    return json.dumps(names)


def check_resources(resources: Iterable[str] | None, effect: str) -> str | None:
    """The declared resources as JSON text for the task row (None: none declared), or InvalidInput.

    An effect may name (bind its action token to) only a resource its task
    declared; a task that declared none names none (an empty list says the
    same and is stored as None). A read_only task takes no actions, so it
    may declare none.
    """
    if resources is None:
        return None
    if isinstance(resources, (str, bytes)) or not isinstance(resources, Iterable):
        raise InvalidInput("resources", f"must be a list of resource keys, or None (got {resources!r})")
    keys = list(dict.fromkeys(checks.check_key(f"resources[{i}]", r) for i, r in enumerate(resources)))
    if len(keys) > MAX_RESOURCES:
        raise InvalidInput("resources", f"names {len(keys)} resources; at most {MAX_RESOURCES}")
    if keys and effect == "read_only":
        raise InvalidInput("resources", "a read_only task takes no actions on resources; declare the task "
                                        "effect='idempotent' or effect='side_effect'")
    return json.dumps(keys) if keys else None


def effect_refusal(held: dict[str, Any], action: str, resource: str | None) -> tuple[str, str]:
    """The field and the reason ``insert_effect`` refused an entry (its guard decides; this explains).

    ``held`` is ``lock_lease``'s row.
    """
    refusal = action_refusal(held, action)
    if refusal is not None:
        return "action", refusal
    declared = held.get("resources")
    listed = ", ".join(repr(r) for r in declared or ()) or "none"
    return "resource", (f"{resource!r} is not a resource task {held['id']} declared (declared: {listed}); "
                        "enqueue it with resources=[...]")


def action_refusal(held: dict[str, Any], action: str) -> str | None:
    """Why the task of a lease (``lock_lease``'s row) may not begin ``action``, or None if it may.

    Declared actions bind; a task that declared none may take any action
    unless it is read_only, which may take none.
    """
    declared = held["actions"]
    if held["effect"] == "read_only":
        return (f"task {held['id']} is read_only and may begin no action ({action!r} refused); "
                "enqueue it as effect='idempotent' or 'side_effect'")
    if declared is not None and action not in declared:
        listed = ", ".join(repr(a) for a in declared) or "none"
        return f"{action!r} is not an action task {held['id']} declared (declared: {listed})"
    return None


def check_call(effect: str | None, args_digest: str | None) -> None:
    """A tool call's class and argument digest (both None for a plain ctx.effect)."""
    if effect is not None and (not isinstance(effect, str) or effect not in EFFECT_CLASSES):
        raise InvalidInput("effect", f"must be one of {', '.join(EFFECT_CLASSES)} (got {effect!r})")
    if args_digest is not None:
        if (not isinstance(args_digest, str) or not 1 <= len(args_digest) <= 128
                or not all(c in "0123456789abcdef" for c in args_digest)):
            raise InvalidInput("args_digest", "must be a lowercase hex digest of at most 128 characters")
        if effect is None:
            raise InvalidInput("args_digest", "is given only with a tool call's effect class")


def diverged(existing: dict[str, Any], action: str, effect: str,
             args_digest: str | None) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """Why a recorded entry is not the call being made under its key, with what was recorded and
    what is asked (the fields that differ), or None if it is the same call."""
    key = existing["idempotency_key"]
    if existing["action"] != action:
        return (f"tool call {key!r} was recorded as action {existing['action']!r}, not {action!r}",
                {"action": existing["action"]}, {"action": action})
    if existing["effect"] != effect:
        return (f"tool call {key!r} was recorded as {existing['effect']}, not {effect}",
                {"effect": existing["effect"]}, {"effect": effect})
    if args_digest is not None and existing["args_digest"] not in (None, args_digest):
        return (f"tool call {key!r} (action {action!r}) was recorded with other arguments: the retried "
                "handler diverged from the recorded run, so neither replaying nor calling again is safe",
                {"action": action, "args_digest": existing["args_digest"]},
                {"action": action, "args_digest": args_digest})
    return None


def begin_effect(s: Settings, worker: Worker | str, claim: Held, action: str, key: str | None = None, *,
                 resource: str | None = None, effect: str | None = None,
                 args_digest: str | None = None) -> Op[Effect]:
    """:meth:`leaseq.Queue.begin_effect`."""
    wid = worker_id(worker)
    claim = check_claim(wid, claim)
    checks.check_kind(action, "action")
    if key is not None:
        checks.check_key("key", key)
    if resource is not None:
        checks.check_key("resource", resource)
    check_call(effect, args_digest)
    if effect == "read_only" and resource is not None:
        raise InvalidInput("resource", "a read_only call acts on no resource and gets no action token; "
                                       "name a resource only for an idempotent or side_effect call")
    yield BEGIN
    held = yield one("lock_lease", task_id=claim.task_id, worker_id=wid, generation=claim.generation)
    if held is None:
        raise LeaseLost(claim.task_id, claim.generation, "begin_effect refused: lease no longer held")
    entry_class = effect if effect is not None else held["effect"]
    fx_key = key if key is not None else f"{held['idempotency_key']}:{action}"
    existing = yield one("get_effect", task_id=claim.task_id, idempotency_key=fx_key)
    if existing is not None and effect is not None:
        why = diverged(existing, action, entry_class, args_digest)
        if why is not None:  # the attempt ends here, the task to needs_reconciliation
            yield from diverge(s, claim, wid, fx_key, why[0], recorded=why[1], requested=why[2])
    if existing is not None and existing["resource"] != resource:
        raise InvalidInput("resource", f"effect {fx_key!r} was begun naming resource {existing['resource']!r}, "
                                       f"not {resource!r}: one key, one resource")
    if existing is not None and existing["status"] == "done":
        if effect is not None:  # a tool call answered from the ledger: the trail says so
            yield from event(s, claim.task_id, "tool_replayed", claim.generation, wid, action=action,
                             idempotency_key=fx_key, effect_id=existing["id"], effect=entry_class,
                             recorded_generation=existing["generation"])
        # answered already: nothing to send downstream, so no token (and nothing new recorded)
        yield COMMIT
        return to_effect(existing, replayed=True)
    if existing is not None and existing["generation"] == claim.generation and existing["status"] == "pending":
        # the same attempt asks again (fx.token after a renewal): a token with the new deadline
        current = yield from signed(s, to_effect(existing), held, wid, claim.generation)
        yield COMMIT
        return current
    if held["paused"] and entry_class != "read_only":
        raise QueuePaused(f"queue {held['queue']!r} is paused: no new actions may start")
    from .budgets import gate  # budgets -> durable -> limits: imported when used
    yield from gate(s, claim, wid, held, fx_key)  # a spent budget of the tree stops the attempt here
    if existing is None:
        # insert_effect's own guard decides whether the task may begin this action on this
        # resource (a worker role calling it directly is held to it too); no row: refused
        row = yield one("insert_effect", task_id=claim.task_id, generation=claim.generation, worker_id=wid,
                        action=action, idempotency_key=fx_key, effect=entry_class, args_digest=args_digest,
                        resource=resource, tool=effect is not None)
        if row is None:
            raise InvalidInput(*effect_refusal(held, action, resource))
    else:
        # Same key, earlier attempt, no response: an idempotent task reclaimed
        # with its intent open, or one an operator requeued after
        # reconciliation. The new attempt takes the intent over; the key
        # stays, so the downstream service can deduplicate.
        row = yield one("rebind_effect", effect_id=existing["id"], task_id=claim.task_id,
                        generation=claim.generation, worker_id=wid)
    if existing is None or existing["status"] != "pending":
        yield rows("adjust_open_effects", task_id=claim.task_id, delta=1)
    detail = dict(action=action, idempotency_key=fx_key, effect_id=row["id"])
    if effect is not None:
        detail["effect"] = entry_class
    if resource is not None:
        detail["resource"] = resource
    if existing is not None:
        detail["previous_generation"] = existing["generation"]
    yield from event(s, claim.task_id, "effect_intent", claim.generation, wid, **detail)
    begun = yield from signed(s, to_effect(row), held, wid, claim.generation)
    yield COMMIT
    return begun


def signed(s: Settings, effect: Effect, held: dict[str, Any], wid: str, generation: int) -> Op[Effect]:
    """The effect with an action token scoped to it, minted in the entry's own transaction.

    A read_only entry (a lookup, a model call) takes no action: it gets no
    token, so no downstream accepts it for one. The token is bound to the
    resource the entry recorded, which its task declared (insert_effect's
    guard), and names the downstream key (``Effect.downstream_key``, namespaced
    by the task), so no task holds a token for another task's key.

    By default the token is a reference (:mod:`leaseq.core.action_tokens`):
    ``mint_action_token`` writes its claims, read from the rows under the
    lease guard, and the SHA-256 of a fresh secret; a downstream checks it
    online, and it is refused from the moment its attempt loses the lease.
    It expires at the lease deadline it was issued under, or
    ``action_token_ttl`` after issue if that is sooner (the database's clock).

    With a signer (the explicit offline mode, ``LEASEQ_ACTION_KEYS``), the
    token is HMAC-signed instead, on the database's clock (``held``'s ``now``,
    ``lock_lease``'s row) with the same expiry; whoever holds the key can
    mint one, and a superseded attempt's token is good until it expires.
    """
    if effect.effect == "read_only":
        return effect
    if s.signer is None:
        secret = action_tokens.new_secret()
        minted = yield one("mint_action_token", token_hash=action_tokens.digest(secret), effect_id=effect.id,
                           task_id=effect.task_id, generation=generation, worker_id=wid,
                           ttl_seconds=s.action_token_ttl)
        if minted is None:  # the mint's own guard refused: no token rather than a wrong one
            return effect
        return dataclasses.replace(effect, token=action_tokens.format_token(minted["id"], secret))
    token = s.signer.issue(effect.task_id, effect.generation, effect.action, effect.downstream_key,
                           s.action_token_ttl, resource=effect.resource, epoch=int(held.get("claim_epoch") or 0),
                           now=held["now"].timestamp(),
                           not_after=held["lease_expires_at"].timestamp())
    return dataclasses.replace(effect, token=token)


def check_effect_of(claim: Held, effect: Effect) -> None:
    """``effect`` is an Effect begun for ``claim``'s task (every transport checks it before sending)."""
    if not isinstance(effect, Effect):
        raise InvalidInput("effect", "must be the Effect returned by begin_effect()")
    if effect.task_id != claim.task_id:
        raise InvalidInput("effect", f"belongs to task {effect.task_id}, not task {claim.task_id}")
    if type(effect.id) is not int or not 1 <= effect.id < 2**63:
        raise InvalidInput("effect", f"has no id a ledger entry can have (got {effect.id!r})")


def finish_effect(s: Settings, worker: Worker | str, claim: Held, effect: Effect,
                  response: Any = None) -> Op[Effect]:
    """:meth:`leaseq.Queue.finish_effect`."""
    claim = check_claim(worker_id(worker), claim)
    check_effect_of(claim, effect)
    if effect.replayed:
        return effect
    return (yield from finish_effect_id(s, worker, claim, effect.id, response))


def finish_effect_id(s: Settings, worker: Worker | str, claim: Held, effect_id: int,
                     response: Any = None) -> Op[Effect]:
    """:func:`finish_effect` of the effect ``effect_id`` of the attempt's task (what the
    service is asked for): the lease guard and the ledger's own condition (an entry of
    this task open under this generation) decide, so the id alone names it."""
    wid = worker_id(worker)
    claim = check_claim(wid, claim)
    checks.check_int("effect_id", effect_id, minimum=1, maximum=2**63 - 1)
    checks.check_json("response", response)
    yield BEGIN
    if (yield one("lock_lease", task_id=claim.task_id, worker_id=wid, generation=claim.generation)) is None:
        raise LeaseLost(claim.task_id, claim.generation, "finish_effect refused: lease no longer held")
    row = yield one("finish_effect", effect_id=effect_id, task_id=claim.task_id, generation=claim.generation,
                    response=response)
    if row is None:
        raise InvalidTransition(f"effect {effect_id} is not open under generation {claim.generation}")
    yield rows("adjust_open_effects", task_id=claim.task_id, delta=-1)
    yield from event(s, claim.task_id, "effect_response", claim.generation, wid, action=row["action"],
                     idempotency_key=row["idempotency_key"], effect_id=row["id"])
    yield COMMIT
    return to_effect(row)


def effects(s: Settings, task_id: int) -> Op[list[Effect]]:
    """:meth:`leaseq.Queue.effects`: the action ledger of a task, oldest first."""
    return [to_effect(r) for r in (yield from rows_of_task(task_id, "list_effects"))]
