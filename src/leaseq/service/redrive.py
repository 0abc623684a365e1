"""Bulk actions by filter, as the API and the dashboard take them: redrive and cancel_where.

One function decides and acts for both faces, so a token reaches exactly the same tasks
through ``POST /v1/tasks/redrive`` as through the dashboard's redrive form: the action's
role is checked, a token limited to some queues must name one of them in ``queue`` (the
library's filter takes one queue), and the :class:`leaseq.Queue` method audits each task
and the whole in the action's own transaction.
"""

from __future__ import annotations

from typing import Any

from .. import access
from ..core import checks
from ..core.errors import InvalidInput
from ..queue import Queue
from .worker_api import Body

#: The bulk actions by filter, by name: the Queue method's name is the action's.
WHERE_ACTIONS = ("redrive", "cancel_where")


class Where(Body):
    """A bulk action's filter and its note: the body of ``POST /v1/tasks/redrive`` and
    ``/v1/tasks/cancel_where``, and what the dashboard's form makes (the Queue method checks
    each value)."""

    status: list[str] | str | None = None
    queue: str | None = None
    kind: str | None = None
    error: str | None = None
    older_than: float | None = None
    limit: int = 1000
    #: count the tasks the filter matches, change nothing
    dry_run: bool = False
    #: redrive's note, cancel's reason (recorded in each task's evidence trail); None: the default
    note: str | None = None


def act_where(q: Queue, principal: access.Principal, action: str, where: Where, *, dry_run: bool,
              via: str) -> dict[str, Any]:
    """Authorize ``action`` ("redrive" or "cancel_where") for ``principal`` over ``where`` and
    take it (``dry_run``: count and list the matching tasks, change nothing). A queue-limited
    token that names no queue, or another queue, is refused (:class:`leaseq.AccessDenied`)."""
    if action not in WHERE_ACTIONS:
        raise ValueError(f"not a bulk action by filter: {action!r}")
    access.authorize_role(principal, action)
    if principal.queues is not None and where.queue is None:
        raise access.AccessDenied(f"this token is limited to queues {', '.join(sorted(principal.queues))}: "
                                "name one (queue)")
    if where.queue is not None:
        access.authorize(principal, action, queue=checks.check_name("queue", where.queue))
    options: dict[str, Any] = dict(queue=where.queue, kind=where.kind, error=where.error,
                                   older_than=where.older_than, limit=where.limit, dry_run=dry_run,
                                   by=principal.actor, via=via)
    if action == "redrive":
        return q.redrive(status="dead" if where.status is None else where.status,
                         note="redriven" if where.note is None else where.note, **options)
    if where.status is None:
        raise InvalidInput("status", "name the statuses to cancel")
    return q.cancel_where(status=where.status, reason="cancelled" if where.note is None else where.note, **options)
