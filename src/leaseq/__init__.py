"""leaseq: a task queue for agent work where a claim is a lease, not a status flag.

    import leaseq
    q = leaseq.connect()                 # $LEASEQ_DSN, else sqlite:///leaseq.db
    q.migrate()
    w = q.register_worker("worker-a")
    q.enqueue("summarize", {"doc": 1})
    for claim in q.claim(w):
        q.complete(w, claim, result={"ok": True})
"""

from .aio import AsyncQueue, connect_async
from .app import App, TaskDefinition
from .core.errors import (ApprovalExpired, ApprovalMismatch, BackendUnavailable, BudgetSpent, ChildFailed, ConfigError, CredentialMissing,
                          IdempotencyKeyConflict, InvalidInput, InvalidTransition, LeaseLost, LeaseqError, NotFound,
                          Permanent, QueuePaused, StaleToken, ToolCallDiverged, UnknownWorker, WaitTimedOut)
from .core.retry import Retry, RetryPolicy
from .core.model import (Approval, ChildHandle, Claim, Claims, Effect, EffectKind, Event, Status, StreamItem, Task,
                         Worker)
from .engine.approvals import approval_digest
from .queue import Queue, connect
from .worker.context import TaskContext
from .worker.tools import Tool, tool

__version__ = "0.1.0"

__all__ = [
    "App", "Approval", "ApprovalExpired", "ApprovalMismatch", "approval_digest", "CredentialMissing", "Permanent", "TaskDefinition", "TaskContext",
    "AsyncQueue", "BackendUnavailable", "BudgetSpent", "ChildFailed", "ChildHandle", "Claim", "Claims", "ConfigError", "Effect", "EffectKind", "Event",
    "IdempotencyKeyConflict", "InvalidInput", "InvalidTransition", "LeaseLost", "LeaseqError", "NotFound", "Queue", "QueuePaused",
    "Retry", "RetryPolicy",
    "StaleToken", "Status", "StreamItem", "Task", "Tool", "ToolCallDiverged", "UnknownWorker", "WaitTimedOut", "Worker", "connect",
    "connect_async", "tool",
]
