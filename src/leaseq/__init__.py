"""leaseq: a task queue for agent work where a claim is a lease, not a status flag.

    import leaseq
    q = leaseq.connect()                 # $LEASEQ_DSN, else sqlite:///leaseq.db
    q.migrate()
    w = q.register_worker("worker-a")
    q.enqueue("summarize", {"doc": 1})
    for claim in q.claim(w):
        q.complete(w, claim, result={"ok": True})

The public names load on first use (PEP 562): ``import leaseq`` stays cheap for
a process that needs only part of the package (the CLI, a worker, the service).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .aio import AsyncQueue, connect_async
    from .app import App, TaskDefinition
    from .core.errors import (ApprovalExpired, ApprovalMismatch, BackendUnavailable, BudgetSpent, ChildFailed,
                              ConfigError, CredentialMissing, IdempotencyKeyConflict, InvalidInput,
                              InvalidTransition, LeaseLost, LeaseqError, NotFound, Permanent, QueuePaused,
                              StaleToken, ToolCallDiverged, UnknownWorker, WaitTimedOut)
    from .core.model import (Approval, AttemptRef, ChildHandle, Claim, Claims, Effect, EffectKind, Ended, Ending,
                             Event, Status, StreamItem, Task, Worker)
    from .core.retry import Retry, RetryPolicy
    from .engine.approvals import approval_digest
    from .queue import Queue, connect
    from .worker.context import TaskContext
    from .worker.tools import Tool, tool

__version__ = "0.1.0"

#: Where each public name is defined: the module :func:`__getattr__` imports on first use.
_HOMES = {
    ".aio": ("AsyncQueue", "connect_async"),
    ".app": ("App", "TaskDefinition"),
    ".core.errors": ("ApprovalExpired", "ApprovalMismatch", "BackendUnavailable", "BudgetSpent", "ChildFailed",
                     "ConfigError", "CredentialMissing", "IdempotencyKeyConflict", "InvalidInput",
                     "InvalidTransition", "LeaseLost", "LeaseqError", "NotFound", "Permanent", "QueuePaused",
                     "StaleToken", "ToolCallDiverged", "UnknownWorker", "WaitTimedOut"),
    ".core.model": ("Approval", "AttemptRef", "ChildHandle", "Claim", "Claims", "Effect", "EffectKind", "Ended",
                    "Ending", "Event", "Status", "StreamItem", "Task", "Worker"),
    ".core.retry": ("Retry", "RetryPolicy"),
    ".engine.approvals": ("approval_digest",),
    ".queue": ("Queue", "connect"),
    ".worker.context": ("TaskContext",),
    ".worker.tools": ("Tool", "tool"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "App", "Approval", "ApprovalExpired", "ApprovalMismatch", "approval_digest", "CredentialMissing", "Permanent", "TaskDefinition", "TaskContext",
    "AsyncQueue", "AttemptRef", "BackendUnavailable", "BudgetSpent", "ChildFailed", "ChildHandle", "Claim", "Claims", "ConfigError", "Effect", "EffectKind",
    "Ended", "Ending", "Event",
    "IdempotencyKeyConflict", "InvalidInput", "InvalidTransition", "LeaseLost", "LeaseqError", "NotFound", "Queue", "QueuePaused",
    "Retry", "RetryPolicy",
    "StaleToken", "Status", "StreamItem", "Task", "Tool", "ToolCallDiverged", "UnknownWorker", "WaitTimedOut", "Worker", "connect",
    "connect_async", "tool",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use; else a subpackage (``leaseq.auth``)."""
    home = _HOME_OF.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home, __name__), name)
    elif name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    else:
        # `import leaseq` then `leaseq.auth.…`: the eager package imported most submodules as a side
        # effect, and code written against it keeps working.
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
