"""Written by hand on each side: holding an attempt to its lease, and ending a revoked worker's leases.

Not generated from an awaited source (see :data:`.generate.HAND_WRITTEN`): :meth:`~FenceOps.hold_attempt`
keeps a transaction open while the caller's block runs, which :class:`leaseq.AsyncQueue` holds
differently (on SQLite on a thread of its own); :meth:`~FenceOps.end_worker_leases` runs in a
transaction the caller holds, and has no awaited twin.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .. import engine
from ..core import checks
from ..core.errors import LeaseLost
from ..store import Tx
from .base import QueueBase


class FenceOps(QueueBase):
    """The fences of :class:`leaseq.Queue` written by hand."""

    @contextlib.contextmanager
    def hold_attempt(self, task_id: int, generation: int, *, epoch: int = 0) -> Iterator[None]:
        """Hold attempt ``generation`` of ``task_id``, claimed in lease epoch ``epoch``, to its live lease
        while the block runs.

        For a downstream fence on another database
        (:class:`leaseq.fencing.QueueLeaseCheck`): raises :class:`LeaseLost` if
        the attempt is not the running one with a live lease; otherwise keeps
        a transaction open (the row ``FOR SHARE`` on PostgreSQL, the write
        lock on SQLite) so no claim, cancel or expiry routing can take the
        task until the block ends. Keep the block short.
        """
        task_id = checks.check_task_id(task_id)
        generation = checks.check_int("generation", generation, minimum=0)
        epoch = checks.check_int("epoch", epoch, minimum=0)
        with self.store.transaction() as tx:
            if tx.row("attempt_holds_lease", task_id=task_id, generation=generation, epoch=epoch) is None:
                raise LeaseLost(task_id, generation, "the attempt no longer holds its lease")
            yield

    def end_worker_leases(self, tx: Tx, wid: str, reason: str) -> int:
        """End every lease of a just-revoked worker, with a ``lease_revoked`` event each (in ``tx``).
        Returns how many leases ended."""
        return engine.drive_in(tx, engine.expiry.end_worker_leases(self.settings, wid, reason))
