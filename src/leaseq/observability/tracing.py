"""OpenTelemetry spans for enqueue, claim, the handler run and each effect.

OpenTelemetry is optional (``pip install 'leaseq[otel]'``) and never imported
here: spans are made only once the application has imported it and set a
tracer provider (the SDK's, or an auto-instrumentation's). Otherwise every
function here is a no-op that returns None, at the cost of a dictionary
look-up, and importing leaseq does not import OpenTelemetry.

The spans of one attempt form one tree::

    leaseq.claim {kind}          claim request sent -> lease granted
      leaseq.run {kind}          the handler, until its outcome is recorded (or the lease lost)
        leaseq.effect {action}   each ctx.effect(...) block

``leaseq.enqueue {kind}`` is made on the caller's side. A task's spans would
join the caller's trace if the task carried the caller's trace context; the
task table has no field for it yet, so the claim span starts a trace of its
own (:func:`task_parent` is where a stored context would be read).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from ..worker.context import TaskContext

TRACER_NAME = "leaseq"

F = TypeVar("F", bound=Callable[..., Any])


def _api() -> Any:
    """``opentelemetry.trace`` when spans would go somewhere, else None.

    Not imported here: an application that traces has imported it already.
    Without a provider every span would be a no-op; skipping them saves the
    worker tens of microseconds per task.
    """
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    if isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return trace


def enabled() -> bool:
    """Whether spans are made: OpenTelemetry is imported and a tracer provider is set."""
    return _api() is not None


def _tracer() -> Any:
    # Asked for at each use: an application may install its provider after leaseq was imported.
    return sys.modules["opentelemetry.trace"].get_tracer(TRACER_NAME)


def _error(span: Any, text: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, text[:200]))


def task_attributes(ctx: TaskContext, worker_id: str) -> dict[str, Any]:
    """The attributes every span of one attempt carries."""
    task = ctx.task
    return {"leaseq.task_id": ctx.task_id, "leaseq.kind": task.kind, "leaseq.queue": task.queue,
            "leaseq.generation": ctx.generation, "leaseq.attempt": task.attempts, "leaseq.worker": worker_id}


def task_parent(ctx: TaskContext) -> Any:
    """The trace context a task's spans start under: none is stored with a task yet, so a new trace."""
    return None


def start_attempt(ctx: TaskContext, worker_id: str, claim_sent: float) -> contextvars.Context | None:
    """Open the claim span (from ``claim_sent``, a monotonic time, to now) and the run span under it.

    Returns a copy of the current context with the run span current, for the
    handler's asyncio task (so spans the handler makes nest under the run), or
    None without OpenTelemetry.
    """
    trace = _api()
    if trace is None:
        return None
    from opentelemetry import context as otel_context

    attributes = task_attributes(ctx, worker_id)
    kind = ctx.task.kind
    now_ns = time.time_ns()
    sent_ns = now_ns - int(max(0.0, time.monotonic() - claim_sent) * 1e9)
    tracer = _tracer()
    claim = tracer.start_span(f"leaseq.claim {kind}", context=task_parent(ctx), start_time=sent_ns,
                              attributes={**attributes, "leaseq.lease_seconds": ctx.claim.lease_seconds},
                              kind=trace.SpanKind.CONSUMER)
    claim.end(end_time=now_ns)
    run = tracer.start_span(f"leaseq.run {kind}", context=trace.set_span_in_context(claim),
                            attributes=attributes, start_time=now_ns)
    ctx.span = run
    token = otel_context.attach(trace.set_span_in_context(run))
    try:
        return contextvars.copy_context()
    finally:
        otel_context.detach(token)


def handler_returned(ctx: TaskContext, exc: BaseException | None) -> None:
    """Record the handler's exception (if any) on the run span."""
    span = ctx.span
    if span is None or exc is None or isinstance(exc, asyncio.CancelledError):
        return
    span.record_exception(exc)
    _error(span, f"{type(exc).__name__}: {exc}")


def attempt_outcome(ctx: TaskContext, outcome: str, detail: str | None = None) -> None:
    """Name how the attempt ended on the run span (lost leases are errors)."""
    span = ctx.span
    if span is None or not span.is_recording():
        return
    span.set_attribute("leaseq.outcome", outcome)
    if outcome == "lost":
        span.add_event("lease lost", {"reason": detail or ""})
        _error(span, f"lease lost: {detail}")


def end_attempt(ctx: TaskContext) -> None:
    """Close the run span (once)."""
    span, ctx.span = ctx.span, None
    if span is not None:
        if ctx.duration is not None:
            span.set_attribute("leaseq.duration", ctx.duration)
        span.end()


def start_effect(ctx: TaskContext, action: str, key: str | None) -> Any:
    """Open a span for one ``ctx.effect(...)`` block, under the attempt's run span (any thread)."""
    if ctx.span is None:
        return None
    attributes = {"leaseq.task_id": ctx.task_id, "leaseq.generation": ctx.generation, "leaseq.action": action}
    if key is not None:
        attributes["leaseq.effect_key"] = key
    trace = sys.modules["opentelemetry.trace"]  # a run span exists: it is imported
    return _tracer().start_span(f"leaseq.effect {action}", context=trace.set_span_in_context(ctx.span),
                                attributes=attributes)


def end_effect(span: Any, exc: BaseException | None, *, replayed: bool = False) -> None:
    """Close an effect's span, recording the exception that left the block (if any)."""
    if span is None:
        return
    span.set_attribute("leaseq.replayed", replayed)
    if exc is not None:
        span.record_exception(exc)
        _error(span, f"{type(exc).__name__}: {exc}")
    span.end()


def traced_enqueue(fn: F) -> F:
    """Decorate an ``enqueue(kind, payload, ...)`` method: a ``leaseq.enqueue {kind}`` span on the
    caller's side, naming the task it created."""
    @functools.wraps(fn)
    def enqueue(self: Any, kind: str, *args: Any, **kwargs: Any) -> Any:
        trace = _api()
        if trace is None:
            return fn(self, kind, *args, **kwargs)
        attributes = {"leaseq.kind": str(kind), "leaseq.queue": str(kwargs.get("queue", "default"))}
        with _tracer().start_as_current_span(f"leaseq.enqueue {kind}", attributes=attributes,
                                             kind=trace.SpanKind.PRODUCER) as span:
            task = fn(self, kind, *args, **kwargs)
            task_id = getattr(task, "id", None)
            if task_id is not None:
                span.set_attribute("leaseq.task_id", task_id)
            return task

    return enqueue  # type: ignore[return-value]
