"""Enqueue: tasks in, one or many, deduplicated by idempotency key."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from ..core import checks
from ..core.errors import InvalidInput
from ..core.model import Task
from ..store.base import JsonText, KeyConflict
from . import approvals
from .common import Settings, default_actor, to_task
from .dependencies import check_after, hold
from .effects import check_actions
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
_LONGEST = 10 * 365 * 86400.0
#: The range of absolute deadlines (every backend stores and reads these back).
_EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
_LATEST = datetime(9000, 1, 1, tzinfo=timezone.utc)


def check_budgets(timeout: float | None, deadline: datetime | timedelta | None) -> dict[str, Any]:
    """The budget parameters of an insert: ``timeout`` (seconds one attempt may run) and
    ``deadline`` (an aware datetime, or a timedelta from now by the database's clock), checked."""
    if timeout is not None:
        timeout = checks.check_seconds("timeout", timeout, allow_zero=False, maximum=_LONGEST)
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
        deadline_in = checks.check_seconds("deadline", deadline.total_seconds(), allow_zero=True, maximum=_LONGEST)
    elif deadline is not None:
        raise InvalidInput("deadline", "must be a timezone-aware datetime, or a timedelta from now "
                                       f"(got {type(deadline).__name__})")
    return dict(timeout=timeout, deadline_at=deadline_at, deadline_in=deadline_in)


def _common(kind: str, effect: str, queue: str, priority: int, delay: float, max_attempts: int,
            lease_seconds: float, actions: Iterable[str] | None, timeout: float | None = None,
            deadline: datetime | timedelta | None = None, limits: Iterable[str] | None = None,
            units: int = 1) -> dict[str, Any]:
    effect = checks.check_effect(effect)
    return dict(
        **check_budgets(timeout, deadline),
        limits=check_limits(limits),
        units=check_units(units),
        kind=checks.check_kind(kind),
        effect=effect,
        actions=check_actions(actions, effect),
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
                units: int = 1) -> dict[str, Any]:
    """The parameters of ``insert_task`` for one task, checked (InvalidInput names the field)."""
    effect = checks.check_effect(effect)
    return dict(
        trace_context=checks.check_trace_context("trace_context", trace_context),
        limits=check_limits(limits),
        units=check_units(units),
        kind=checks.check_kind(kind),
        payload=JsonText(checks.encode_json("payload", payload)),  # encoded once, here
        effect=effect,
        actions=check_actions(actions, effect),
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
    watched=False, parent_task_id=None, parent_cancelled_at=None)
#: The parameters of insert_task stored as sent.
_AS_SENT = ("queue", "kind", "effect", "priority", "idempotency_key", "max_attempts", "lease_seconds",
            "trace_context", "limits", "units")


def inserted_row(params: dict[str, Any], made: dict[str, Any]) -> dict[str, Any]:
    """The whole row insert_task wrote with ``params``: ``made`` (what it returns: the
    id, the times and the payload the database made or stored) over what it sent.

    Reading back only what the database made keeps the enqueue's reply small
    (a quarter of its statement's time went to the row's other 28 columns).
    """
    row = dict(_NEW_TASK)
    for name in _AS_SENT:
        row[name] = params[name]
    row["actions"] = None if params["actions"] is None else json.loads(params["actions"])
    row["timeout_seconds"] = params["timeout"]
    row.update(made)
    return row


def enqueue(s: Settings, kind: str, payload: Any = None, *, effect: str = "read_only", queue: str = "default",
            idempotency_key: str | None = None, priority: int = 0, delay: float = 0, max_attempts: int = 5,
            lease_seconds: float = checks.DEFAULT_LEASE_SECONDS, actions: Iterable[str] | None = None,
            timeout: float | None = None, deadline: datetime | timedelta | None = None,
            approval: str | None = None, approval_deadline: float | None = None,
            by: str | None = None, trace_context: str | None = None, after: Iterable[int] | None = None,
            on_dependency_failure: str = "cancel", limits: Iterable[str] | None = None,
            units: int = 1, token_id: str | None = None) -> Op[Task]:
    """:meth:`leaseq.Queue.enqueue`."""
    upstreams = check_after(after, on_dependency_failure)
    params = task_params(kind, payload, effect=effect, queue=queue, idempotency_key=idempotency_key,
                         priority=priority, delay=delay, max_attempts=max_attempts, lease_seconds=lease_seconds,
                         actions=actions, timeout=timeout, deadline=deadline, trace_context=trace_context,
                         limits=limits, units=units)
    approval, approval_deadline = approvals.check_approval(approval, approval_deadline)
    by = checks.check_text("by", by)
    token_id = checks.check_text("token_id", token_id) or None
    if approval is not None and upstreams:
        raise InvalidInput("after", "cannot be combined with an approval gate: enqueue the gated task first, "
                                    "and the waiting task after it")
    if approval is not None:
        # the task and its approval request in one transaction: no worker ever sees it queued
        yield BEGIN
        row = yield one("insert_task", **params)
        if row is not None:
            row = yield from approvals.request(s, inserted_row(params, row), by or default_actor(),
                                               approval_deadline, token=token_id)
        yield COMMIT
    elif upstreams:  # the task and its dependencies, in one transaction
        yield BEGIN
        row = yield one("insert_task", **params)
        if row is not None:
            yield from hold(s, [row["id"]], upstreams, on_dependency_failure)
            row = yield one("get_task", task_id=row["id"])
        yield COMMIT
    else:
        # the row is the enqueue's evidence (list_events); insert_task wakes
        # listening workers itself where the backend has LISTEN/NOTIFY
        yield BEGIN_ONE
        row = yield one("insert_task", **params)
        yield COMMIT
        if row is not None:
            row = inserted_row(params, row)
    if row is None:  # the key was taken: the same logical task
        yield BEGIN
        row = yield one("get_task_by_key", queue=params["queue"], idempotency_key=params["idempotency_key"])
        yield COMMIT
    return to_task(row)


def enqueue_many(s: Settings, kind: str, payloads: Iterable[Any], *, effect: str = "read_only",
                 queue: str = "default", idempotency_keys: Sequence[str | None] | None = None, priority: int = 0,
                 delay: float = 0, max_attempts: int = 5, lease_seconds: float = checks.DEFAULT_LEASE_SECONDS,
                 actions: Iterable[str] | None = None, timeout: float | None = None,
                 deadline: datetime | timedelta | None = None, after: Iterable[int] | None = None,
                 on_dependency_failure: str = "cancel", limits: Iterable[str] | None = None,
                 units: int = 1) -> Op[list[int]]:
    """:meth:`leaseq.Queue.enqueue_many`."""
    upstreams = check_after(after, on_dependency_failure)
    payloads = list(payloads)
    if idempotency_keys is not None:
        idempotency_keys = list(idempotency_keys)
        if len(idempotency_keys) != len(payloads):
            raise InvalidInput("idempotency_keys", f"needs one key per payload ({len(payloads)}), "
                                                   f"got {len(idempotency_keys)}")
    common = _common(kind, effect, queue, priority, delay, max_attempts, lease_seconds, actions, timeout, deadline,
                     limits, units)
    wait = (upstreams, on_dependency_failure)
    given = [None] * len(payloads) if idempotency_keys is None else [
        None if key is None else checks.check_key(f"idempotency_keys[{i}]", key)
        for i, key in enumerate(idempotency_keys)]
    # Each payload is encoded once, while it is checked; the documents sent are built from those texts.
    encoded = [checks.encode_json(f"payloads[{i}]", payload) for i, payload in enumerate(payloads)]
    if any(key is not None for key in given):
        fresh = fresh_keys(len(payloads))
        return (yield from _insert_tasks(s, [fresh[i] if key is None else key for i, key in enumerate(given)],
                                         encoded, common, wait, generated=False))
    for _ in range(3):
        try:  # every key is generated here: no ON CONFLICT needed
            return (yield from _insert_tasks(s, fresh_keys(len(payloads)), encoded, common, wait, generated=True))
        except KeyConflict:  # a generated key met a stored one (never seen); nothing was written
            continue
    raise KeyConflict("generated idempotency keys met stored ones three times")


def _insert_tasks(s: Settings, keys: list[str], encoded: list[str], common: dict[str, Any],
                  wait: tuple[list[int], str], *, generated: bool) -> Op[list[int]]:
    """Write the tasks in chunks, in one transaction; ``generated``: every key was made by :func:`fresh_keys`.
    ``wait``: the upstreams every new task waits for, and what it does if one fails."""
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
        if missing:  # keys that were already taken: the existing tasks
            ids.update((r["idempotency_key"], r["id"])
                       for r in (yield rows("task_ids_by_key", queue=common["queue"], keys=missing)))
    if wait[0]:
        yield from hold(s, new_ids, *wait)
    if keys:
        yield rows("notify_work", queue=common["queue"])
    yield COMMIT
    return [ids[k] for k in keys]
