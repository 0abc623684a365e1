"""Who decides an approval: shared by the blocking and the awaited ``approve`` and ``deny``."""

from __future__ import annotations

from ..core import checks
from ..core.context import current_context
from ..core.model import Worker
from ..engine.approvals import Decider
from ..engine.common import worker_id

__all__ = ["deciding"]


def deciding(worker: Worker | str | None, token_id: str | None) -> Decider:
    """Who makes an approval decision: ``worker`` and ``token_id`` as given and, when the
    call is made from a task handler (the worker runtime's context, sync or async),
    that handler's worker and task. A request's requester may not decide it."""
    workers = [] if worker is None else [worker_id(worker)]
    ctx = current_context.get()
    if ctx is not None and ctx.worker.id not in workers:
        workers.append(ctx.worker.id)
    return Decider(workers=tuple(workers), task=None if ctx is None else ctx.task_id,
                   token=checks.check_text("token_id", token_id) or None)
