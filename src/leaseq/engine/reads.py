"""Reads: tasks, their evidence trail, workers, queues, counts and the database clock."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..core import checks
from ..core.model import Event, Task, Worker, worker_from_row
from .common import Settings, require_task, rows_of_task, to_task
from .steps import BEGIN_ONE, COMMIT, Op, one, rows


def _read(query: str, **params: Any) -> Op[list[dict[str, Any]]]:
    # One statement, its own transaction: one round trip on PostgreSQL, not three.
    yield BEGIN_ONE
    found: list[dict[str, Any]] = yield rows(query, **params)
    yield COMMIT
    return found


def get(s: Settings, task_id: int) -> Op[Task]:
    """:meth:`leaseq.Queue.get`."""
    task_id = checks.check_task_id(task_id)
    yield BEGIN_ONE
    row = yield from require_task(task_id)
    yield COMMIT
    return to_task(row)


def list_tasks(s: Settings, *, status: str | None = None, queue: str | None = None,
               limit: int = 100) -> Op[list[Task]]:
    """:meth:`leaseq.Queue.list_tasks`."""
    if status is not None:
        checks.check_status(status)
    if queue is not None:
        checks.check_name("queue", queue)
    checks.check_int("limit", limit, minimum=1, maximum=100_000)
    return [to_task(r) for r in (yield from _read("list_tasks", status=status, queue=queue, limit=limit))]


def events(s: Settings, task_id: int) -> Op[list[Event]]:
    """:meth:`leaseq.Queue.events`."""
    return [Event(**r) for r in (yield from rows_of_task(task_id, "list_events"))]


def trails(s: Settings, *, limit: int = 100_000) -> Op[list[tuple[Task, list[Event]]]]:
    """Every task (the newest ``limit``, newest first), each with its evidence trail as
    :func:`events` reads it: two statements, however many tasks (the replay of every trail
    against the lease model, ``leaseq_chaos.traces.validate_queue``, reads them all). The tasks
    are read first: each trail holds at least what a read of :func:`events` after the task's
    would."""
    checks.check_int("limit", limit, minimum=1, maximum=100_000)
    tasks = yield from _read("list_tasks", status=None, queue=None, limit=limit)
    by_task: dict[int, list[Event]] = {}
    found = yield from _read("list_trails", limit=limit)
    for r in sorted(found, key=lambda r: (r["task_id"], r["id"])):  # a scope's cut may reorder them
        del r["queue"]  # the scope's cut (PostgreSQL), not part of an event
        by_task.setdefault(r["task_id"], []).append(Event(**r))
    return [(to_task(t), by_task.get(t["id"], [])) for t in tasks]


def workers(s: Settings) -> Op[list[Worker]]:
    """:meth:`leaseq.Queue.workers`."""
    return [worker_from_row(r) for r in (yield from _read("list_workers"))]


def kind_declaration(s: Settings, kind: str) -> Op[dict[str, Any] | None]:
    """:meth:`leaseq.Queue.kind_declaration`."""
    found = yield from _read("kind_declaration", kind=checks.check_kind(kind))
    return found[0] if found else None


def queues(s: Settings) -> Op[list[dict[str, Any]]]:
    """:meth:`leaseq.Queue.queues`."""
    return (yield from _read("list_queues"))


def stats(s: Settings) -> Op[list[dict[str, Any]]]:
    """:meth:`leaseq.Queue.stats`."""
    return (yield from _read("stats"))


def database_authority(s: Settings) -> Op[str | None]:
    """:meth:`leaseq.Queue.database_authority`."""
    yield BEGIN_ONE
    row = yield one("caller_kind")
    yield COMMIT
    return None if row is None else str(row["kind"])


def now(s: Settings) -> Op[datetime]:
    """:meth:`leaseq.Queue.now`."""
    yield BEGIN_ONE
    row = yield one("db_now")
    yield COMMIT
    db_now: datetime = row["now"]
    return db_now
