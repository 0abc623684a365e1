"""Budgets settled after the call: what a handler's calls actually used, charged when it is known.

A claim judges a task's limits by its ``units``, an estimate made before the
work. ``ctx.consume(limit_key, units)`` (:func:`consume`) charges what a call
actually used, once it has returned, under the lease:

- it is an entry of the task's action ledger (``<task key>:consume:<limit
  key>:<position>``), so an attempt that replays the handler reaches the
  entry and charges nothing again;
- for a limit the task names (whose claim reserved its cost in the rate
  bucket and the windows), consumption draws that reservation down first and
  charges the limit only past it (an attempt that replays a recorded consume
  settles too: its own usage is what it consumes anew); the statement that
  ends the lease gives the unused rest back (``leaseq_limit_charges``, settled by the
  ``give_back_slots`` template on PostgreSQL, by :func:`settle` on SQLite);
  for any other key the units are charged as they come;
- the units are added to the key's spend of the day and to the task's
  ``spent``; past the task's ``budget`` for the key, the attempt ends cleanly
  and the task waits in ``awaiting_approval``: its request says why (reason
  ``budget``) and the figures, and approving it may raise the budget
  (:func:`leaseq.engine.approvals.approve`, ``raise_budget=``). The next
  attempt replays the handler from its ledger and repeats nothing.

BUDGETS COVER THE TREE (schema 34). A budget on a task covers the task and
every task it spawns (``ctx.spawn``) or intends (``ctx.intend``), and theirs:
each task carries ``budget_owners``, the budgeted tasks that cover it,
root-first (a child is born with its parent's), and ``leaseq_budgets`` holds
one row per owner and key: the budget and what the owner's tree has spent.
A consume charges every owner's row that names the key (``charge_budgets``,
which locks them root-first: concurrent consumers of one tree never
deadlock), and pauses its task when any owner's tree is past its budget,
the root's first. Every other task of that tree stops at its next ledger
step (:func:`gate`: a tool call or effect begun, a wait, a spawn, an
intent; a step replayed from the ledger is not new work and passes): each
paused task asks for an approval of its own, the figures naming the owner
whose budget ran out (``owner``, when it is an ancestor's), and approving
it with ``raise_budget=`` raises that owner's budget. A task that no budget
covers pays nothing: its ``budget_owners`` is NULL, and neither statement runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..core import checks
from ..core.errors import BudgetSpent, InvalidInput, LeaseLost
from ..core.model import Held, Worker
from . import durable
from .approvals import digest_of
from .common import Settings, check_claim, event, require_task, worker_id
from .replay import diverge
from .limits import MAX_UNITS
from .steps import BEGIN, COMMIT, Op, one, rows

#: The ledger action of a consume.
CONSUME_ACTION = "leaseq.consume"
#: The most keys one budget may name.
MAX_BUDGET_KEYS = 16
#: The most days of spend one read returns.
MAX_SPEND_DAYS = 3660


def check_budget(budget: Any, field: str = "budget") -> dict[str, int] | None:
    """A budget (``{key: units}``, each at least 1), checked; None for none.

    Its keys are those ``ctx.consume`` charges: limit keys (a key without a
    limit set is counted against the budget only)."""
    if budget is None:
        return None
    if not isinstance(budget, Mapping):
        raise InvalidInput(field, f"must map keys to units, as {{'tokens': 200000}} (got {budget!r})")
    if not budget:
        raise InvalidInput(field, "names no key: give at least one, or None for no budget")
    if len(budget) > MAX_BUDGET_KEYS:
        raise InvalidInput(field, f"names {len(budget)} keys; at most {MAX_BUDGET_KEYS}")
    out: dict[str, int] = {}
    for key in sorted(budget, key=str):
        name = checks.check_name(f"{field}[{key!r}]" if isinstance(key, str) else field, key)
        out[name] = checks.check_int(f"{field}[{name!r}]", budget[key], minimum=1, maximum=MAX_UNITS)
    return out


def parse_budget(items: Iterable[str], field: str = "budget") -> dict[str, int] | None:
    """``["tokens=200000", ...]`` (the command line's ``--budget``) as a budget, checked."""
    budget: dict[str, Any] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            raise InvalidInput(field, f"must be KEY=UNITS, as tokens=200000 (got {item!r})")
        try:
            budget[key.strip()] = int(value.replace("_", ""))
        except ValueError:
            raise InvalidInput(field, f"{key}: units must be a whole number (got {value!r})") from None
    return check_budget(budget or None, field)


def raised(budget: Mapping[str, int] | None, raise_budget: Any) -> dict[str, int] | None:
    """``budget`` with ``raise_budget`` (``{key: units}`` more) added; InvalidInput
    (field ``raise_budget``) for a bad raise or a key the budget does not name."""
    more = check_budget(raise_budget, "raise_budget")
    if more is None:
        return None
    current = dict(budget or {})
    unknown = sorted(set(more) - set(current))
    if unknown:
        listed = ", ".join(sorted(current)) or "none"
        raise InvalidInput("raise_budget", f"names {', '.join(unknown)}, which the task's budget does not "
                                           f"(its keys: {listed})")
    return {key: current[key] + more.get(key, 0) for key in sorted(current)}


def check_consume(limit_key: Any, units: Any) -> tuple[str, int]:
    """A consume's limit key and units (a whole number, 0 or more), checked."""
    return (checks.check_name("limit_key", limit_key),
            checks.check_int("units", units, minimum=0, maximum=MAX_UNITS))


def consume(s: Settings, worker: Worker | str, claim: Held, key: str, limit_key: str,
            units: int) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.consume`: ``units`` of ``limit_key`` used by this attempt, charged
    under the lease and recorded in the ledger under ``key``.

    Answers ``{"state": "charged", ...}``, or ``"replayed"`` (an earlier attempt recorded
    this entry: nothing is charged again), or ``"paused"``: a budget covering the task (its
    own, or an ancestor's: see the module's doc) is spent, the attempt has ended and the
    task awaits an approval; ``figures`` are its request's. Each answer names
    ``limit_key``, ``units`` (as recorded), and, when charged, the task's own ``spent`` and
    ``budget`` of the key (None: no budget of its own)."""
    wid = worker_id(worker)
    claim = check_claim(wid, claim)
    checks.check_key("key", key)
    limit_key, units = check_consume(limit_key, units)
    guard = dict(task_id=claim.task_id, worker_id=wid, generation=claim.generation)
    yield BEGIN
    held = yield one("lock_lease", **guard)
    if held is None:
        raise LeaseLost(claim.task_id, claim.generation, "consume refused: lease no longer held")
    entry = yield one("get_effect", task_id=claim.task_id, idempotency_key=key)
    if entry is not None:
        if entry["action"] != CONSUME_ACTION:
            yield from diverge(s, claim, wid, key, f"ledger entry {key!r} was recorded as action "
                                                   f"{entry['action']!r}, not {CONSUME_ACTION!r}: the retried "
                                                   "handler diverged from the recorded run",
                               recorded={"action": entry["action"]}, requested={"action": CONSUME_ACTION})
        recorded = entry["response"] or {}
        # an attempt that replays a consume settles its usage of the key: its claim's
        # reservation is reconciled to what it consumes itself (nothing, so far)
        yield one("charge_attempt", **guard, key=recorded.get("limit", limit_key), units=0)
        yield COMMIT
        return {"state": "replayed", "limit_key": recorded.get("limit", limit_key),
                "units": recorded.get("units", units), "key": key}
    yield one("record_wait", **guard, action=CONSUME_ACTION, idempotency_key=key,
              response={"limit": limit_key, "units": units}, seconds=None, until=None)
    # the attempt's reservation first (a limit its task names), the limit past it
    charge = units
    drawn = yield one("charge_attempt", **guard, key=limit_key, units=units)
    if drawn is not None:
        reserved, after = int(drawn["reserved"]), int(drawn["consumed"])
        charge = max(0, after - reserved) - max(0, after - units - reserved)
    if charge:
        yield one("charge_limit", **guard, key=limit_key, units=charge)
    yield one("record_spend", **guard, key=limit_key, units=units)
    task = yield one("charge_task", **guard, key=limit_key, units=units)
    if task is None:  # lock_lease holds the row in this transaction: never
        raise LeaseLost(claim.task_id, claim.generation, "consume refused: lease no longer held")
    budget = None if task["budget_units"] is None else int(task["budget_units"])
    spent = int(task["spent_units"])
    answer: dict[str, Any] = {"state": "charged", "limit_key": limit_key, "units": units, "key": key,
                              "spent": spent, "budget": budget}
    if held["budget_owners"] is not None:
        # the budgets that cover the task (its own, its ancestors'), charged root-first
        charged = yield rows("charge_budgets", **guard, key=limit_key, units=units)
        over = next((r for r in sorted(charged, key=lambda r: int(r["owner_id"]))
                     if int(r["spent_units"]) > int(r["budget_units"])), None)
        if over is None:  # a budget of another key of the tree's, spent by another task
            over = yield one("budget_spent", **guard)
        if over is not None:
            figures = _figures(claim.task_id, over)
            if over["key"] == limit_key:
                figures["units"] = units
            yield from _pause(s, claim, wid, key, figures)
            answer.update(state="paused", figures=figures)
    yield COMMIT
    return answer


def _figures(task_id: int, row: dict[str, Any]) -> dict[str, Any]:
    """An approval request's figures for the budget row ``row`` spent: its key, the budget,
    what its tree has spent, and its ``owner`` when that is another task (an ancestor)."""
    figures: dict[str, Any] = {"key": row["key"], "budget": int(row["budget_units"]),
                               "spent": int(row["spent_units"])}
    if int(row["owner_id"]) != task_id:
        figures["owner"] = int(row["owner_id"])
    return figures


def gate(s: Settings, claim: Held, wid: str, held: dict[str, Any], key: str) -> Op[None]:
    """Before the ledger entry ``key`` is begun under the lease (``held``: lock_lease's row, in
    the open transaction): if a budget covering the task is spent, by this task or another of
    its tree, the attempt stops here, nothing of the step written: it asks a person (reason
    ``budget``, the figures) and ends, the transaction commits, and :class:`BudgetSpent` is
    raised. A task no budget covers pays nothing."""
    if held.get("budget_owners") is None:
        return
    over = yield one("budget_spent", task_id=claim.task_id, worker_id=wid, generation=claim.generation)
    if over is None:
        return
    figures = _figures(claim.task_id, over)
    yield from _pause(s, claim, wid, key, figures)
    yield COMMIT
    raise BudgetSpent(claim.task_id, claim.generation, figures)


def _pause(s: Settings, claim: Held, wid: str, key: str, figures: dict[str, Any]) -> Op[None]:
    """A budget covering the task is spent (``figures``): the attempt asks a person for more
    and ends (its lease, slots and reservation given back, the attempt given back too: a
    pause is no failure); the task waits in awaiting_approval."""
    task = yield from require_task(claim.task_id)
    requested = yield one("budget_request", task_id=claim.task_id, worker_id=wid, generation=claim.generation,
                          digest=digest_of(task), requested_by=f"task:{claim.task_id}", detail=figures)
    if requested is None:  # lock_lease holds the row in this transaction: never
        raise LeaseLost(claim.task_id, claim.generation, "budget request refused: lease no longer held")
    yield from event(s, claim.task_id, "budget_exceeded", claim.generation, wid, **figures)
    yield from durable.suspend(s, claim, wid, key, until=None, signal=None, approval=True)


def settle(s: Settings, task_ids: list[int]) -> Op[None]:
    """On a backend whose statements that end a lease do not settle the attempt's
    reservations themselves: the unused rest of what the ended attempts of ``task_ids``
    reserved and consumed against, credited back (in the open transaction)."""
    if not task_ids or s.backend.own_limit_slots:
        return
    credits = yield rows("drop_charges", task_ids=task_ids)
    items = [{"key": r["key"], "credit": r["credit"], "claimed": r["claimed"]} for r in credits if r["credit"]]
    if items:
        yield rows("settle_charges", items=items)


def limit_spend(s: Settings, key: str | None = None, *, days: int = 7) -> Op[list[dict[str, Any]]]:
    """:meth:`leaseq.Queue.limit_spend`."""
    if key is not None:
        checks.check_name("key", key)
    days = checks.check_int("days", days, minimum=1, maximum=MAX_SPEND_DAYS)
    yield BEGIN
    found = yield rows("limit_spend", key=key, days=days)
    yield COMMIT
    return [{"key": r["key"], "day": str(r["day"]), "units": int(r["units"]),
             "tenants": {tenant: int(units) for tenant, units in sorted(_json(r["tenants"]).items())}}
            for r in found]


def _json(value: Any) -> dict[str, Any]:
    """A JSON object column: decoded by the driver (PostgreSQL's jsonb) or JSON text (SQLite)."""
    return json.loads(value) if isinstance(value, str) else dict(value)
