"""Waiting for a task's end: what :meth:`leaseq.Queue.wait` returns on, and the look that starts a wait.

The wait itself is a loop of its drivers (Queue, AsyncQueue, the service's
long poll): listen first (``store.task_listener``: PostgreSQL LISTEN on
``leaseq_task_<id>``, or a short sleep on SQLite), then :func:`watch` (mark
the task watched, so its end is notified, and read it), then read again
whenever the listener wakes, until the task is :data:`SETTLED` or the time
is up.
"""

from __future__ import annotations

import math
from typing import Any

from ..core import checks
from ..core.errors import InvalidInput
from ..core.model import Status, Task
from .common import Settings
from .reads import get
from .steps import BEGIN_ONE, COMMIT, Op, rows

#: The statuses a wait returns on: the task has ended, or it is parked for a person.
SETTLED = frozenset(s.value for s in (Status.COMPLETED, Status.DEAD, Status.CANCELLED, Status.NEEDS_RECONCILIATION,
                                      Status.BLOCKED, Status.DENIED, Status.EXPIRED))
#: The longest a waiter sleeps without looking (seconds): a wait with no timeout still looks now and then.
LONGEST_SLEEP = 3600.0


def check_timeout(timeout: Any) -> float | None:
    """A wait's ``timeout``: seconds, 0 or more (0: one look), or None for no limit."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
        raise InvalidInput("timeout", f"must be a number of seconds, 0 or more, or None (got {timeout!r})")
    return float(timeout)


def watch(s: Settings, task_id: int) -> Op[Task]:
    """Mark the task watched (its end is notified from now on), then read it. NotFound if there is none."""
    task_id = checks.check_task_id(task_id)
    yield BEGIN_ONE
    yield rows("watch_task", task_id=task_id)
    yield COMMIT
    return (yield from get(s, task_id))


def timed_out(task: Task, timeout: float | None) -> TimeoutError:
    """The error of a wait whose time ran out."""
    return TimeoutError(f"task {task.id} is still {task.status} after {timeout:g} s")
