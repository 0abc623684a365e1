"""Errors of the fencing kit. Each derives from :class:`leaseq.LeaseqError`.

A stale fencing token raises :class:`leaseq.StaleToken` itself (re-exported
here), so callers catch one class whether the queue or a fenced downstream
refused them.
"""

from __future__ import annotations

from ..core.errors import LeaseqError, StaleToken

__all__ = ["IdempotencyKeyReused", "InvalidActionToken", "StaleToken"]


class IdempotencyKeyReused(LeaseqError):
    """An idempotency key already belongs to another resource key, or to another task.

    A key names one logical action of one task on one resource; replaying
    the outcome of a write to ``bound_resource`` as if it were a write to
    ``resource_key`` would hide a caller's bug, and handing task
    ``bound_task``'s stored outcome to another task (or to a caller with no
    fencing token) would hand out a response to someone who never had the
    authority to cause it. The apply is refused and nothing changes.
    """

    code = "idempotency_key_reused"

    def __init__(self, idempotency_key: str, bound_resource: str, resource_key: str, *,
                 bound_task: int | None = None, task_id: int | None = None):
        self.idempotency_key = idempotency_key
        self.bound_resource = bound_resource
        self.resource_key = resource_key
        self.bound_task = bound_task
        self.task_id = task_id
        if bound_task is None:
            message = (f"idempotency key {idempotency_key!r} was used for resource {bound_resource!r}; "
                       f"it cannot be reused for resource {resource_key!r}")
        else:
            caller = "a caller without a fencing token" if task_id is None else f"task {task_id}"
            message = (f"idempotency key {idempotency_key!r} belongs to task {bound_task}; its outcome "
                       f"is not replayed to {caller}")
        super().__init__(message)


class InvalidActionToken(LeaseqError):
    """A signed action token was refused. ``reason`` says why, as a short code.

    Reasons: ``missing``, ``malformed``, ``unknown_key``, ``forged``,
    ``expired``, ``wrong_action``, ``wrong_idempotency_key``,
    ``wrong_generation``, ``wrong_task``, ``wrong_resource``,
    ``unbound_resource`` (the middleware requires tokens that name their
    resource).
    """

    code = "forbidden"

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(f"action token refused ({reason}): {message}")
