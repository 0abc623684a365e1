"""The runtime's one call per event, fanned out to logs, metrics and traces.

The worker runtime calls a :class:`WorkerObserver` at five moments of each
attempt: the lease was granted (:meth:`~WorkerObserver.started`), the handler
returned or raised (:meth:`~WorkerObserver.returned`), its outcome was
recorded (:meth:`~WorkerObserver.settled`), the lease was lost
(:meth:`~WorkerObserver.lost`), and the runtime forgot the attempt
(:meth:`~WorkerObserver.finished`). The observer keeps the attempt's duration
and outcome on the context and in its log records, counts it in the
worker's Prometheus metrics (when given) and closes its spans (when
a tracer provider is set).
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from . import tracing

if TYPE_CHECKING:  # pragma: no cover
    from ..worker.completer import Outcome
    from ..worker.context import TaskContext
    from .metrics import WorkerMetrics

#: A recorded failure, named by where the task went.
_FAILED_TO = {"queued": "retried", "dead": "failed"}


class TaskLog(logging.LoggerAdapter[logging.Logger]):
    """A task's logger: every record carries the attempt's fields (``task_id``, ``kind``,
    ``generation``, ``attempt``, ``worker_id``, and once known ``duration`` and ``outcome``),
    merged with the call's own ``extra``."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


def outcome_name(outcome: Outcome) -> str | None:
    """How a recording ended the attempt, as the metrics and logs name it (None: a loss, named by
    :meth:`WorkerObserver.lost`, or nothing that ends it)."""
    verdict = outcome.verdict.value
    if verdict == "unconfirmed":
        return "unconfirmed"
    if verdict != "recorded":
        return None
    if outcome.op == "complete":
        return "completed"
    if outcome.op == "retry":  # leaseq.Retry: the attempt ended on request
        return "snoozed"
    if outcome.op == "timeout":  # ran past its timeout: the lease was given up
        return "timed_out"
    if outcome.op == "fail":
        status = str(getattr(outcome.value, "status", "failed"))
        return _FAILED_TO.get(status, status)
    return "released"


class WorkerObserver:
    """Logs, metrics and traces of one worker's attempts.

    ``metrics`` (a :class:`~leaseq.observability.metrics.WorkerMetrics`) is
    optional; spans are made once the application has set an OpenTelemetry tracer provider.
    """

    def __init__(self, metrics: WorkerMetrics | None = None):
        self.metrics = metrics
        self.worker_id = ""

    def wrap(self, transport: Any) -> Any:
        """The transport the runtime should use: counted when there are metrics."""
        return self.metrics.wrap(transport) if self.metrics is not None else transport

    def started(self, ctx: TaskContext, worker_id: str, claim_sent: float, *,
                waits: bool = False) -> contextvars.Context | None:
        """The lease was granted and the handler is about to run (``waits``: it was claimed
        ahead and waits for a handler slot first, :meth:`slot_taken`). Returns the context
        the handler's task should run in (None: the current one)."""
        if self.metrics is not None:
            self.metrics.claimed.labels(ctx.task.kind).inc()
        if not waits:
            self.slot_taken(ctx)
        return tracing.start_attempt(ctx, worker_id, claim_sent)

    def slot_taken(self, ctx: TaskContext) -> None:
        """The handler begins: its duration starts here, and it counts as running."""
        ctx.started_at = time.monotonic()
        ctx.handler_began = True
        tracing.handler_started(ctx)
        if self.metrics is not None:
            self.metrics.running.inc()

    def returned(self, ctx: TaskContext, exc: BaseException | None) -> None:
        """The handler returned (``exc`` None) or raised ``exc`` (a cancellation included)."""
        if ctx.duration is not None or not ctx.handler_began:  # claimed ahead, never started: nothing ran
            return
        ctx.duration = round(time.monotonic() - ctx.started_at, 6)
        _log_field(ctx, "duration", ctx.duration)
        if self.metrics is not None:
            self.metrics.running.dec()
        tracing.handler_returned(ctx, exc)

    def settled(self, ctx: TaskContext, outcome: Outcome) -> None:
        """An outcome was recorded (or not): name it, once per attempt."""
        name = outcome_name(outcome)
        if name is not None:
            self._ended(ctx, name, outcome.detail)

    def suspended(self, ctx: TaskContext, detail: str) -> None:
        """The attempt ended in a durable wait (ctx.sleep, ctx.wait_for_signal)."""
        self._ended(ctx, "suspended", detail)

    def lost(self, ctx: TaskContext, reason: str) -> None:
        """The lease was lost: the attempt's outcome, unless one was already recorded."""
        self._ended(ctx, "lost", reason)

    def finished(self, ctx: TaskContext) -> None:
        """The runtime forgot the attempt: observe its duration, close its span."""
        if ctx.duration is None:  # cancelled before the handler's first step
            self.returned(ctx, None)
        if self.metrics is not None and ctx.duration is not None:
            self.metrics.duration.labels(ctx.task.kind, ctx.outcome or "unrecorded").observe(ctx.duration)
        tracing.end_attempt(ctx)

    def _ended(self, ctx: TaskContext, name: str, detail: str | None) -> None:
        if ctx.outcome is not None:
            return
        ctx.outcome = name
        _log_field(ctx, "outcome", name)
        if self.metrics is not None:
            self.metrics.tasks.labels(ctx.task.kind, name).inc()
        tracing.attempt_outcome(ctx, name, detail)


def _log_field(ctx: TaskContext, key: str, value: Any) -> None:
    extra = getattr(ctx.log, "extra", None)
    if isinstance(extra, dict):
        extra[key] = value
