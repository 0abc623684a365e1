"""Limits shared by every worker: their settings, their usage, and the slots leases hold.

A limit is a row of ``leaseq_limits`` named by a key: at most ``max_running``
live leases (or units in them) at once, a rate bucket of ``per_second``
tokens holding at most ``burst``, and totals over fixed windows of the
database's clock (``per_minute``, ``per_hour``, ``per_day``). A task names the
keys it counts against (``limits=``) and its weight (``units=``). The claim
statement judges them (``claim_batch``); the slot a claim takes belongs to its
lease and is given back by the statement that ends the lease, in the same
transaction, which also reconciles the claim's reservation in the bucket and
the windows to the usage the attempt settled (:mod:`leaseq.engine.budgets`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..core import checks
from ..core.errors import InvalidInput, NotFound
from .common import Settings, acting, audit
from .steps import BEGIN, COMMIT, Op, one, rows

#: What a limit counts: each lease as 1, or its task's units.
COUNTS = ("tasks", "units")
#: The most limit keys one task may name.
MAX_KEYS = 16
#: The largest weight of one task, and the largest max_running.
MAX_UNITS = 2**53


def check_limits(limits: Iterable[str] | None) -> list[str] | None:
    """The limit keys a task names, checked, deduplicated and sorted; None for none."""
    if limits is None:
        return None
    if isinstance(limits, (str, bytes)) or not isinstance(limits, Iterable):
        raise InvalidInput("limits", f"must be a list of limit keys (got {limits!r})")
    keys = sorted({checks.check_name(f"limits[{i}]", key) for i, key in enumerate(limits)})
    if len(keys) > MAX_KEYS:
        raise InvalidInput("limits", f"names {len(keys)} keys; at most {MAX_KEYS}")
    return keys or None


def check_units(units: Any) -> int:
    """A task's weight in limits that count units: a positive integer."""
    return checks.check_int("units", units, minimum=1, maximum=MAX_UNITS)


def slot_items(ended: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``{"key", "units", "queue"}`` item per (task, limit key) of rows whose lease ended or began."""
    return [{"key": key, "units": r["units"], "queue": r["queue"]}
            for r in ended if r.get("limits") for key in r["limits"]]


def release(s: Settings, ended: Iterable[dict[str, Any]]) -> Op[None]:
    """Give back the limit slots of leases that just ended, in the open transaction
    (nothing to run when none of their tasks names a limit).

    The tasks are named, not their keys: ``give_back_slots`` gives back what each task's
    own keys and units hold, once per claim generation (on PostgreSQL in its own statement;
    on SQLite it answers the tasks, whose keys ``release_limits`` then gives back)."""
    task_ids = [r["id"] for r in ended if r.get("limits")]
    if not task_ids:
        return
    back = yield rows("give_back_slots", task_ids=task_ids)
    if not s.backend.own_limit_slots:
        items = slot_items(back)
        if items:
            yield rows("release_limits", items=items)
        # BUDGETS: the ended attempts' reservations, reconciled to what they consumed
        from .budgets import settle
        yield from settle(s, [r["id"] for r in back])


#: The fixed windows a limit may total over, by their parameter: their length in seconds.
WINDOWS = {"per_minute": 60, "per_hour": 3600, "per_day": 86400}


def set_limit(s: Settings, key: str, *, max_running: int | None = None, per_second: float | None = None,
              burst: float | None = None, counts: str = "tasks", per_minute: int | None = None,
              per_hour: int | None = None, per_day: int | None = None, by: str | None = None,
              via: str | None = None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.set_limit`."""
    key = checks.check_name("key", key)
    totals = {"per_minute": per_minute, "per_hour": per_hour, "per_day": per_day}
    for name, total in totals.items():
        if total is not None:
            checks.check_int(name, total, minimum=1, maximum=MAX_UNITS)
    if max_running is not None:
        checks.check_int("max_running", max_running, minimum=1, maximum=MAX_UNITS)
    if per_second is not None:
        if isinstance(per_second, bool) or not isinstance(per_second, (int, float)) or not 0 < per_second < 1e9:
            raise InvalidInput("per_second", f"must be a number of tokens per second above 0 (got {per_second!r})")
        per_second = float(per_second)
    if burst is not None:
        if per_second is None:
            raise InvalidInput("burst", "is the size of a rate bucket: set per_second with it")
        if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not 1 <= burst < 1e15:
            raise InvalidInput("burst", f"must be a number of tokens of at least 1 (got {burst!r})")
        burst = float(burst)
    elif per_second is not None:
        burst = max(1.0, per_second)  # one second's worth
    if max_running is None and per_second is None and all(t is None for t in totals.values()):
        raise InvalidInput("max_running", "a limit needs max_running, per_second, or a window's total "
                                          "(per_minute, per_hour, per_day)")
    if not isinstance(counts, str) or counts not in COUNTS:
        raise InvalidInput("counts", f"must be one of {', '.join(COUNTS)} (got {counts!r})")
    yield BEGIN
    by, via = yield from acting(by, via)
    yield one("set_limit", key=key, max_running=max_running, per_second=per_second, burst=burst, counts=counts,
              actor=by, **totals)
    # a statement of its own, after the row is locked: see count_limit
    yield one("count_limit", key=key)
    windows = {name: total for name, total in totals.items() if total is not None}
    yield from audit(by, via, "set_limit", f"limit:{key}", max_running=max_running, per_second=per_second,
                     burst=burst, counts=counts, **windows)
    found = yield rows("list_limits", key=key)
    yield COMMIT
    return _usage(found[0])


def delete_limit(s: Settings, key: str, *, by: str | None = None, via: str | None = None) -> Op[None]:
    """:meth:`leaseq.Queue.delete_limit`."""
    key = checks.check_name("key", key)
    yield BEGIN
    by, via = yield from acting(by, via)
    if (yield one("delete_limit", key=key)) is None:
        raise NotFound(f"limit {key!r} does not exist")
    yield from audit(by, via, "delete_limit", f"limit:{key}")
    yield COMMIT


def limits(s: Settings, key: str | None = None) -> Op[list[dict[str, Any]]]:
    """:meth:`leaseq.Queue.limits`."""
    if key is not None:
        checks.check_name("key", key)
    yield BEGIN
    found = yield rows("list_limits", key=key)
    yield COMMIT
    return [_usage(r) for r in found]


def _usage(row: dict[str, Any]) -> dict[str, Any]:
    tokens = row["tokens"]
    return {
        "key": row["key"],
        "max_running": row["max_running"],
        "per_second": row["per_second"],
        "burst": row["burst"],
        "counts": row["counts"],
        "running": int(row["running"]),  # leases, or units in them (counts="units")
        "leases": int(row["leases"]),
        "available": None if row["max_running"] is None else max(0, row["max_running"] - int(row["running"])),
        "tokens": None if tokens is None else round(float(tokens), 3),
        "changed_at": row["changed_at"],
        "changed_by": row["changed_by"],
        # WINDOWS: each total and what its window holds now (reservations of live claims, and
        # usage settled), and the usage settled today (ctx.consume), by the database's UTC day
        **{name: row[name] for name in WINDOWS},
        "minute_used": int(row["minute_used"]),
        "hour_used": int(row["hour_used"]),
        "day_used": int(row["day_used"]),
        "spent_today": int(row["spent_today"]),
    }
