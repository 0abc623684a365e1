"""Agent-shaped workloads: handlers that wait on a model, and many leases held at once.

*agent*: ``tasks`` queued tasks whose handlers each await ``io_seconds`` of
I/O (``asyncio.sleep`` standing for the model call), ``processes`` worker
processes at ``concurrency`` each; direct to the database, or remote through
a ``leaseq serve`` process on loopback. The ideal rate is
``processes × concurrency ÷ io_seconds`` (1,000 tasks/s for 200 × 200 ms):
what is lost against it is the queue's own cost per task.

*leases*: the heartbeat workload (:func:`bench.workloads.heartbeat`) at
agent scale, 10,000 leases held by 10 workers, read as renewal statements
per worker per second and the database's CPU.
"""

from __future__ import annotations

from typing import Any

from . import systems, workloads
from .database import BenchDatabase
from .processes import WorkerGroup
from .systems.leaseq_system import SERVER_ENV, TOKEN_ENV


def agent(db: BenchDatabase, system: systems.System, *, tasks: int, concurrency: int, io_seconds: float,
          processes: int = 1, remote: bool = False, prefetch: int = 0) -> dict[str, Any]:
    """Worker start to last completion (database clock) for ``tasks`` handlers of ``io_seconds`` each."""
    with workloads._schema_or_file(db, system) as dsn:
        system.install(dsn)
        system.enqueue_batch(dsn, tasks)
        if system.dialect == "postgres":
            workloads._analyze(dsn)
        with _service(dsn, remote, processes) as env:
            group = WorkerGroup(system.name, dsn, count=processes, concurrency=concurrency, mode="io",
                                io_seconds=io_seconds, env=env, prefetch=prefetch).start()
            started = workloads._clock(db, system)
            group.go()
            results = group.wait(finished=lambda: system.finished(dsn)[0] >= tasks)
            count, first, last = system.finished(dsn)
    if count != tasks:
        raise RuntimeError(f"{system.name}: {count} of {tasks} tasks completed")
    ideal = processes * concurrency / io_seconds
    per_s = tasks / (last - started)
    return {"tasks": tasks, "seconds": last - started, "per_s": per_s, "ideal_per_s": ideal,
            "of_ideal_percent": 100 * per_s / ideal, "first_completion_s": first - started,
            "worker_cpu_s": sum(r["cpu_s"] for r in results),
            "worker_rss_mb": max(r["max_rss_mb"] for r in results)}


class _service:
    """For a remote run: ``leaseq serve`` on loopback and a worker token per process (one here);
    yields the environment the worker processes need. A direct run yields None."""

    def __init__(self, dsn: str, remote: bool, processes: int):
        self.dsn, self.remote, self.processes = dsn, remote, processes

    def __enter__(self) -> dict[str, str] | None:
        if not self.remote:
            return None
        if self.processes != 1:
            raise ValueError("a remote agent run uses one worker process (one worker token)")
        import leaseq
        from leaseq import access

        from .service_load import service

        with leaseq.connect(self.dsn) as q:
            token, _ = access.create_token(q, name="bench-agent", role="worker", all_queues=True)
        self._cm = service(self.dsn)
        url = self._cm.__enter__()
        return {SERVER_ENV: url, TOKEN_ENV: token}

    def __exit__(self, *exc: Any) -> None:
        if self.remote:
            self._cm.__exit__(*exc)


def leases(db: BenchDatabase, system: systems.System, *, leases: int, workers: int, seconds: float,
           lease_seconds: float | None = None) -> dict[str, Any]:
    """:func:`bench.workloads.heartbeat`, with the renewal statements per worker per second.

    With ``lease_seconds`` long enough that no renewal falls in the window, it
    measures what the same connections cost the database without renewing:
    the baseline the renewals' cost is read against."""
    out = workloads.heartbeat(db, system, leases=leases, workers=workers, seconds=seconds,
                              lease_seconds=lease_seconds)
    # The renewal statements each worker counted itself, over its whole run; and the
    # database's transactions per worker in the measured window (renewals, plus what
    # idle backends run on a shared server: an upper bound).
    out["statements_per_worker_s"] = out.pop("renewals_per_worker_s")
    out["transactions_per_worker_s"] = out["transactions_per_s"] / workers
    return out
