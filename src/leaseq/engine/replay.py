"""Code changes under replay: a retried handler that no longer matches its recorded run.

A handler's next attempt runs it from the top and answers each ledger entry it
reaches from the record (:mod:`.effects`, :mod:`.durable`, :mod:`.children`,
:mod:`.budgets`). When the code asks a recorded entry for something else (a
tool call with other arguments, another action, a wait for other children),
the code has changed under the run: replaying the recorded answer, or acting
anew, would both be wrong, and every retry would diverge again. The operation
that finds it ends the attempt here, under its lease (``diverge_task``): the
task goes to ``needs_reconciliation`` with its ``diverged`` event naming the
first diverging entry, what was recorded and what the code asked for, and
the handler gets :class:`leaseq.ToolCallDiverged`. A person reconciles it
(``q.reconcile``: completed, requeue once the code is fixed, or cancel).
"""

from __future__ import annotations

from typing import Any

from ..core.errors import LeaseLost, ToolCallDiverged
from ..core.model import Held
from . import limits
from .common import Settings, event, heartbeats
from .steps import COMMIT, Op, one


def diverge(s: Settings, claim: Held, wid: str, key: str, message: str, *, recorded: Any = None,
            requested: Any = None) -> Op[None]:
    """End the attempt of ``claim`` (its lease held in the open transaction) because its handler
    diverged from the recorded run at the ledger entry ``key``; commits, then raises
    :class:`ToolCallDiverged`. Nothing of the diverging call is written."""
    row: dict[str, Any] | None = yield one("diverge_task", task_id=claim.task_id, worker_id=wid,
                                           generation=claim.generation, error=message)
    if row is None:  # the caller holds the lease in this transaction: never
        raise LeaseLost(claim.task_id, claim.generation, "diverge refused: lease no longer held")
    yield from limits.release(s, [row])
    yield from event(s, claim.task_id, "diverged", claim.generation, wid, idempotency_key=key, recorded=recorded,
                     requested=requested, error=message, code_version=row["code_version"],
                     next_status=row["status"], attempts=row["attempts"], **heartbeats(row))
    yield from event(s, claim.task_id, row["status"], claim.generation, wid, reason=row["reason"])
    yield COMMIT
    raise ToolCallDiverged(key, message, recorded=recorded, requested=requested)
