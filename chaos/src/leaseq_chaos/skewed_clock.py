"""A wrong local clock for one chaos worker process. Leases must not care.

Only the chaos worker entry point (:mod:`leaseq_chaos.worker_process`) calls
:func:`install`, before it imports the worker, from the values the harness
put in its environment. Nothing else in leaseq reads these variables, and
nothing here touches the database: the queue judges every lease by the
database's own clock (``now()``), so a worker with a wrong clock can only
fool itself. The worker's Python clocks are changed:

* wall time (``time.time``, ``time.time_ns``) is off by ``offset`` seconds;
* the monotonic clock (``time.monotonic``, which the lease renewer and
  asyncio's timers use) runs at ``rate`` times real speed, so a slow clock
  renews late and notices a lost lease late.

On SQLite the database's ``now()`` is computed by the SQLite library inside
each process from the operating system's clock, which no process can skew;
so is PostgreSQL's, on its own server.
"""

from __future__ import annotations

import time

OFFSET_ENV = "LEASEQ_CHAOS_CLOCK_OFFSET"
RATE_ENV = "LEASEQ_CHAOS_CLOCK_RATE"


def install(offset: float, rate: float) -> None:
    """Skew this process's Python clocks: wall time by ``offset`` seconds, monotonic time by ``rate``."""
    if not 0.1 <= rate <= 10:
        raise ValueError(f"rate must be between 0.1 and 10, not {rate}")
    real_time, real_time_ns, real_mono = time.time, time.time_ns, time.monotonic
    start = real_mono()

    def skewed_time() -> float:
        return real_time() + offset

    def skewed_time_ns() -> int:
        return real_time_ns() + int(offset * 1e9)

    def skewed_monotonic() -> float:
        return start + (real_mono() - start) * rate

    time.time = skewed_time
    time.time_ns = skewed_time_ns
    time.monotonic = skewed_monotonic
