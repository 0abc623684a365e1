# Generated from children_async.py by `python -m leaseq.queue.generate`: do not edit.
"""Child tasks: what ``ctx.spawn`` and ``ctx.wait_for`` send, guarded by the spawning task's lease."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .. import engine
from ..core import checks
from ..core.model import Claim, Task, Worker
from .base import QueueBase


class ChildOps(QueueBase):
    """The child-task operations of :class:`leaseq.Queue`."""

    def spawn(self, worker: Worker | str, claim: Claim, kind: str, payload: Any = None, *, key: str,
              queue: str | None = None, effect: str = "read_only", priority: int = 0, max_attempts: int = 5,
              lease_seconds: float = checks.DEFAULT_LEASE_SECONDS, actions: Iterable[str] | None = None,
              timeout: float | None = None, limits: Iterable[str] | None = None, units: int = 1,
              resources: Iterable[str] | None = None) -> Task:
        """Enqueue, under ``claim``'s lease, the child task ``key`` of the claimed task (what
        ``ctx.spawn`` sends); returns the child.

        The child (on ``queue``, by default the claimed task's own) records its parent
        (``parent_id``); one transaction writes it and the parent's ledger entry
        ``spawn:<key>`` (action ``leaseq.spawn``), whose response names it: a retried
        attempt that spawns the same ``key`` gets the same child, never a second one. A
        ``child_spawned`` event names it in the parent's evidence trail. Raises
        :class:`LeaseLost` without the lease (a stale generation spawns nothing).
        """
        return self._run(engine.children.spawn(
            self.settings, worker, claim, kind, payload, key=key, queue=queue, effect=effect, priority=priority,
            max_attempts=max_attempts, lease_seconds=lease_seconds, actions=actions, timeout=timeout,
            limits=limits, units=units, resources=resources))

    def wait_children(self, worker: Worker | str, claim: Claim, key: str,
                      child_ids: Sequence[int], *, timeout: float | None = None) -> dict[str, Any]:
        """A durable wait for the claimed task's children ``child_ids``, recorded in the ledger under
        ``key`` (what ``ctx.wait_for`` and ``ctx.wait_for_all`` send).

        Once every one has ended the outcome is recorded and answered, now and on every later
        attempt (``replayed``): ``{"state": "done", "results": [...]}`` (each completed: their
        results in the order named) or ``{"state": "failed", "child": id, "status": ...,
        "error": ...}`` (the first in that order that ended without success). Before, the
        attempt ends under the lease guard (``{"state": "suspended"}``) and the task waits in
        ``waiting``, holding no lease and no slot, until the end of the last of them makes it
        claimable again. With ``timeout`` (seconds from the first attempt that waited) the wait
        ends when it passes: ``{"state": "timed_out", "pending": [...]}``, recorded, so a later
        attempt is answered the same. Raises :class:`LeaseLost` without the lease,
        :class:`InvalidInput` (field ``children``) for a task that is not a child of the
        claimed one, (field ``timeout``) for a bad timeout.
        """
        return self._run(engine.children.wait_children(self.settings, worker, claim, key, child_ids,
                                                       timeout=timeout))
