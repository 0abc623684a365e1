"""The ``spans`` fixture: the OpenTelemetry SDK's in-memory exporter behind the process's tracer provider."""

from __future__ import annotations

from typing import Any

import pytest

#: one exporter for the process, as there is one tracer provider
_EXPORTER: list[Any] = []


@pytest.fixture
def spans():
    """The process's tracer provider (set once: OpenTelemetry allows one) exporting to memory."""
    trace = pytest.importorskip("opentelemetry.trace")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        _EXPORTER.append(InMemorySpanExporter())
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER[0]))
        trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider and _EXPORTER, "another tracer provider was set first"
    exporter = _EXPORTER[0]
    exporter.clear()
    yield exporter
    exporter.clear()
