"""Prometheus metrics and optional OpenTelemetry spans for the service.

Each application has its own :class:`~prometheus_client.CollectorRegistry`
(never the global one), so several apps in one process do not collide.
Two kinds of series:

* counted by this replica as requests pass: claims, lease losses by reason,
  claim and heartbeat latency, HTTP requests;
* read from the database at scrape time (the same on every replica): tasks
  by queue and status, oldest queued age, expired leases not yet routed,
  the reconciliation backlog, effect intents without a response, paused queues,
  and each limit's usage (what live leases hold, its cap, its rate bucket's tokens, what each
  window holds of its total, and the usage settled today by ``ctx.consume``, and per tenant
  and day: the :data:`~leaseq.service.stats.SPEND_TENANTS` tenants that settled the most,
  the rest summed as one).

Spans are made only when the application set an OpenTelemetry tracer provider
(:func:`leaseq.observability.tracing.enabled`); it is not a dependency.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.errors import LeaseqError
from ..core.model import Status, Worker, WorkerState
from ..observability import tracing
from ..queue import Queue
from . import stats as reads

logger = logging.getLogger("leaseq.service")

#: The instrumentation name of the service's spans.
TRACER_NAME = "leaseq.service"

#: Days of settled spend the ``leaseq_limit_spend`` series shows, today included: yesterday's
#: total stays readable for a day after the UTC midnight that ends it.
SPEND_DAYS = 2

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """An OpenTelemetry span when a tracer provider is set, else a no-op context.

    Without a provider OpenTelemetry's own spans are no-ops too, but making one
    still attaches a context per call: on the worker API's hot path that was
    3 % of the service's CPU.
    """
    trace = tracing.api()
    if trace is None:
        return nullcontext()
    current: AbstractContextManager[Any] = trace.get_tracer(TRACER_NAME).start_as_current_span(
        name, attributes={k: v for k, v in attributes.items() if v is not None})
    return current


class QueueCollector(Collector):
    """Gauges read from the database at each scrape."""

    def __init__(self, queue: Queue):
        self.queue = queue

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("leaseq_database_up", "1 if the last scrape could read the database")
        try:
            stats = self.queue.stats()
            paused = self.queue.queues()
            limits = self.queue.limits()
            spend = reads.spend_by_tenant(self.queue, SPEND_DAYS)
            workers = self.queue.workers()
            with self.queue.store.transaction() as tx:
                intents = tx.rows("open_intents_by_queue")
        except LeaseqError as exc:
            logger.warning("metrics scrape could not read the database: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        tasks = GaugeMetricFamily("leaseq_tasks", "Tasks by queue and status", labels=["queue", "status"])
        oldest = GaugeMetricFamily("leaseq_oldest_queued_seconds", "Age of the oldest due queued task",
                                   labels=["queue"])
        expired = GaugeMetricFamily("leaseq_expired_leases",
                                    "Running tasks past their lease deadline, not yet routed", labels=["queue"])
        backlog = GaugeMetricFamily("leaseq_reconciliation_backlog",
                                    "Tasks waiting for a person: needs_reconciliation and blocked",
                                    labels=["queue", "status"])
        # Every status of every known queue, zeros included: a series that vanished
        # when its count reached zero would leave alerts reading a stale value.
        rows = {(row["queue"], row["status"]): row for row in stats}
        queues = sorted({r["queue"] for r in stats} | {r["name"] for r in paused})
        for queue in queues:
            for status in Status:
                row = rows.get((queue, status.value))
                tasks.add_metric([queue, status.value], row["count"] if row else 0)
                if status in (Status.NEEDS_RECONCILIATION, Status.BLOCKED):
                    backlog.add_metric([queue, status.value], row["count"] if row else 0)
            queued, running = rows.get((queue, "queued")), rows.get((queue, "running"))
            oldest.add_metric([queue], float(queued["oldest_queued_seconds"] or 0.0) if queued else 0.0)
            expired.add_metric([queue], (running["expired_leases"] or 0) if running else 0)
        open_fx = GaugeMetricFamily("leaseq_effect_intents_open",
                                    "Effect intents recorded without a response", labels=["queue"])
        for row in intents:
            open_fx.add_metric([row["queue"]], row["count"])
        off = GaugeMetricFamily("leaseq_queue_paused", "1 while a queue's off-switch is on", labels=["queue"])
        for row in paused:
            off.add_metric([row["name"]], 1 if row["paused"] else 0)
        in_use = GaugeMetricFamily("leaseq_limit_running",
                                   "What live leases hold of a limit: leases, or units for a limit that counts units",
                                   labels=["limit"])
        cap = GaugeMetricFamily("leaseq_limit_max_running", "A limit's max_running", labels=["limit"])
        tokens = GaugeMetricFamily("leaseq_limit_tokens", "Tokens in a limit's rate bucket now", labels=["limit"])
        used = GaugeMetricFamily("leaseq_limit_window_used",
                                 "What a limit's fixed window holds now: the claims' reservations and the usage "
                                 "settled after the call", labels=["limit", "window"])
        total = GaugeMetricFamily("leaseq_limit_window_total", "A limit's total over a fixed window",
                                  labels=["limit", "window"])
        spent = GaugeMetricFamily("leaseq_limit_spent_today",
                                  "Usage settled after the call (ctx.consume) today, by the database's UTC day",
                                  labels=["limit"])
        for row in limits:
            in_use.add_metric([row["key"]], row["running"])
            if row["max_running"] is not None:
                cap.add_metric([row["key"]], row["max_running"])
            if row["tokens"] is not None:
                tokens.add_metric([row["key"]], row["tokens"])
            for window in ("minute", "hour", "day"):
                if row[f"per_{window}"] is not None:
                    used.add_metric([row["key"], window], row[f"{window}_used"])
                    total.add_metric([row["key"], window], row[f"per_{window}"])
            spent.add_metric([row["key"]], row["spent_today"])
        by_tenant = GaugeMetricFamily("leaseq_limit_spend",
                                      "Usage settled after the call (ctx.consume) per limit key, tenant (the "
                                      "fairness key of the tasks that consumed it; empty: none) and UTC day, "
                                      f"over the last {SPEND_DAYS} days: the {reads.SPEND_TENANTS} tenants "
                                      f"that settled the most per limit and day, the rest summed under "
                                      f'tenant="{reads.OTHER_TENANT}"', labels=["limit", "tenant", "day"])
        for row in spend:
            by_tenant.add_metric([row["key"], row["tenant"], row["day"]], row["units"])
        yield from (tasks, oldest, expired, backlog, open_fx, off, in_use, cap, tokens, used, total, spent, by_tenant)
        yield from _worker_metrics(workers)


#: A stopped, lost or revoked worker's own series are kept this long after its last heartbeat
#: (every restart registers a new identity: they would pile up for ever).
WORKER_SERIES_KEPT = 24 * 3600.0


def _worker_metrics(workers: list[Worker]) -> Iterator[GaugeMetricFamily]:
    """Workers by state (every state, zeros included), and each recent worker's last
    heartbeat and state, with the reason it stopped."""
    by_state = GaugeMetricFamily("leaseq_workers", "Registered workers by state, judged at the scrape",
                                 labels=["state"])
    counts = {state.value: 0 for state in WorkerState}
    for w in workers:
        counts[w.state or "unknown"] += 1
    for state, count in counts.items():
        by_state.add_metric([state], count)
    beat = GaugeMetricFamily("leaseq_worker_last_heartbeat_timestamp_seconds",
                             "When each worker last said it was alive (epoch seconds)",
                             labels=["worker", "name", "state"])
    info = GaugeMetricFamily("leaseq_worker_info", "1 per recent worker: its state and the reason it stopped",
                             labels=["worker", "name", "state", "stop_reason"])
    newest = max((w.last_heartbeat_at.timestamp() for w in workers if w.last_heartbeat_at), default=0.0)
    for w in workers:
        if w.last_heartbeat_at is None:
            continue
        at = w.last_heartbeat_at.timestamp()
        if w.state in ("alive", "late") or newest - at <= WORKER_SERIES_KEPT:
            beat.add_metric([w.id, w.name, w.state or "unknown"], at)
            info.add_metric([w.id, w.name, w.state or "unknown", (w.stop_reason or "")[:200]], 1)
    yield from (by_state, beat, info)


class ServiceMetrics:
    """The metrics of one application, in their own registry."""

    def __init__(self, queue: Queue):
        self.registry = CollectorRegistry()
        r = self.registry
        self.claims = Counter("leaseq_claims", "Leases handed out through this replica", ["queue"], registry=r)
        self.lease_losses = Counter("leaseq_lease_losses",
                                    "Guarded calls refused through this replica because the lease was lost",
                                    ["reason"], registry=r)
        self.claim_latency = Histogram("leaseq_claim_latency_seconds", "Time to serve a claim request",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.heartbeat_latency = Histogram("leaseq_heartbeat_latency_seconds",
                                           "Time to serve a batched lease renewal", buckets=_LATENCY_BUCKETS,
                                           registry=r)
        self.requests = Counter("leaseq_http_requests", "HTTP requests served", ["method", "route", "status"],
                                registry=r)
        self.request_latency = Histogram("leaseq_http_request_duration_seconds", "HTTP request latency",
                                         ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        r.register(QueueCollector(queue))

    def lost(self, reason: str, count: int = 1) -> None:
        """Count ``count`` lease losses for ``reason`` (the refused operation)."""
        if count:
            self.lease_losses.labels(reason=reason).inc(count)
