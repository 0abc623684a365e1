"""Helpers shared by the conformance suite: table snapshots, waiting on the
database clock, and the body of the multi-process claim test.

Snapshots read the tables directly (a test's own connection, read only), so
"a refused call changes nothing" is checked against the database itself and
not against anything leaseq reports about it.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import leaseq

#: A lease the test does a few calls under before letting it run out: long
#: enough to survive a loaded machine, short enough to wait out.
WORKING_LEASE = 1.0

from snapshots import snapshot  # noqa: E402,F401  (shared with the other folders)


def wait_until(q: leaseq.Queue, moment: datetime, *, timeout: float = 5.0) -> None:
    """Return once the database clock has passed ``moment``.

    Leases are judged by the database's clock, so that is the clock waited on.
    """
    deadline = time.monotonic() + timeout
    while q.now() <= moment:
        if time.monotonic() > deadline:
            raise AssertionError(f"database clock did not pass {moment} within {timeout}s")
        time.sleep(0.02)


def wait_expired(q: leaseq.Queue, claim: leaseq.Claim) -> None:
    """Return once ``claim``'s lease has run out by the database clock."""
    wait_until(q, claim.expires_at)


def run_out(q: leaseq.Queue, worker: leaseq.Worker | str, claim: leaseq.Claim) -> None:
    """End ``claim``'s lease now, as if its deadline had just passed by the database clock.

    For tests about what follows a lease running out rather than about the clock: one that
    claims with a sub-second lease and then acts under it can lose the lease before it acts
    on a loaded machine. The deadline moves into the past through the guarded statement
    :meth:`leaseq.Queue.release` uses, without release's routing or event, so the task
    waits, expired, for the next claim or sweep to route it, like any lease that ran out.
    """
    wid = worker if isinstance(worker, str) else worker.id
    with q.joined() as (_, tx):
        row = tx.row("expire_lease", task_id=claim.task_id, worker_id=wid, generation=claim.generation,
                     unstarted=False)
    assert row is not None, f"task {claim.task_id} generation {claim.generation}: lease not held"


def seconds_between(later: datetime, earlier: datetime) -> float:
    """``later - earlier`` in seconds."""
    return (later - earlier) / timedelta(seconds=1)


def claim_until_empty(dsn: str, barrier: Any, results: Any, batch: int, work_seconds: float = 0.002) -> None:
    """Body of one OS process in the multi-process claim test.

    Opens its own connection, registers its own worker, waits for every
    sibling at ``barrier``, then claims in batches until nothing is left and
    reports ``(task_id, generation)`` pairs on ``results``. ``work_seconds``
    between batches stands in for doing the work; without it one process can
    hold SQLite's write lock back to back while the others sit in their
    busy-wait back-off, and the claims would not overlap at all.
    """
    q = leaseq.connect(dsn)
    try:
        w = q.register_worker("proc")
        barrier.wait(timeout=30)
        got: list[tuple[int, int]] = []
        while True:
            claims = q.claim(w, limit=batch)
            if not claims:
                break
            got.extend((c.task_id, c.generation) for c in claims)
            time.sleep(work_seconds)
        results.put(got)
    finally:
        q.close()
