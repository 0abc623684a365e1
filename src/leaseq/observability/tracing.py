"""OpenTelemetry spans for enqueue (one task or many), claim, the handler run and each effect.

OpenTelemetry is optional (``pip install 'leaseq[otel]'``) and never imported
here: spans are made only once the application has imported it and set a
tracer provider (the SDK's, or an auto-instrumentation's). Otherwise every
function here is a no-op that returns None, at the cost of a dictionary
look-up, and importing leaseq does not import OpenTelemetry.

The spans of one attempt form one tree::

    leaseq.claim {kind}          claim request sent -> lease granted
      leaseq.run {kind}          the handler, until its outcome is recorded (or the lease lost)
        leaseq.effect {action}   each ctx.effect(...) block

``leaseq.enqueue {kind}`` is made on the caller's side (one
``leaseq.enqueue_many {kind}`` for a batch, with ``leaseq.count``), and the task
carries its trace context: the enqueue stores the W3C traceparent of its
span with the task (``Task.trace_context``; over HTTP, RemoteQueue sends it
as the ``traceparent`` header and the service stores it), the claim hands
it to the worker, and the claim span starts under it. So one task's spans
join the trace of the call that enqueued it::

    caller's span
      leaseq.enqueue {kind}
        leaseq.claim {kind}
          leaseq.run {kind}
            leaseq.effect {action}

A task enqueued without tracing (or before the column existed) starts a
trace of its own at its claim.
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


def api() -> Any:
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
    return api() is not None


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
    """The trace context a task's spans start under: the one stored with the task at enqueue, else a new trace."""
    carried = getattr(ctx.task, "trace_context", None)
    if not carried:
        return None
    return _context_from(carried)


def _context_from(traceparent: str) -> Any:
    """An OpenTelemetry context whose parent is the remote span a W3C traceparent names."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def traceparent(span: Any) -> str | None:
    """The W3C traceparent of ``span`` (None if its context is not valid)."""
    sc = span.get_span_context()
    if not sc.is_valid:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def start_attempt(ctx: TaskContext, worker_id: str, claim_sent: float) -> contextvars.Context | None:
    """Open the claim span (from ``claim_sent``, a monotonic time, to now) and the run span under it.

    Returns a copy of the current context with the run span current, for the
    handler's asyncio task (so spans the handler makes nest under the run), or
    None without OpenTelemetry.
    """
    trace = api()
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


def handler_started(ctx: TaskContext) -> None:
    """A task of a worker that claims ahead (``prefetch``) got its handler slot: an event on
    its run span, which began at the claim, says when the handler began (a task claimed ahead
    may wait for a slot first). Without prefetch the run span is opened after this: its run
    and its handler begin together."""
    if ctx.span is not None:
        ctx.span.add_event("leaseq.handler_started")


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


def _enqueue_span(trace: Any, kind: str, kwargs: dict[str, Any], name: str = "leaseq.enqueue",
                  **more: Any) -> Any:
    """The ``leaseq.enqueue`` span (or ``name``'s, with the attributes ``more``), as a context manager.

    A trace context the caller gives (the service passes the one its client
    sent) is stored as given and parents the span; otherwise the span's own
    is stored (the caller puts it in ``kwargs``), so the task's spans nest
    under this enqueue."""
    given = kwargs.get("trace_context")
    parent = _context_from(given) if isinstance(given, str) and _valid(given) else None
    attributes = {"leaseq.kind": str(kind), "leaseq.queue": str(kwargs.get("queue", "default")), **more}
    return _tracer().start_as_current_span(f"{name} {kind}", context=parent, attributes=attributes,
                                           kind=trace.SpanKind.PRODUCER)


def _valid(value: str) -> bool:
    from ..core.checks import parse_traceparent

    return parse_traceparent(value) is not None


def _named(span: Any, task: Any) -> Any:
    task_id = getattr(task, "id", None)
    if task_id is not None:
        span.set_attribute("leaseq.task_id", task_id)
    return task


def traced_enqueue(fn: F) -> F:
    """Decorate an ``enqueue(kind, payload, ...)`` method: a ``leaseq.enqueue {kind}`` span on the
    caller's side, naming the task it created; the task carries the span's trace context."""
    @functools.wraps(fn)
    def enqueue(self: Any, kind: str, *args: Any, **kwargs: Any) -> Any:
        trace = api()
        if trace is None:
            return fn(self, kind, *args, **kwargs)
        with _enqueue_span(trace, kind, kwargs) as span:
            if kwargs.get("trace_context") is None:
                kwargs["trace_context"] = traceparent(span)
            return _named(span, fn(self, kind, *args, **kwargs))

    return enqueue  # type: ignore[return-value]


def atraced_enqueue(fn: F) -> F:
    """:func:`traced_enqueue` for an ``async def enqueue``."""
    @functools.wraps(fn)
    async def enqueue(self: Any, kind: str, *args: Any, **kwargs: Any) -> Any:
        trace = api()
        if trace is None:
            return await fn(self, kind, *args, **kwargs)
        with _enqueue_span(trace, kind, kwargs) as span:
            if kwargs.get("trace_context") is None:
                kwargs["trace_context"] = traceparent(span)
            return _named(span, await fn(self, kind, *args, **kwargs))

    return enqueue  # type: ignore[return-value]


def _many_span(trace: Any, kind: str, payloads: Any, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """The ``leaseq.enqueue_many`` span (as a context manager), counting ``payloads``, and the
    payloads as a list (an iterator is read here, once)."""
    payloads = payloads if isinstance(payloads, (list, tuple)) else list(payloads)
    return _enqueue_span(trace, kind, kwargs, "leaseq.enqueue_many", **{"leaseq.count": len(payloads)}), payloads


def traced_enqueue_many(fn: F) -> F:
    """Decorate an ``enqueue_many(kind, payloads, ...)`` method: one ``leaseq.enqueue_many {kind}``
    span on the caller's side for the whole batch (attributes ``leaseq.kind``, ``leaseq.queue``
    and ``leaseq.count``, the payloads given), its trace context carried by every task, as
    :func:`traced_enqueue` does for one."""
    @functools.wraps(fn)
    def enqueue_many(self: Any, kind: str, payloads: Any, **kwargs: Any) -> Any:
        trace = api()
        if trace is None:
            return fn(self, kind, payloads, **kwargs)
        made, payloads = _many_span(trace, kind, payloads, kwargs)
        with made as span:
            if kwargs.get("trace_context") is None:
                kwargs["trace_context"] = traceparent(span)
            return fn(self, kind, payloads, **kwargs)

    return enqueue_many  # type: ignore[return-value]


def atraced_enqueue_many(fn: F) -> F:
    """:func:`traced_enqueue_many` for an ``async def enqueue_many``."""
    @functools.wraps(fn)
    async def enqueue_many(self: Any, kind: str, payloads: Any, **kwargs: Any) -> Any:
        trace = api()
        if trace is None:
            return await fn(self, kind, payloads, **kwargs)
        made, payloads = _many_span(trace, kind, payloads, kwargs)
        with made as span:
            if kwargs.get("trace_context") is None:
                kwargs["trace_context"] = traceparent(span)
            return await fn(self, kind, payloads, **kwargs)

    return enqueue_many  # type: ignore[return-value]
