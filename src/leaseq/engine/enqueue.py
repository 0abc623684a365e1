"""Enqueue: tasks in, one or many, deduplicated by idempotency key.

The idempotency rule, the same for every way in (``Queue.enqueue`` and
``enqueue_many``, ``AsyncQueue``, ``App`` definitions, the CLI, the HTTP
service, schedules, ``ctx.intend``): a key names one task in its queue. An
enqueue whose key is taken returns that task if it asks for the same kind,
payload and options (:func:`key_differences`), and is refused with
:class:`~leaseq.core.errors.IdempotencyKeyConflict` naming what differs
otherwise; either way nothing is written.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from ..core import checks
from ..core.errors import IdempotencyKeyConflict, InvalidInput, NotFound
from ..core.model import Status, Task
from ..store.base import JsonText, KeyConflict
from . import approvals, fairness, flow
from .common import Settings, default_actor, to_task
from .dependencies import check_after, hold
from .effects import check_actions, check_resources
from .limits import check_limits, check_units
from .steps import BEGIN, BEGIN_ONE, COMMIT, Op, one, rows

#: Rows per statement in :meth:`leaseq.Queue.enqueue_many` (all in one transaction).
ENQUEUE_CHUNK = 5000


def fresh_keys(n: int) -> list[str]:
    """``n`` new idempotency keys, 32 hex digits each, unique and increasing.

    A microsecond clock, 56 random bits and a counter: keys made later sort
    later, so the unique (queue, key) index grows at its right edge instead of
    taking random inserts (fewer pages touched, less WAL, per enqueue).
    """
    stem = f"{time.time_ns() // 1000:013x}{secrets.token_hex(7)}"
    return [f"{stem}{i:05x}" for i in range(n)]


#: The longest timeout of one attempt, and the farthest relative deadline: ten years.
LONGEST = 10 * 365 * 86400.0
#: The range of absolute deadlines (every backend stores and reads these back).
_EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
_LATEST = datetime(9000, 1, 1, tzinfo=timezone.utc)


def check_budgets(timeout: float | None, deadline: datetime | timedelta | None) -> dict[str, Any]:
    """The budget parameters of an insert: ``timeout`` (seconds one attempt may run) and
    ``deadline`` (an aware datetime, or a timedelta from now by the database's clock), checked."""
    if timeout is not None:
        timeout = checks.check_seconds("timeout", timeout, allow_zero=False, maximum=LONGEST)
    deadline_at, deadline_in = None, None
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None or deadline.utcoffset() is None:
            raise InvalidInput("deadline", f"must be a timezone-aware time (got {deadline.isoformat()}, "
                                           "which has no offset)")
        if not _EARLIEST <= deadline <= _LATEST:
            raise InvalidInput("deadline", f"must be between {_EARLIEST.year} and {_LATEST.year} "
                                           f"(got {deadline.isoformat()})")
        deadline_at = deadline
    elif isinstance(deadline, timedelta):
        deadline_in = checks.check_seconds("deadline", deadline.total_seconds(), allow_zero=True, maximum=LONGEST)
    elif deadline is not None:
        raise InvalidInput("deadline", "must be a timezone-aware datetime, or a timedelta from now "
                                       f"(got {type(deadline).__name__})")
    return dict(timeout=timeout, deadline_at=deadline_at, deadline_in=deadline_in)


def _common(kind: str, effect: str, queue: str, priority: int, delay: float, max_attempts: int,
            lease_seconds: float, actions: Iterable[str] | None, timeout: float | None = None,
            deadline: datetime | timedelta | None = None, limits: Iterable[str] | None = None,
            units: int = 1, resources: Iterable[str] | None = None, fairness_key: str | None = None,
            fairness_weight: float = 1.0, trace_context: str | None = None) -> dict[str, Any]:
    effect = checks.check_effect(effect)
    return dict(
        **check_budgets(timeout, deadline),
        trace_context=checks.check_trace_context("trace_context", trace_context),
        **fairness.check_fairness(fairness_key, fairness_weight),
        limits=check_limits(limits),
        units=check_units(units),
        kind=checks.check_kind(kind),
        effect=effect,
        actions=check_actions(actions, effect),
        resources=check_resources(resources, effect),
        queue=checks.check_name("queue", queue),
        priority=checks.check_int("priority", priority, minimum=-(2**31), maximum=2**31 - 1),
        delay=checks.check_seconds("delay", delay, allow_zero=True, maximum=10 * 365 * 86400.0),
        max_attempts=checks.check_int("max_attempts", max_attempts, minimum=1, maximum=10_000),
        lease_seconds=checks.check_seconds("lease_seconds", lease_seconds, allow_zero=False),
    )


def task_params(kind: str, payload: Any, *, effect: str, queue: str, idempotency_key: str | None, priority: int,
                delay: float, max_attempts: int, lease_seconds: float, actions: Iterable[str] | None,
                timeout: float | None = None, deadline: datetime | timedelta | None = None,
                trace_context: str | None = None, limits: Iterable[str] | None = None,
                units: int = 1, resources: Iterable[str] | None = None, singleton_key: str | None = None,
                debounce_key: str | None = None, fairness_key: str | None = None,
                fairness_weight: float = 1.0) -> dict[str, Any]:
    """The parameters of ``insert_task`` for one task, checked (InvalidInput names the field;
    ``singleton_key`` and ``debounce_key`` come checked, see :func:`leaseq.engine.flow.check_flow`)."""
    effect = checks.check_effect(effect)
    return dict(
        **fairness.check_fairness(fairness_key, fairness_weight),
        singleton_key=singleton_key,
        debounce_key=debounce_key,
        trace_context=checks.check_trace_context("trace_context", trace_context),
        limits=check_limits(limits),
        units=check_units(units),
        kind=checks.check_kind(kind),
        payload=JsonText(checks.encode_json("payload", payload)),  # encoded once, here
        effect=effect,
        actions=check_actions(actions, effect),
        resources=check_resources(resources, effect),
        queue=checks.check_name("queue", queue),
        idempotency_key=(fresh_keys(1)[0] if idempotency_key is None
                         else checks.check_key("idempotency_key", idempotency_key)),
        priority=checks.check_int("priority", priority, minimum=-(2**31), maximum=2**31 - 1),
        delay=checks.check_seconds("delay", delay, allow_zero=True, maximum=10 * 365 * 86400.0),
        max_attempts=checks.check_int("max_attempts", max_attempts, minimum=1, maximum=10_000),
        lease_seconds=checks.check_seconds("lease_seconds", lease_seconds, allow_zero=False),
        **check_budgets(timeout, deadline),
    )


#: The columns of a new task row that insert_task does not send, as the schema's defaults make them.
_NEW_TASK: dict[str, Any] = dict(
    status="queued", lease_owner=None, lease_expires_at=None, claim_generation=0, attempts=0, last_error=None,
    result=None, open_effects=0, claimed_at=None, heartbeat_count=0, last_heartbeat_at=None,
    longest_heartbeat_gap=0.0, error_fingerprint=None, error_streak=0, snoozes=0, has_dependents=False,
    watched=False, parent_task_id=None, parent_cancelled_at=None, parent_id=None, wait_children=None, budget=None,
    spent=None)
#: The parameters of insert_task stored as sent.
_AS_SENT = ("queue", "kind", "effect", "priority", "idempotency_key", "max_attempts", "lease_seconds",
            "trace_context", "limits", "units", "singleton_key", "debounce_key", "fairness_key", "fairness_weight")


def _set_budget(row: dict[str, Any], budget: dict[str, int] | None) -> Op[None]:
    """The budget of a task this enqueue just inserted (in its transaction); nothing without one."""
    if budget is not None:
        yield from set_budgets([row["id"]], budget)


def set_budgets(task_ids: list[int], budget: dict[str, int] | None) -> Op[None]:
    """Each of the tasks this enqueue just inserted gets ``budget`` (in its transaction): the
    budget covers the task and its tree (:mod:`leaseq.engine.budgets`); nothing without one."""
    if budget is not None and task_ids:
        yield rows("set_budget", task_ids=task_ids, budget=budget)
        yield rows("open_budgets", task_ids=task_ids)


def inserted_row(params: dict[str, Any], made: dict[str, Any],
                 budget: dict[str, int] | None = None) -> dict[str, Any]:
    """The whole row insert_task wrote with ``params``: ``made`` (what it returns: the
    id, the times and the payload the database made or stored) over what it sent.

    Reading back only what the database made keeps the enqueue's reply small
    (a quarter of its statement's time went to the row's other 28 columns).
    """
    row = dict(_NEW_TASK)
    for name in _AS_SENT:
        row[name] = params[name]
    row["actions"] = None if params["actions"] is None else json.loads(params["actions"])
    row["resources"] = None if params["resources"] is None else json.loads(params["resources"])
    row["timeout_seconds"] = params["timeout"]
    row.update(made)
    if budget is not None:
        row["budget"] = budget
    return row


def enqueue(s: Settings, kind: str, payload: Any = None, *, effect: str = "read_only", queue: str = "default",
            idempotency_key: str | None = None, priority: int = 0, delay: float = 0, max_attempts: int = 5,
            lease_seconds: float = checks.DEFAULT_LEASE_SECONDS, actions: Iterable[str] | None = None,
            timeout: float | None = None, deadline: datetime | timedelta | None = None,
            approval: str | None = None, approval_deadline: float | None = None,
            by: str | None = None, trace_context: str | None = None, after: Iterable[int] | None = None,
            on_dependency_failure: str = "cancel", limits: Iterable[str] | None = None,
            units: int = 1, token_id: str | None = None, resources: Iterable[str] | None = None,
            singleton_key: str | None = None, on_conflict: str = "skip", debounce: float | None = None,
            key: str | None = None, debounce_mode: str = "trailing", max_delay: float | None = None,
            budget: Mapping[str, int] | None = None,
            fairness_key: str | None = None, fairness_weight: float = 1.0) -> Op[Task]:
    """:meth:`leaseq.Queue.enqueue`."""
    from .budgets import check_budget
    budget = check_budget(budget)
    upstreams = check_after(after, on_dependency_failure)
    control = flow.check_flow(singleton_key=singleton_key, on_conflict=on_conflict, debounce=debounce, key=key,
                              debounce_mode=debounce_mode, max_delay=max_delay, idempotency_key=idempotency_key,
                              delay=delay, approval=approval, after=upstreams)
    params = task_params(kind, payload, effect=effect, queue=queue, idempotency_key=idempotency_key,
                         priority=priority, delay=delay, max_attempts=max_attempts, lease_seconds=lease_seconds,
                         actions=actions, timeout=timeout, deadline=deadline, trace_context=trace_context,
                         limits=limits, units=units, resources=resources, singleton_key=control["singleton_key"],
                         debounce_key=control["debounce_key"], fairness_key=fairness_key,
                         fairness_weight=fairness_weight)
    approval, approval_deadline = approvals.check_approval(approval, approval_deadline)
    by = checks.check_text("by", by)
    token_id = checks.check_text("token_id", token_id) or None
    if approval is not None and upstreams:
        raise InvalidInput("after", "cannot be combined with an approval gate: enqueue the gated task first, "
                                    "and the waiting task after it")
    outcome = "created"
    row: dict[str, Any] | None
    if control["singleton_key"] is not None or control["debounce_key"] is not None:
        # the key's lock, its tasks read, and the decision, in one transaction (engine.flow)
        yield BEGIN
        if control["singleton_key"] is not None:
            row, outcome = yield from flow.singleton(s, params, control["on_conflict"], by)
        else:
            row, outcome = yield from flow.debounced(s, params, control, by)
        if row is not None and outcome == "created":
            yield from _set_budget(row, budget)
        yield COMMIT
        if row is not None and outcome == "created":
            row = inserted_row(params, row, budget)
    elif approval is not None:
        # the task and its approval request in one transaction: no worker ever sees it queued
        yield BEGIN
        row = yield one("insert_task", **params)
        if row is not None:
            yield from _set_budget(row, budget)
            row = yield from approvals.request(s, inserted_row(params, row, budget), by or default_actor(),
                                               approval_deadline, token=token_id)
        yield COMMIT
    elif upstreams:  # the task and its dependencies, in one transaction
        yield BEGIN
        row = yield one("insert_task", **params)
        if row is not None:
            yield from _set_budget(row, budget)
            yield from hold(s, [row["id"]], upstreams, on_dependency_failure)
            row = yield one("get_task", task_id=row["id"])
        yield COMMIT
    else:
        # the row is the enqueue's evidence (list_events); insert_task wakes
        # listening workers itself where the backend has LISTEN/NOTIFY (with a
        # budget, its statement follows in the same transaction)
        yield BEGIN_ONE if budget is None else BEGIN
        row = yield one("insert_task", **params)
        if row is not None:
            yield from _set_budget(row, budget)
        yield COMMIT
        if row is not None:
            row = inserted_row(params, row, budget)
    if row is None:  # the key was taken: the same logical task, if asked for the same way
        yield BEGIN
        row = yield from existing_task(params, approval=approval, approval_deadline=approval_deadline,
                                       after=upstreams, on_dependency_failure=on_dependency_failure)
        yield COMMIT
        outcome = "existing"
    task = to_task(row)
    task.__dict__["enqueue_outcome"] = outcome  # a frozen record, made here: not yet shared
    return task


def enqueue_many(s: Settings, kind: str, payloads: Iterable[Any], *, effect: str = "read_only",
                 queue: str = "default", idempotency_keys: Sequence[str | None] | None = None, priority: int = 0,
                 delay: float = 0, max_attempts: int = 5, lease_seconds: float = checks.DEFAULT_LEASE_SECONDS,
                 actions: Iterable[str] | None = None, timeout: float | None = None,
                 deadline: datetime | timedelta | None = None, after: Iterable[int] | None = None,
                 on_dependency_failure: str = "cancel", limits: Iterable[str] | None = None,
                 units: int = 1, resources: Iterable[str] | None = None, fairness_key: str | None = None,
                 fairness_weight: float = 1.0, budget: Mapping[str, int] | None = None,
                 trace_context: str | None = None) -> Op[list[int]]:
    """:meth:`leaseq.Queue.enqueue_many`."""
    from .budgets import check_budget
    budget = check_budget(budget)
    upstreams = check_after(after, on_dependency_failure)
    payloads = list(payloads)
    if idempotency_keys is not None:
        idempotency_keys = list(idempotency_keys)
        if len(idempotency_keys) != len(payloads):
            raise InvalidInput("idempotency_keys", f"needs one key per payload ({len(payloads)}), "
                                                   f"got {len(idempotency_keys)}")
    common = _common(kind, effect, queue, priority, delay, max_attempts, lease_seconds, actions, timeout, deadline,
                     limits, units, resources, fairness_key, fairness_weight, trace_context)
    wait = (upstreams, on_dependency_failure)
    given: list[str | None] = [None] * len(payloads) if idempotency_keys is None else [
        None if key is None else checks.check_key(f"idempotency_keys[{i}]", key)
        for i, key in enumerate(idempotency_keys)]
    # Each payload is encoded once, while it is checked; the documents sent are built from those texts.
    encoded = [checks.encode_json(f"payloads[{i}]", payload) for i, payload in enumerate(payloads)]
    if any(key is not None for key in given):
        _check_repeated_keys(given, encoded)
        fresh = fresh_keys(len(payloads))
        return (yield from _insert_tasks(s, [fresh[i] if key is None else key for i, key in enumerate(given)],
                                         encoded, common, wait, generated=False, budget=budget))
    for _ in range(3):
        try:  # every key is generated here: no ON CONFLICT needed
            return (yield from _insert_tasks(s, fresh_keys(len(payloads)), encoded, common, wait, generated=True,
                                             budget=budget))
        except KeyConflict:  # a generated key met a stored one (never seen); nothing was written
            continue
    raise KeyConflict("generated idempotency keys met stored ones three times")


def _insert_tasks(s: Settings, keys: list[str], encoded: list[str], common: dict[str, Any],
                  wait: tuple[list[int], str], *, generated: bool,
                  budget: dict[str, int] | None = None) -> Op[list[int]]:
    """Write the tasks in chunks, in one transaction; ``generated``: every key was made by :func:`fresh_keys`.
    ``wait``: the upstreams every new task waits for, and what it does if one fails. ``budget``:
    each new task's own (a task that was there already keeps its own)."""
    query = "insert_fresh_tasks" if generated else "insert_tasks"
    quote = '"{}"'.format if generated else json.dumps  # generated keys are plain hex
    entries = [f'{{"payload":{text},"idempotency_key":{quote(key)}}}' for text, key in zip(encoded, keys)]
    ids: dict[str, int] = {}
    new_ids: list[int] = []
    yield BEGIN
    for start in range(0, len(keys), ENQUEUE_CHUNK):
        added = yield rows(query, tasks=JsonText("[" + ",".join(entries[start:start + ENQUEUE_CHUNK]) + "]"),
                           **common)
        ids.update((r["idempotency_key"], r["id"]) for r in added)
        new_ids.extend(r["id"] for r in added)
        missing = list(set(keys[start:start + ENQUEUE_CHUNK]) - ids.keys())
        if missing:  # keys that were already taken: the existing tasks, if asked for the same way
            payload_of = dict(zip(keys[start:start + ENQUEUE_CHUNK], encoded[start:start + ENQUEUE_CHUNK]))
            for r in (yield rows("tasks_by_key", queue=common["queue"], keys=missing)):
                # a conflict raises here, in the enqueue's transaction: it rolls back, nothing is written
                same_task(r, {**common, "payload": payload_of[r["idempotency_key"]]}, after=wait[0],
                          on_dependency_failure=wait[1])
                ids[r["idempotency_key"]] = r["id"]
    if wait[0]:
        yield from hold(s, new_ids, *wait)
    for start in range(0, len(new_ids), ENQUEUE_CHUNK):
        yield from set_budgets(new_ids[start:start + ENQUEUE_CHUNK], budget)
    if keys:
        yield rows("notify_work", queue=common["queue"])
    yield COMMIT
    return [ids[k] for k in keys]


def _check_repeated_keys(keys: list[str | None], encoded: list[str]) -> None:
    """A key given twice in one :func:`enqueue_many` names one task: its payloads must be the same JSON."""
    first: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        j = first.setdefault(key, i)
        if j != i and encoded[j] != encoded[i] and not same_json(json.loads(encoded[j]), json.loads(encoded[i])):
            raise InvalidInput(f"idempotency_keys[{i}]", f"repeats idempotency_keys[{j}] ({key!r}) with a "
                                                         f"different payload: one key names one task")


# -- the idempotency rule ---------------------------------------------------------------

#: Relative times (a deadline given as a timedelta, an approval deadline) compare by their
#: length, to within this many seconds: a repeat made later asks for the same length.
RELATIVE_SLACK = 1.0
#: Absolute deadlines compare to within this many seconds (what every backend keeps of a time).
INSTANT = 0.001


def _number(value: Any) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(value if isinstance(value, int) else repr(value))


def same_json(a: Any, b: Any) -> bool:
    """Whether two decoded JSON documents are the same JSON value.

    As PostgreSQL's ``jsonb`` compares them: objects without regard to key
    order, numbers by value (``1``, ``1.0`` and ``1e0`` are one number;
    ``true`` is not ``1``). Walked without recursion: payloads nest up to
    :data:`leaseq.core.checks.MAX_JSON_DEPTH` deep.
    """
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, dict):
            if not isinstance(y, dict) or x.keys() != y.keys():
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list):
            if not isinstance(y, list) or len(x) != len(y):
                return False
            stack.extend(zip(x, y))
        elif isinstance(x, bool) or isinstance(y, bool):  # before numbers: True is an int to Python
            if x is not y:
                return False
        elif isinstance(x, (int, float, Decimal)):
            if isinstance(y, bool) or not isinstance(y, (int, float, Decimal)) or _number(x) != _number(y):
                return False
        elif x != y:  # strings and null
            return False
    return True


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{round(value, 3):g} s"


def _listed(values: Iterable[Any] | None, none: str = "none") -> str:
    return none if values is None else "[" + ", ".join(str(v) for v in values) + "]"


def _upstreams(row: dict[str, Any]) -> list[int]:
    text = row.get("upstreams")
    return sorted(int(part) for part in str(text).split(",")) if text else []


def key_differences(row: dict[str, Any], params: dict[str, Any], *, approval: str | None = None,
                    approval_deadline: float | None = None, after: Sequence[int] = (),
                    on_dependency_failure: str = "cancel") -> dict[str, str]:
    """What differs between ``row``, the task an enqueue's key already names, and that enqueue.

    ``row`` is read by ``tasks_by_key``: the task's row, with whether it is
    approval-gated and the length of its approval deadline, and the tasks it
    waits for. ``params`` are the enqueue's checked parameters
    (:func:`task_params`; for :func:`enqueue_many`, the shared ones and one
    payload); the keyword arguments are its approval gate and dependencies,
    checked. Returns ``{field: how}``, in the order of the enqueue's
    parameters; empty when the enqueue asks for the task as it is.

    Compared: everything that decides what runs and how: the queue, kind,
    payload (as JSON values: key order and number spelling aside), effect,
    priority, the fairness key and weight, max_attempts, lease_seconds, actions,
    resources, timeout, deadline,
    limits, units, the approval gate and its deadline, and the dependencies
    (``after``, ``on_dependency_failure``). A default compares equal whether
    it was passed or not. Not compared: ``delay`` (a repeat made a second
    later asks for a later time, not another task), the trace context and
    who asked (``by``). Relative times compare by their length, to within
    :data:`RELATIVE_SLACK` seconds.
    """
    found: dict[str, str] = {}

    def differ(name: str, stored: str, asked: str) -> None:
        found[name] = f"its {name} is {stored}, not {asked}"

    if row["queue"] != params["queue"]:
        differ("queue", repr(row["queue"]), repr(params["queue"]))
    if row["kind"] != params["kind"]:
        differ("kind", repr(row["kind"]), repr(params["kind"]))
    if not same_json(row["payload"], json.loads(params["payload"])):
        cleared = row["payload"] is None and row["status"] in (Status.COMPLETED.value, Status.CANCELLED.value)
        found["payload"] = ("its payload is null: retention clears the payloads of finished tasks"
                            if cleared else "")
    if row["effect"] != params["effect"]:
        differ("effect", str(row["effect"]), params["effect"])
    for name in ("priority", "max_attempts"):
        if row[name] != params[name]:
            differ(name, str(row[name]), str(params[name]))
    if row.get("fairness_key") != params["fairness_key"]:
        differ("fairness_key", repr(row.get("fairness_key")), repr(params["fairness_key"]))
    elif row.get("fairness_weight") != params["fairness_weight"]:
        differ("fairness_weight", f"{row.get('fairness_weight'):g}", f"{params['fairness_weight']:g}")
    if float(row["lease_seconds"]) != params["lease_seconds"]:
        differ("lease_seconds", _seconds(row["lease_seconds"]), _seconds(params["lease_seconds"]))
    actions = None if params["actions"] is None else json.loads(params["actions"])
    if (row["actions"] is None) != (actions is None) or sorted(row["actions"] or ()) != sorted(actions or ()):
        differ("actions", _listed(row["actions"], "undeclared"), _listed(actions, "undeclared"))
    resources = None if params["resources"] is None else json.loads(params["resources"])
    if sorted(row["resources"] or ()) != sorted(resources or ()):
        differ("resources", _listed(row["resources"], "none"), _listed(resources, "none"))
    if row["timeout_seconds"] != params["timeout"]:
        differ("timeout", _seconds(row["timeout_seconds"]), _seconds(params["timeout"]))
    stored_deadline: datetime | None = row["deadline_at"]
    if params["deadline_at"] is not None:
        if stored_deadline is None or abs((stored_deadline - params["deadline_at"]).total_seconds()) > INSTANT:
            differ("deadline", "none" if stored_deadline is None else stored_deadline.isoformat(),
                   params["deadline_at"].isoformat())
    elif params["deadline_in"] is not None:
        length = None if stored_deadline is None else (stored_deadline - row["created_at"]).total_seconds()
        if length is None or abs(length - params["deadline_in"]) > RELATIVE_SLACK:
            differ("deadline", "none" if length is None else f"{round(length, 1):g} s after its enqueue",
                   f"{params['deadline_in']:g} s after the enqueue")
    elif stored_deadline is not None:
        differ("deadline", stored_deadline.isoformat(), "none")
    if sorted(row["limits"] or ()) != sorted(params["limits"] or ()):
        differ("limits", _listed(row["limits"]), _listed(params["limits"]))
    if row["units"] != params["units"]:
        differ("units", str(row["units"]), str(params["units"]))
    gated = bool(row["gated"])
    if gated != (approval is not None):
        differ("approval", "required" if gated else "none", approval or "none")
    elif gated:
        stored_wait = row["approval_seconds"]
        if (stored_wait is None) != (approval_deadline is None) or (
                stored_wait is not None and approval_deadline is not None
                and abs(stored_wait - approval_deadline) > RELATIVE_SLACK):
            differ("approval_deadline", _seconds(stored_wait), _seconds(approval_deadline))
    upstreams, asked_upstreams = _upstreams(row), sorted(after)
    if upstreams != asked_upstreams:
        differ("after", _listed(upstreams or None), _listed(asked_upstreams or None))
    if upstreams and asked_upstreams and row["on_failure"] != on_dependency_failure:
        differ("on_dependency_failure", str(row["on_failure"]), on_dependency_failure)
    return found


def same_task(row: dict[str, Any], params: dict[str, Any], *, approval: str | None = None,
              approval_deadline: float | None = None, after: Sequence[int] = (),
              on_dependency_failure: str = "cancel") -> None:
    """Refuse an enqueue that names ``row``'s key but not ``row`` (see :func:`key_differences`)
    with :class:`IdempotencyKeyConflict`."""
    differences = key_differences(row, params, approval=approval, approval_deadline=approval_deadline,
                                  after=after, on_dependency_failure=on_dependency_failure)
    if differences:
        raise IdempotencyKeyConflict(row["idempotency_key"], row["queue"], row["id"], differences)


def existing_task(params: dict[str, Any], *, approval: str | None = None, approval_deadline: float | None = None,
                  after: Sequence[int] = (), on_dependency_failure: str = "cancel") -> Op[dict[str, Any]]:
    """The task ``params``' key names in its queue (read in the open transaction), if the
    enqueue asks for it as it is; else :class:`IdempotencyKeyConflict` (see :func:`same_task`)."""
    row = yield one("tasks_by_key", queue=params["queue"], keys=[params["idempotency_key"]])
    if row is None:  # taken a moment ago, and gone since (retention removed it): never in practice
        raise NotFound(f"the task with idempotency key {params['idempotency_key']!r} in queue "
                       f"{params['queue']!r} was removed while it was enqueued again; enqueue it again")
    same_task(row, params, approval=approval, approval_deadline=approval_deadline, after=after,
              on_dependency_failure=on_dependency_failure)
    return dict(row)
