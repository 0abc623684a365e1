"""The worker runtime: claim loop, lease renewer, executor and shutdown."""

from .context import EffectScope, TaskContext
from .runtime import WorkerRuntime, WorkerStats

__all__ = ["EffectScope", "TaskContext", "WorkerRuntime", "WorkerStats"]
