"""Fair share across tenants: weighted round robin between fairness keys, decided in the claim.

A task may name a **fairness key** (a tenant, a customer, any group) and a
**weight** (``enqueue(..., fairness_key=..., fairness_weight=...)``, 1 by
default). Within one priority, the claim serves the keys that have tasks
ready in weighted round robin, by virtual time (start-time fair queueing),
each priority on its own:

- each key has a virtual time at each priority (``leaseq_fairness.vtime``);
  every task claimed under it moves it on by the task's cost, ``1 / weight``;
- a task's place is its key's start plus the cost of it and of the key's
  tasks before it (its virtual finish); the claim hands out the lowest
  finishes first, priority before all of it, FIFO within a key;
- a key's start is its own virtual time, but never more than one task's
  cost behind the priority's (the latest virtual time at which a task of it
  was served): a key new, or back from idle, starts level with the others
  and is owed nothing, so a deep backlog of one key delays another key's
  next task by about one claim; a key waiting its turn never falls that far
  behind (every task served before it started before its turn), so it keeps
  its place;
- the tasks without a key are one more key (``''``) between them.

All of it is decided in the claim statement, the one that leases the
tasks: on PostgreSQL ``claim_fair``, where the candidates are locked as they
are read in this order (a claim beside it skips them and takes the next ones
in the same order, as it would have after it) and the keys are charged in
the statement, each in the share of the claim's connection (schema 37:
``leaseq_fairness`` is a view summing the shares, and no claim waits on
another's to charge a key); SQLite writes one transaction at a time, and the
caller charges the keys (``charge_fair_share``) in the claim's transaction.

Where one key alone is queued and no task without a key is ready (one
tenant's backlog), PostgreSQL's ``claim_fair`` answers ``fair_one``, and the
queue's next claims run ``claim_fair_one`` (:attr:`Settings.fair_one_queues`),
its steps for that case alone, the key charged by the same templates; it
claims nothing and answers ``fair_one`` false when another key (or a task
without one) is ready, and the claim then runs ``claim_fair``. While none of
the queue's tasks ever named a limit or a singleton key (schema 40), it is
``claim_fair_one_plain``, the same claim without the steps of those; it claims
nothing and answers ``limited_due`` once the queue has such a task, and the
queue's one-key claims are ``claim_fair_one`` from then on
(:attr:`Settings.limited_queues`).

A queue that names no fairness key pays one probe of an empty index: on
PostgreSQL ``claim_batch`` reads its claimable index as before, and only
when it finds a key queued does it claim nothing and answer ``fair_due``;
the claim then runs ``claim_fair``, and the queue's next claims run it at
once (:attr:`Settings.fair_queues`) until it finds no key queued. SQLite's
``claim_batch`` is ``claim_fair`` (a second statement costs no round trip
there, and the claim of a queue without keys reads none of the fair steps'
rows).

A queue none of whose tasks ever named a fairness key, a limit or a
singleton key does not pay that probe on PostgreSQL: it is claimed by
``claim_plain`` (the backend's ``lean_claim``), which reads whether the queue
was ever given such a task (schema 39) in its own snapshot, and claims
nothing when it was; the queue's claims are ``claim_batch`` from then on
(:attr:`Settings.full_queues`).
"""

from __future__ import annotations

import math
from typing import Any

from ..core import checks
from ..core.errors import InvalidInput
from .common import Settings
from .steps import BEGIN_ONE, COMMIT, Op, one, rows

#: The range of a fairness weight: a key's share against another's, up to a million to one.
MIN_WEIGHT, MAX_WEIGHT = 0.001, 1000.0


def check_weight(fairness_weight: Any) -> float:
    """A fairness weight, checked: a positive number within the range above."""
    if isinstance(fairness_weight, bool) or not isinstance(fairness_weight, (int, float)) \
            or not math.isfinite(fairness_weight):
        raise InvalidInput("fairness_weight", f"must be a positive number (got {fairness_weight!r})")
    if not MIN_WEIGHT <= fairness_weight <= MAX_WEIGHT:
        raise InvalidInput("fairness_weight", f"must be between {MIN_WEIGHT:g} and {MAX_WEIGHT:g} "
                                              f"(got {fairness_weight!r})")
    return float(fairness_weight)


def check_fairness(fairness_key: Any, fairness_weight: Any) -> dict[str, Any]:
    """An enqueue's ``fairness_key`` and ``fairness_weight``, checked (InvalidInput names the
    field), as the task columns: the weight is stored with a key only (None without one)."""
    weight = check_weight(fairness_weight)
    if fairness_key is None:
        if weight != 1:
            raise InvalidInput("fairness_weight", "applies to a fairness key: give fairness_key with it")
        return dict(fairness_key=None, fairness_weight=None)
    return dict(fairness_key=checks.check_key("fairness_key", fairness_key), fairness_weight=weight)


def charge(s: Settings, claimed: list[dict[str, Any]]) -> Op[None]:
    """Charge the keys of the tasks a claim handed out, in the claim's transaction, where
    the backend's claim statement does not (``own_fair_share``); nothing to run otherwise,
    nor for a claim of a queue without fairness keys (its rows carry no ``fair_key``)."""
    if s.backend.own_fair_share:
        return
    items = [{"key": r["fair_key"], "priority": r["priority"], "start": r["fair_start"], "cost": r["fair_cost"]}
             for r in claimed if r.get("fair_key") is not None]
    if items:
        yield rows("charge_fair_share", queue=claimed[0]["queue"], items=items)


def service_order(row: dict[str, Any]) -> tuple[Any, ...]:
    """A claimed row's place in its claim's answer: priority, then its virtual finish
    (None: the queue uses no fairness keys), then when it was due and its id."""
    return (-row["priority"], row.get("fair_tag") or 0.0, row["available_at"], row["id"])


def claim_rows(s: Settings, params: dict[str, Any], *, route_first: bool,
               one_statement: bool) -> Op[list[dict[str, Any]]]:
    """The claim statement's answer, in the open transaction: ``claim_plain`` where the
    backend has a lean claim and the queue's tasks never named a key (it stands aside,
    having claimed nothing, when they have); else ``claim_batch``, or ``claim_fair`` where
    the queue uses fairness keys (its last claim found one, or ``claim_batch`` finds one
    now and stands aside, having claimed nothing).
    ``one_statement``: the transaction was opened for one statement, so a second one
    runs in a transaction of its own."""
    queue = params["queue"]
    fair = queue in s.fair_queues
    if not fair and s.backend.lean_claim and queue not in s.full_queues:
        # the lean claim, for a queue whose tasks never named a key (a fairness key, a
        # limit, a singleton key); its row of flags says when the queue has one
        # (full_due: it claimed nothing), and the queue's claims run in full from then on
        found: list[dict[str, Any]] = yield rows("claim_plain", route_first=route_first, **params)
        if not found[0]["full_due"]:
            return found
        s.full_queues.add(queue)
        if one_statement:
            yield COMMIT
            yield BEGIN_ONE
    if fair and queue in s.fair_one_queues:
        # the one-key claim, while one key alone is queued (claim_fair's fair_one said
        # so); its row of flags says when that no longer holds (fair_one false: it
        # claimed nothing), and claim_fair claims then. Its lean form while the queue's
        # tasks never named a limit or a singleton key: its flags say when they have
        # (limited_due: it claimed nothing), and claim_fair_one claims from then on
        lean = queue not in s.limited_queues
        found = yield rows("claim_fair_one_plain" if lean else "claim_fair_one", route_first=route_first, **params)
        if lean and found[0]["limited_due"]:
            s.limited_queues.add(queue)
            if found[0]["fair_one"]:
                if one_statement:
                    yield COMMIT
                    yield BEGIN_ONE
                found = yield rows("claim_fair_one", route_first=route_first, **params)
                lean = False
        if found[0]["fair_one"] and not (lean and found[0]["limited_due"]):
            return found
        s.fair_one_queues.discard(queue)
        if one_statement:
            yield COMMIT
            yield BEGIN_ONE
    found = yield rows("claim_fair" if fair else "claim_batch", route_first=route_first, **params)
    if not fair:
        # claim_batch stood aside: its row of flags says so (PostgreSQL), or it claimed
        # nothing and fair_due tells (SQLite, whose statement answers no row then)
        if found:
            due = found[0]["id"] is None and bool(found[0].get("fair_due"))
        else:
            due = bool(((yield one("fair_due", queue=queue)) or {}).get("fair_due"))
        if not due:
            return found
        if one_statement and found:
            yield COMMIT
            yield BEGIN_ONE
        found = yield rows("claim_fair", route_first=route_first, **params)
    if _keys_left(found):
        s.fair_queues.add(queue)
    else:
        s.fair_queues.discard(queue)
    # one key alone queued (PostgreSQL's claim_fair says so): the next claim is claim_fair_one
    if s.backend.lean_claim and found and found[0].get("fair_one"):
        s.fair_one_queues.add(queue)
    return found


def _keys_left(found: list[dict[str, Any]]) -> bool:
    """Whether claim_fair's answer leaves the queue using fairness keys: its flag
    (PostgreSQL's rows carry fair_due), or a task served under a key (SQLite's claimed
    rows: none was, in FIFO order, when no key is queued). Nothing claimed on SQLite
    says nothing: the queue's next claim runs claim_fair again."""
    if found and "fair_due" in found[0]:
        return bool(found[0]["fair_due"])
    return not found or any(r.get("fair_key") is not None for r in found)
