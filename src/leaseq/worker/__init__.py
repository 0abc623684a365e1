"""The worker runtime: transport port, handler registry, claim loop, renewer, completer and shutdown."""

from .context import TaskContext
from .effect_scope import EffectScope
from .registry import Registry
from .runtime import WorkerRuntime, WorkerStats
from .transport import Capabilities, Transport

__all__ = ["Capabilities", "EffectScope", "Registry", "TaskContext", "Transport", "WorkerRuntime", "WorkerStats"]
