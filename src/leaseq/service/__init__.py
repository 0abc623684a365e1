"""The queue service: an ASGI application over the same store as :class:`leaseq.Queue`.

Authenticated workers hold leases over HTTP (see :class:`leaseq.client.RemoteQueue`),
operators act, viewers read, and a server-rendered dashboard shows the
evidence trail. Every lease operation is a call into :class:`leaseq.Queue`:
the service adds identity, access control and presentation, never lease rules.

Modules: ``app`` (the application factory and error mapping), ``access``
(credentials, roles, rate limits, body size), ``worker_api``, ``operator_api``,
``dashboard`` (HTML pages), ``metrics`` (Prometheus), ``wire`` (JSON shapes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from fastapi import FastAPI

    from ..queue import Queue
    from .app import ServiceSettings


def create_app(queue: Queue, settings: ServiceSettings | None = None, **options: Any) -> FastAPI:
    """Build the ASGI application for ``queue``; see :func:`leaseq.service.app.create_app`."""
    from .app import create_app as build

    return build(queue, settings, **options)


__all__ = ["create_app"]
