"""Errors of the fencing kit. Each derives from :class:`leaseq.LeaseqError`.

A stale fencing token raises :class:`leaseq.StaleToken` itself (re-exported
here), so callers catch one class whether the queue or a fenced downstream
refused them.
"""

from __future__ import annotations

from ..core.errors import LeaseqError, StaleToken

__all__ = ["IdempotencyKeyReused", "InvalidActionToken", "StaleToken"]


class IdempotencyKeyReused(LeaseqError):
    """An idempotency key already belongs to another resource key.

    A key names one logical action on one resource; replaying the outcome of
    a write to ``bound_resource`` as if it were a write to ``resource_key``
    would hide a caller's bug, so the apply is refused and nothing changes.
    """

    code = "idempotency_key_reused"

    def __init__(self, idempotency_key: str, bound_resource: str, resource_key: str):
        self.idempotency_key = idempotency_key
        self.bound_resource = bound_resource
        self.resource_key = resource_key
        super().__init__(f"idempotency key {idempotency_key!r} was used for resource {bound_resource!r}; "
                         f"it cannot be reused for resource {resource_key!r}")


class InvalidActionToken(LeaseqError):
    """A signed action token was refused. ``reason`` says why, as a short code.

    Reasons: ``missing``, ``malformed``, ``unknown_key``, ``forged``,
    ``expired``, ``wrong_action``, ``wrong_idempotency_key``,
    ``wrong_generation``.
    """

    code = "forbidden"

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(f"action token refused ({reason}): {message}")
