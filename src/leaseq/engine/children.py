"""Child tasks: a handler spawns tasks and waits for them, and a cancel takes the tree.

``ctx.spawn(kind, payload, key=...)`` enqueues a child task under the
spawning task's lease, in one transaction with its ledger entry (action
``leaseq.spawn``, key ``spawn:<key>``), whose response names the child: a
retried attempt that spawns the same ``key`` is answered from the ledger with
the same child, and never writes a second one (the child's idempotency key is
derived from the parent's and ``key`` too, :func:`child_key`). The child
records its parent (``parent_id``) and is born with ``has_dependents``, so
whatever ends it takes the settling path
(:func:`leaseq.engine.dependencies.settle_dependents`).

``ctx.wait_for(handle)`` and ``ctx.wait_for_all(handles)`` are durable waits
(:mod:`.durable`): when every child has ended, the outcome (the results in
order, or the first child that ended without success) is recorded in the
ledger (``<task key>:children:<position>``) and returned, now and on every
later attempt; else the attempt ends under the lease and the task waits
holding no lease and no slot (``wait_children``), until the transaction that
ends the last of them makes it claimable again
(:func:`leaseq.engine.dependencies.wake_parents`).

Cancelling a task (:func:`leaseq.engine.operator.cancel`) cancels, in the same
transaction, its children that have not ended and theirs (:func:`cancel_below`),
and reports for each child, each intent and each open ledger entry of the tree
a disposition: ``completed`` (it was done before the cancel), ``unknown`` (it
had started and may have acted: a lease was held, or a side effect was begun
with no response recorded) or ``not_started`` (nothing of it was under way).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from ..core import checks
from ..core.errors import InvalidInput, NotFound
from ..core.model import Held, Status, Task, Worker
from .limits import release as release_slots
from .common import Settings, check_claim, event, event_params, to_task, worker_id
from .dependencies import settle_dependents
from .durable import _PRECISION, MAX_WAIT_SECONDS, _entry, _lease, _record, _wait_key, suspend
from .enqueue import existing_task, same_task, task_params
from .intents import cancel_with_parents
from .replay import diverge
from .steps import BEGIN, COMMIT, Op, one, rows

#: The ledger actions of a spawn and of a wait for children.
SPAWN_ACTION = "leaseq.spawn"
CHILDREN_ACTION = "leaseq.children"
#: The statuses a child ends in: its parent's wait for it is over.
ENDED = frozenset(s.value for s in (Status.COMPLETED, Status.CANCELLED, Status.DEAD, Status.DENIED, Status.EXPIRED))
#: The most children one wait may name.
MAX_WAIT_CHILDREN = 1000
#: The dispositions a cancel tree reports.
DISPOSITIONS = ("completed", "unknown", "not_started")
_KEY_MAX = 255


def child_key(parent_key: str, key: str) -> str:
    """The idempotency key of the child ``key`` of the task whose key is ``parent_key``:
    ``<parent key>/child/<key>`` when it fits, else a digest of both."""
    readable = f"{parent_key}/child/{key}"
    if len(readable) <= _KEY_MAX:
        return readable
    return "child:sha256:" + hashlib.sha256(f"{parent_key}\0{key}".encode("utf-8")).hexdigest()


def spawn_key(key: str) -> str:
    """The ledger key of the spawn of child ``key``."""
    fx_key = f"spawn:{key}"
    return fx_key if len(fx_key) <= _KEY_MAX else "spawn:sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def check_children(child_ids: Any) -> list[int]:
    """The task ids a wait names (``ctx.wait_for_all``), in order: 1 to 1000 of them."""
    if isinstance(child_ids, (str, bytes, dict)) or not isinstance(child_ids, Iterable):
        raise InvalidInput("children", f"must be a list of child task ids (got {child_ids!r})")
    ids = [checks.check_task_id(i, f"children[{n}]") for n, i in enumerate(child_ids)]
    if not ids:
        raise InvalidInput("children", "must name at least one child task")
    if len(ids) > MAX_WAIT_CHILDREN:
        raise InvalidInput("children", f"names {len(ids)} tasks; at most {MAX_WAIT_CHILDREN}")
    return ids


def spawn(s: Settings, worker: Worker | str, claim: Held, kind: str, payload: Any = None, *, key: str,
          queue: str | None = None, effect: str = "read_only", priority: int = 0, max_attempts: int = 5,
          lease_seconds: float = checks.DEFAULT_LEASE_SECONDS, actions: Iterable[str] | None = None,
          timeout: float | None = None, limits: Iterable[str] | None = None, units: int = 1,
          resources: Iterable[str] | None = None) -> Op[Task]:
    """:meth:`leaseq.Queue.spawn`: the child task (the one written first, on a replay).

    ``queue``: the child's queue (None: the spawning task's own).
    """
    wid = worker_id(worker)
    claim = check_claim(wid, claim)
    key = checks.check_key("key", key)
    if queue is not None:
        checks.check_name("queue", queue)
    params = task_params(kind, payload, effect=effect, queue=queue or "default", idempotency_key=None,
                         priority=priority, delay=0, max_attempts=max_attempts, lease_seconds=lease_seconds,
                         actions=actions, timeout=timeout, limits=limits, units=units, resources=resources)
    fx_key = spawn_key(key)
    yield BEGIN
    held = yield from _lease(claim, wid, "spawn")
    if queue is None:
        params["queue"] = held["queue"]
    params["idempotency_key"] = child_key(held["idempotency_key"], key)
    recorded = yield from _entry(s, claim, wid, fx_key, SPAWN_ACTION)
    if recorded is not None:  # an earlier attempt spawned it: the same child
        child_id = recorded["response"]["task_id"]
        child = yield one("tasks_by_key", queue=params["queue"], keys=[params["idempotency_key"]])
        if child is not None and child["id"] == child_id:
            same_task(child, params)  # the same child, if asked for the same way
        else:  # spawned on another queue than asked now: read it by its id
            child = yield one("get_task", task_id=child_id)
        if child is None:  # it ended and retention deleted it: there is no task to return
            raise NotFound(f"child {key!r} of task {claim.task_id} was task {child_id}, which has ended and was "
                           "removed by retention since; nothing was written")
        yield COMMIT
        return to_task(child)
    from .budgets import gate
    yield from gate(s, claim, wid, held, fx_key)  # a spent budget of the tree stops the attempt here
    row = yield one("insert_task", **params)
    if row is None:  # the derived key is taken in that queue (enqueued by hand?): only our own child will do
        row = yield from existing_task(params)
        if row.get("parent_id") != claim.task_id:
            raise InvalidInput("key", f"the child's idempotency key {params['idempotency_key']!r} names task "
                                      f"{row['id']}, which task {claim.task_id} did not spawn")
    else:
        row = yield one("set_child_parent", task_id=row["id"], parent_task_id=claim.task_id)
    response = {"task_id": row["id"], "kind": row["kind"], "queue": row["queue"]}
    yield from _record(claim, wid, fx_key, SPAWN_ACTION, response)
    yield from event(s, claim.task_id, "child_spawned", claim.generation, wid, child_task_id=row["id"],
                     kind=row["kind"], queue=row["queue"], key=key)
    yield COMMIT
    return to_task(row)


def wait_children(s: Settings, worker: Worker | str, claim: Held, key: str,
                  child_ids: Sequence[int], *, timeout: float | None = None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.wait_children`: the wait for the children ``child_ids``, recorded under ``key``.

    Answers ``{"state": "done", "results": [...]}`` (every child completed: their
    results, in the order named), ``{"state": "failed", "child": id, "status": ...,
    "error": ...}`` (every child has ended, and this one, the first in that order
    that did not complete, ended without success), ``{"state": "timed_out",
    "pending": [...]}`` (``timeout`` seconds from the first attempt that waited have
    passed, and these children had not ended), or ``{"state": "suspended"}``: the
    attempt ended, and the task waits for the last of them to end (or its
    timeout). The first three are recorded in the ledger under ``key`` and
    replayed (``replayed``): a retry times out again at the same place.
    """
    wid = worker_id(worker)
    claim = check_claim(wid, claim)
    checks.check_key("key", key)
    ids = check_children(child_ids)
    if timeout is not None:
        timeout = checks.check_seconds("timeout", timeout, allow_zero=True, maximum=MAX_WAIT_SECONDS)
    yield BEGIN
    held = yield from _lease(claim, wid, "wait_for")
    outcome = yield from _entry(s, claim, wid, key, CHILDREN_ACTION)
    if outcome is not None:  # over on an earlier attempt: replayed
        if outcome["response"].get("children") != ids:
            yield from diverge(s, claim, wid, key, f"ledger entry {key!r} waited for tasks "
                                                   f"{outcome['response'].get('children')}, not {ids}: the retried "
                                                   "handler diverged from the recorded run",
                               recorded={"children": outcome["response"].get("children")},
                               requested={"children": ids})
        yield COMMIT
        return {**outcome["response"], "key": key, "replayed": True}
    if held["budget_owners"] is not None and \
            (yield one("get_effect", task_id=claim.task_id, idempotency_key=_wait_key(key))) is None:
        from .budgets import gate  # a new wait: a spent budget of the tree stops the attempt here
        yield from gate(s, claim, wid, held, key)
    found = {r["id"]: r for r in (yield rows("lock_children", task_id=claim.task_id, child_ids=sorted(set(ids))))}
    for child in ids:
        if child not in found:
            raise InvalidInput("children", f"task {child} is not a child of task {claim.task_id} "
                                           "(ctx.wait_for takes the handles ctx.spawn returned)")
    wait_key = _wait_key(key)
    begun = yield from _entry(s, claim, wid, wait_key, CHILDREN_ACTION)
    pending = [c for c in ids if found[c]["status"] not in ENDED]
    if not pending:
        now: datetime = held["now"]
        waited = 0.0 if begun is None else max(0.0, (now - begun["response_at"]).total_seconds())
        failed = next((found[c] for c in ids if found[c]["status"] != Status.COMPLETED.value), None)
        response: dict[str, Any]
        if failed is None:
            response = {"state": "done", "children": ids, "results": [found[c]["result"] for c in ids]}
        else:
            response = {"state": "failed", "children": ids, "child": failed["id"], "status": failed["status"],
                        "error": failed["last_error"]}
        yield from _record(claim, wid, key, CHILDREN_ACTION, {**response, "waited_seconds": round(waited, 3)})
        detail: dict[str, Any] = dict(children=ids, outcome="completed" if failed is None else "failed",
                                      waited_seconds=round(waited, 3), key=key)
        if failed is not None:
            detail.update(child_task_id=failed["id"], status=failed["status"])
        yield from event(s, claim.task_id, "children_awaited", claim.generation, wid, **detail)
        yield COMMIT
        return {**response, "waited_seconds": round(waited, 3), "key": key, "replayed": False}
    if begun is None:
        begun = yield from _record(claim, wid, wait_key, CHILDREN_ACTION, {"state": "waiting", "children": ids},
                                   seconds=timeout)
        now_at = max(held["now"].timestamp(), begun["response_at"].timestamp())
    else:
        now_at = held["now"].timestamp()
    deadline = begun["response"].get("until")
    if deadline is not None and float(deadline) <= now_at + _PRECISION:
        waited = max(0.0, (held["now"] - begun["response_at"]).total_seconds())
        timed_out = {"state": "timed_out", "children": ids, "pending": pending, "until": float(deadline),
                     "waited_seconds": round(waited, 3)}
        yield from _record(claim, wid, key, CHILDREN_ACTION, timed_out)
        yield from event(s, claim.task_id, "wait_timed_out", claim.generation, wid, children=ids, pending=pending,
                         key=key, until=datetime.fromtimestamp(float(deadline), held["now"].tzinfo).isoformat())
        yield COMMIT
        return {**timed_out, "key": key, "replayed": False}
    yield from suspend(s, claim, wid, key, until=None if deadline is None else float(deadline), signal=None,
                       children=pending)
    yield COMMIT
    return {"state": "suspended", "children": ids, "pending": pending, "until": deadline, "key": key}


# -- cancel trees -------------------------------------------------------------------


def _disposition(row: dict[str, Any], open_side_effects: set[int]) -> str:
    """What a child, an intent or a task of a cancelled tree came to: see the module's doc."""
    if row["status"] == Status.COMPLETED.value:
        return "completed"
    if row["status"] == Status.RUNNING.value or row["id"] in open_side_effects:
        return "unknown"
    return "not_started"


def _waiting_for(row: dict[str, Any]) -> dict[str, Any] | None:
    """The wait a task was in when it was cancelled (None: it waited for nothing)."""
    if row["status"] != Status.WAITING.value:
        return None
    wait: dict[str, Any] = {"task_id": row["id"]}
    if row.get("wait_children"):
        wait.update(waiting_for="children", children=list(row["wait_children"]))
    elif row.get("wait_signal") is not None:
        wait.update(waiting_for="signal", signal=row["wait_signal"])
    elif row.get("wake_at") is not None:
        wait.update(waiting_for="sleep")
    else:
        wait.update(waiting_for="dependencies")
    if row.get("wake_at") is not None:
        wait["until"] = row["wake_at"].isoformat()
    return wait


def cancel_below(s: Settings, root: dict[str, Any], by: str,
                 reason: str) -> Op[tuple[dict[str, Any], dict[str, list[int]]]]:
    """Cancel, in the open transaction, what the just-cancelled task ``root`` (its row as it was
    before, locked) leaves under way: its intents that have not started (and marks the
    others, :func:`leaseq.engine.intents.cancel_with_parents`), its children that have not
    ended, and, level by level, theirs. Returns the report (see :meth:`leaseq.Queue.cancel`):
    ``children``, ``intents``, ``effects`` and ``waits``, each entry with its disposition
    where it has one; and what became of the root's own intents (``cancelled``, ``marked``:
    task ids, for its audit entry).

    The children are locked after their parent, in id order, as renewals and completions
    lock rows. A child's end racing this cancel locks its waiting parent after the child
    (:func:`leaseq.engine.dependencies.wake_parents`): PostgreSQL breaks that cycle by
    rolling one of the two back, and each runs again (the worker's call as any call in
    transit, the operator's by :meth:`leaseq.Queue._run_again`), to meet the other's outcome."""
    report: dict[str, Any] = {"children": [], "intents": [], "effects": [], "waits": []}
    root_wait = _waiting_for(root)
    if root_wait is not None:
        report["waits"].append(root_wait)
    cancelled: list[dict[str, Any]] = [root]  # the tasks this cancel ended, whose ledgers are reported
    frontier = [root["id"]]
    depth = 0
    root_intents: dict[str, list[int]] = {"cancelled": [], "marked": []}
    while frontier:
        depth += 1
        intents, outcome = yield from _intents(s, frontier, by, reason)
        if depth == 1:
            root_intents = outcome
        report["intents"] += [{**entry, "depth": depth} for entry in intents]
        kids: list[dict[str, Any]] = yield rows("lock_children_of", task_ids=frontier)
        if not kids:
            break
        open_fx = yield from _open_side_effects([k["id"] for k in kids])
        ended_now: list[int] = []
        events: list[dict[str, Any]] = []
        for k in kids:
            entry = {"task_id": k["id"], "parent_id": k["parent_id"], "kind": k["kind"], "queue": k["queue"],
                     "depth": depth, "previous_status": k["status"], "status": k["status"],
                     "disposition": _disposition(k, open_fx)}
            report["children"].append(entry)
            if k["status"] in ENDED:
                continue
            done = yield one("cancel_task", task_id=k["id"],
                             reason=f"cancelled: its parent task {k['parent_id']} was cancelled: {reason}")
            if done is None:  # never: the row is locked and had not ended
                continue
            entry["status"] = Status.CANCELLED.value
            if k["status"] == Status.RUNNING.value:  # the lease ends here: its limit slots come back
                yield from release_slots(s, [k])
            wait = _waiting_for(k)
            if wait is not None:
                report["waits"].append(wait)
            detail: dict[str, Any] = dict(by=by, reason=f"its parent task {k['parent_id']} was cancelled: {reason}",
                                          previous_status=k["status"], parent_task_id=k["parent_id"],
                                          disposition=entry["disposition"])
            if k["status"] == Status.RUNNING.value:
                detail["revoked_lease_of"] = k["lease_owner"]
                detail["open_intents"] = k["open_effects"]
            events.append(event_params(s, k["id"], "cancelled", k["claim_generation"] or None, None, **detail))
            ended_now.append(k["id"])
            cancelled.append(k)
        if events:
            yield rows("insert_events", events=events)
        if ended_now:
            yield from settle_dependents(s, ended_now)  # the tasks waiting for a cancelled child move on
        frontier = ended_now
    found = yield rows("open_effects_of", task_ids=[t["id"] for t in cancelled])
    report["effects"] = [{"effect_id": e["id"], "task_id": e["task_id"], "action": e["action"],
                          "effect": e["effect"], "idempotency_key": e["idempotency_key"],
                          "disposition": "unknown"} for e in found]
    return report, root_intents


def _open_side_effects(task_ids: list[int]) -> Op[set[int]]:
    """Which of ``task_ids`` hold an open side-effect entry (begun, no response recorded)."""
    found = yield rows("open_effects_of", task_ids=task_ids)
    return {e["task_id"] for e in found if e["effect"] == "side_effect"}


def _intents(s: Settings, parent_ids: list[int], by: str,
             reason: str) -> Op[tuple[list[dict[str, Any]], dict[str, list[int]]]]:
    """The intents (``ctx.intend``) of the just-cancelled ``parent_ids``, as the report lists them,
    those not started cancelled and the others marked (:func:`cancel_with_parents`, whose
    answer comes second)."""
    found: list[dict[str, Any]] = yield rows("intents_of", task_ids=parent_ids)
    unfinished = [r for r in found if r["status"] not in ENDED]
    if not unfinished:
        outcome: dict[str, list[int]] = {"cancelled": [], "marked": []}
        open_fx: set[int] = set()
    else:
        open_fx = yield from _open_side_effects([r["id"] for r in unfinished])
        outcome = yield from cancel_with_parents(s, parent_ids, by, reason)
    cancelled = set(outcome["cancelled"])
    out = []
    for r in found:
        if r["status"] in ENDED and r["status"] != Status.COMPLETED.value:
            continue  # ended without acting before the cancel: nothing to report
        entry = {"task_id": r["id"], "parent_task_id": r["parent_task_id"], "kind": r["kind"], "queue": r["queue"],
                 "previous_status": r["status"],
                 "status": Status.CANCELLED.value if r["id"] in cancelled else r["status"],
                 "disposition": "not_started" if r["id"] in cancelled else _disposition(r, open_fx)}
        out.append(entry)
    return out, outcome


def tree_detail(report: dict[str, Any]) -> dict[str, Any]:
    """The ``tree_cancelled`` event's detail: each entry's identity and disposition (no keys,
    no reasons: what the evidence record keeps)."""
    return {
        "children": [{"task_id": c["task_id"], "parent_task_id": c["parent_id"], "kind": c["kind"],
                      "previous_status": c["previous_status"], "disposition": c["disposition"]}
                     for c in report["children"]],
        "intents": [{"task_id": i["task_id"], "parent_task_id": i["parent_task_id"], "kind": i["kind"],
                     "previous_status": i["previous_status"], "disposition": i["disposition"]}
                    for i in report["intents"]],
        "effects": [{"effect_id": e["effect_id"], "task_id": e["task_id"], "action": e["action"],
                     "effect": e["effect"], "disposition": e["disposition"]} for e in report["effects"]],
        "waits": [{k: v for k, v in w.items() if k != "signal"} for w in report["waits"]],
    }
