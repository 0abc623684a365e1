"""Errors of the fencing kit. Each derives from :class:`leaseq.LeaseqError`.

A stale fencing token raises :class:`leaseq.StaleToken` itself (re-exported
here), so callers catch one class whether the queue or a fenced downstream
refused them.
"""

from __future__ import annotations

# Defined with every other error in core.errors (one registry of codes).
from ..core.errors import IdempotencyKeyReused, InvalidActionToken, StaleToken

__all__ = ["IdempotencyKeyReused", "InvalidActionToken", "StaleToken"]
