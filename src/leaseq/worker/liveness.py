"""The worker's own heartbeat: it says the process is alive, apart from any lease.

A worker registers with its renewal interval (a third of its lease length,
as the renewer renews leases) and its lease length, then writes a heartbeat
twice per interval, so a live worker's last heartbeat is never older than
the interval. Its state is judged when read, by the database's clock
(:func:`leaseq.core.model.worker_state`): alive within the interval, lost
after a lease length without one, which is what a worker killed with SIGKILL
shows without any sweep. A clean exit records ``stopped`` and why
(:meth:`leaseq.Queue.stop_worker`).

A heartbeat that fails is only logged: it decides nothing about leases (the
renewer's guarded renewals do), and the next one is on its way.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..core import checks
from ..core.model import Worker
from .renewer import RENEW_FRACTION

logger = logging.getLogger("leaseq.worker")

#: How long a clean exit waits to record that it stopped before leaving it to be seen as lost.
STOP_BUDGET = 5.0


def liveness(lease_seconds: float | None) -> tuple[float, float]:
    """The ``(heartbeat_seconds, lease_seconds)`` a worker registers with."""
    lease = lease_seconds if lease_seconds is not None else checks.DEFAULT_LEASE_SECONDS
    return lease * RENEW_FRACTION, lease


async def heartbeat(transport: Any, worker: Worker, interval: float) -> None:
    """Write the worker's heartbeat twice per ``interval`` until cancelled."""
    while True:
        await asyncio.sleep(interval / 2)
        try:
            await asyncio.wait_for(transport.heartbeat_worker(worker), timeout=interval)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged; the next heartbeat tries again
            logger.warning("worker %s: heartbeat failed: %r", worker.id, exc)


async def record_stop(transport: Any, worker: Worker, reason: str) -> None:
    """Record the clean exit and its reason, within :data:`STOP_BUDGET`; a failure is logged
    (the worker is then seen as lost a lease length after its last heartbeat)."""
    try:
        await asyncio.wait_for(transport.stop_worker(worker, reason), timeout=STOP_BUDGET)
    except Exception as exc:  # noqa: BLE001 - best effort, at exit
        logger.warning("worker %s: could not record that it stopped (%s): %r", worker.id, reason, exc)
