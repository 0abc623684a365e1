"""The exact check: the fence asks the queue whether an attempt still holds its lease.

A fencing token refuses a paused worker only once a newer attempt of its
task has written to the resource, and a bound action token only once the
lease deadline it carries has passed (plus leeway). A service that can
reach the queue can close the window completely: with
``FencedStore(dsn, lease_check=QueueLeaseCheck())`` every fenced apply asks,
inside its own transaction and before the write runs, whether that task's
attempt (its task, lease epoch and generation) is still the running one with
a live lease, and keeps the answer true until it commits:

- ``QueueLeaseCheck()``: leaseq's tables are in the store's own database.
  The question is a query on the fence's connection: on PostgreSQL it takes
  the task row ``FOR SHARE``, so no claim, cancel or expiry routing can take
  the task before the write commits; on SQLite the fence's ``BEGIN
  IMMEDIATE`` already excludes every other writer.
- ``QueueLeaseCheck(queue)`` with a :class:`leaseq.Queue` on another
  database: the question runs in a transaction on the queue's database that
  stays open (the row held ``FOR SHARE`` on PostgreSQL; SQLite's write lock)
  until the fence's transaction has committed.

An attempt that no longer holds its lease gets :class:`leaseq.StaleToken`
(the middleware's 409), and nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from functools import cache
from typing import Any

from ..core.errors import InvalidInput, LeaseLost, StaleToken


@cache
def _queue_queries(dialect: str) -> dict[str, str]:
    from ..store.base import load_queries

    return load_queries(dialect)


class LeaseCheck:
    """Asks, inside a fenced apply, whether attempt ``generation`` of ``task_id`` still holds its lease."""

    def hold(self, conn: Any, dialect: str, task_id: int, generation: int, *,
             epoch: int = 0) -> AbstractContextManager[None]:
        """A context entered before the write and left after the fence commits.

        ``epoch``: the lease epoch of the attempt's claim (its fencing
        token's); an attempt of another epoch is not the one holding the lease.

        Raises :class:`leaseq.StaleToken` on entry if the lease is not held;
        while entered, the answer may not change.
        """
        raise NotImplementedError


def _not_held(task_id: int, generation: int, epoch: int) -> StaleToken:
    what = f"generation {generation}" + (f" of lease epoch {epoch}" if epoch else "")
    exc = StaleToken(f"task {task_id} {what} no longer holds its lease "
                     "(the queue says so); the write was refused")
    exc.task_id, exc.generation = task_id, generation
    return exc


class QueueLeaseCheck(LeaseCheck):
    """Ask leaseq's queue itself: in the store's own database (``queue=None``) or through a :class:`leaseq.Queue`."""

    def __init__(self, queue: Any = None):
        if queue is not None and not callable(getattr(queue, "hold_attempt", None)):
            raise InvalidInput("queue", "must be a leaseq.Queue, or None when the queue's tables are in "
                               "the fenced store's own database")
        self.queue = queue

    def __repr__(self) -> str:
        return f"QueueLeaseCheck({'same database' if self.queue is None else self.queue!r})"

    @contextmanager
    def hold(self, conn: Any, dialect: str, task_id: int, generation: int, *, epoch: int = 0) -> Iterator[None]:
        if self.queue is not None:
            with ExitStack() as held:
                try:
                    held.enter_context(self.queue.hold_attempt(task_id, generation, epoch=epoch))
                except LeaseLost:
                    raise _not_held(task_id, generation, epoch) from None
                yield
            return
        sql = _queue_queries(dialect)["attempt_holds_lease"]
        params = {"task_id": task_id, "generation": generation, "epoch": epoch}
        if not conn.execute(sql, params).fetchall():
            raise _not_held(task_id, generation, epoch)
        yield
