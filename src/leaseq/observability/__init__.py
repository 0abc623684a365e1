"""What a worker tells an operator: log fields, Prometheus metrics, OpenTelemetry spans.

:mod:`.hooks` is what the worker runtime calls; :mod:`.metrics` needs
prometheus-client (``leaseq[metrics]``); :mod:`.tracing` works with or
without OpenTelemetry (``leaseq[otel]``).
"""

from .hooks import TaskLog, WorkerObserver

__all__ = ["TaskLog", "WorkerObserver"]
