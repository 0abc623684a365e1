"""WorkerStats: the counters of one worker runtime."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class WorkerStats:
    """Counters of one runtime, for progress lines, metrics and tests."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    lost: int = 0
    #: leases presumed lost on the worker's clock (no successful renewal within
    #: the lease length); each also ends in ``lost``, or in ``recovered``
    presumed_lost: int = 0
    #: presumed losses whose handler's success the queue still accepted (a
    #: renewal had committed unanswered): counted in ``completed``, not ``lost``
    recovered: int = 0
    released: int = 0
    #: attempts that ended on the handler's request to run later (leaseq.Retry)
    snoozed: int = 0
    #: attempts that ended in a durable wait (ctx.sleep, ctx.wait_for_signal)
    suspended: int = 0
    #: attempts stopped for running past their timeout (their leases given up
    #: with reason "timeout"; each also counts in ``released`` once recorded)
    timed_out: int = 0
    #: renewal calls sent (each renews every lease the worker holds), answered or not
    renewals: int = 0
    #: outcomes whose write was refused after an earlier try failed in transit:
    #: that try may have been written (the task's row says which)
    unconfirmed: int = 0
    #: claims that failed in transit (and were retried), and outcomes the
    #: infrastructure kept from being recorded before their lease ended
    transient_errors: int = 0
    started_at: float = field(default_factory=time.monotonic)
    lost_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Completed tasks per second since start."""
        return self.completed / max(1e-9, time.monotonic() - self.started_at)
