"""Prometheus metrics of one worker process: what it ran, how long, and what the queue cost it.

``leaseq worker … --metrics-port PORT`` serves them at ``/metrics``
(prometheus-client: ``pip install 'leaseq[metrics]'``). Each worker has its own
registry, never the process-wide default. The series:

* ``leaseq_worker_tasks_claimed_total{kind}``: leases this worker was granted;
* ``leaseq_worker_tasks_total{kind,outcome}``: attempts by how they ended:
  ``completed``; ``retried`` (the handler failed, the task is queued again);
  ``failed`` (dead); ``blocked``; ``needs_reconciliation``; ``released``;
  ``snoozed`` (the handler raised ``leaseq.Retry``); ``timed_out`` (it ran past
  its timeout and the lease was given up); ``suspended`` (it began a durable
  wait: ``ctx.sleep``, ``ctx.wait_for_signal``); ``lost`` (the lease ended before an
  outcome was recorded); ``unconfirmed``;
* ``leaseq_worker_handler_duration_seconds{kind,outcome}``: handler run time;
* ``leaseq_worker_running_tasks``: handlers running now;
* ``leaseq_worker_calls_total{call}``, ``leaseq_worker_call_duration_seconds{call}``:
  calls to the queue (``claim``, ``renew``, ``complete`` (one per batch),
  ``fail``, ``retry``, ``release``), and ``leaseq_worker_call_errors_total{call,error}``,
  where ``error="infrastructure"`` is a call that failed in transit (the
  worker retries it while the lease lasts) and ``error="refused"`` one the
  queue refused (a lost lease, a revoked worker);
* ``leaseq_worker_leases_renewed_total``: leases extended by the renewals.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..core.errors import is_transient

if TYPE_CHECKING:
    from ..core.model import Claim
    from ..worker.transport import Transport

R = TypeVar("R")

#: Handler durations: agent work runs from milliseconds to many minutes.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class WorkerMetrics:
    """The series of one worker, in their own :class:`~prometheus_client.CollectorRegistry`."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.claimed = Counter("leaseq_worker_tasks_claimed", "Leases this worker was granted", ["kind"],
                               registry=r)
        self.tasks = Counter("leaseq_worker_tasks", "Attempts run by this worker, by how they ended",
                             ["kind", "outcome"], registry=r)
        self.duration = Histogram("leaseq_worker_handler_duration_seconds", "Handler run time",
                                  ["kind", "outcome"], buckets=DURATION_BUCKETS, registry=r)
        self.running = Gauge("leaseq_worker_running_tasks", "Handlers running now", registry=r)
        self.calls = Counter("leaseq_worker_calls", "Calls to the queue", ["call"], registry=r)
        self.call_errors = Counter("leaseq_worker_call_errors",
                                   "Calls to the queue that failed: in transit (infrastructure, retried) or refused",
                                   ["call", "error"], registry=r)
        self.call_duration = Histogram("leaseq_worker_call_duration_seconds", "Time a call to the queue took",
                                       ["call"], buckets=CALL_BUCKETS, registry=r)
        self.renewed = Counter("leaseq_worker_leases_renewed", "Leases extended by this worker's renewals",
                               registry=r)

    def wrap(self, transport: Any) -> MeteredTransport:
        """``transport`` with its calls counted (and the same declared capabilities)."""
        return MeteredTransport(transport, self)

    def serve(self, port: int, addr: str = "127.0.0.1") -> tuple[Any, int]:
        """Serve ``/metrics`` over HTTP in a daemon thread; returns (server, the port bound)."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server, server.server_port


class MeteredTransport:
    """A port whose calls to the queue are counted and timed; everything else is forwarded.

    It forwards the wrapped port's ``capabilities`` and with them the promise
    of the calls each flag names (``complete_and_claim``, ``listener``, …).
    """

    def __init__(self, transport: Any, metrics: WorkerMetrics):
        # Typed as the fullest port: only the calls its capabilities declare are made.
        self._transport: Transport = transport
        self._metrics = metrics

    def __getattr__(self, name: str) -> Any:  # capabilities, listener, register_worker, effects, ...
        return getattr(self._transport, name)

    def _done(self, call: str, started: float, exc: BaseException | None) -> None:
        m = self._metrics
        m.calls.labels(call).inc()
        m.call_duration.labels(call).observe(time.monotonic() - started)
        if exc is not None:
            m.call_errors.labels(call, "infrastructure" if is_transient(exc) else "refused").inc()

    async def _timed(self, call: str, fn: Callable[..., Awaitable[R]], *args: Any, **kwargs: Any) -> R:
        started = time.monotonic()
        try:
            value = await fn(*args, **kwargs)
        except Exception as exc:
            self._done(call, started, exc)
            raise
        self._done(call, started, None)
        return value

    async def claim(self, worker: Any, **kwargs: Any) -> list[Claim]:
        return await self._timed("claim", self._transport.claim, worker, **kwargs)

    async def renew_leases(self, worker: Any, claims: list[Claim]) -> dict[int, datetime]:
        renewed = await self._timed("renew", self._transport.renew_leases, worker, claims)
        self._metrics.renewed.inc(len(renewed))
        return renewed

    async def complete(self, worker: Any, claim: Any, result: Any = None) -> Any:
        return await self._timed("complete", self._transport.complete, worker, claim, result)

    async def complete_many(self, worker: Any, done: list[tuple[Claim, Any]]) -> set[int]:
        return await self._timed("complete", self._transport.complete_many, worker, done)

    async def complete_and_claim(self, worker: Any, done: list[tuple[Claim, Any]],
                                 **claim: Any) -> tuple[set[int], list[Claim]]:
        return await self._timed("complete", self._transport.complete_and_claim, worker, done, **claim)

    async def fail(self, worker: Any, claim: Any, error: str, **kwargs: Any) -> Any:
        return await self._timed("fail", self._transport.fail, worker, claim, error, **kwargs)

    async def release(self, worker: Any, claim: Any, reason: str = "released", **kwargs: Any) -> Any:
        return await self._timed("release", self._transport.release, worker, claim, reason, **kwargs)

    async def retry(self, worker: Any, claim: Any, after: float = 0.0, reason: str = "retry requested") -> Any:
        return await self._timed("retry", self._transport.retry, worker, claim, after, reason)
