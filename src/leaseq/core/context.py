"""The context of the task handler running in this thread or asyncio task.

The worker runtime sets it around each handler; ``@leaseq.tool`` functions
and the queue's own calls made from inside a handler (a decision, which must
know which task makes it) read it. It lives in the core so that the layers
beneath the worker can read it without importing the worker.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..worker.context import TaskContext

#: The running handler's :class:`~leaseq.TaskContext` (None: no handler runs here).
current_context: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar("leaseq_task_context",
                                                                                      default=None)
