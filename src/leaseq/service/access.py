"""Who may call the service, how often, and with how large a body.

* :class:`Access` verifies bearer tokens (through :mod:`leaseq.auth`),
  rate-limits per token, and checks that a worker id named in a request
  belongs to the calling token.
* :func:`need` builds the FastAPI dependency that requires one right.
* :class:`BodyLimit` is ASGI middleware refusing oversized bodies with 413.
* :func:`csrf_token` derives the dashboard's CSRF token from the session.

Rate limits are in-process token buckets: each replica limits on its own,
so N replicas behind a load balancer allow up to N times the rate.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import Depends, Request

from .. import auth
from ..core.errors import BodyTooLarge
from ..auth import RateLimited
from ..queue import Queue

#: Worker ids are issued by the queue: a name, a dash and 12 hex digits.
WORKER_ID_PATTERN = r"^[A-Za-z0-9_.:\-]{1,120}$"
_BEARER = re.compile(r"^Bearer\s+(\S+)\s*$", re.IGNORECASE)


class TokenBuckets:
    """Token buckets keyed by a string: ``rate`` per second, up to ``burst`` stored.

    Thread-safe. Memory is bounded: idle buckets are dropped when the table grows.
    """

    MAX_KEYS = 50_000

    def __init__(self, rate: float, burst: float):
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, cost: float = 1.0) -> float:
        """Spend ``cost``; returns 0 when allowed, else the seconds until it would be."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            level, last = self._buckets.get(key, (self.burst, now))
            level = min(self.burst, level + (now - last) * self.rate)
            if level < cost:
                self._buckets[key] = (level, now)
                return (cost - level) / self.rate
            if len(self._buckets) >= self.MAX_KEYS and key not in self._buckets:
                self._buckets = {k: v for k, v in self._buckets.items() if v[0] < self.burst}
            self._buckets[key] = (level - cost, now)
            return 0.0

    def empty(self, key: str) -> float:
        """Seconds until ``key`` may spend one token again (0 if it may now)."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            level, last = self._buckets.get(key, (self.burst, time.monotonic()))
            level = min(self.burst, level + (time.monotonic() - last) * self.rate)
        return 0.0 if level >= 1 else (1 - level) / self.rate


class Access:
    """Authentication state of one application: the queue, rate buckets, worker links."""

    def __init__(self, queue: Queue, *, rate: float, burst: float, failed_rate: float = 2.0,
                 failed_burst: float = 20.0):
        self.queue = queue
        self.buckets = TokenBuckets(rate, burst)
        # Failed authentications are limited per client address, so guessing tokens is slow.
        self.failures = TokenBuckets(failed_rate, failed_burst)
        self._owners: dict[str, str] = {}
        self._owners_lock = threading.Lock()

    def authenticate(self, token: str | None, client: str) -> auth.Principal:
        """Verify ``token`` and charge its rate bucket; raises Unauthorized or RateLimited."""
        wait = self.failures.empty(f"addr:{client}")
        if wait:
            raise RateLimited("too many failed authentications from this address", wait)
        try:
            principal = auth.verify_token(self.queue, token)
        except auth.Unauthorized:
            self.failures.take(f"addr:{client}")
            raise
        wait = self.buckets.take(principal.token_id)
        if wait:
            raise RateLimited(f"rate limit for token {principal.token_id} exceeded", wait)
        return principal

    def remember_worker(self, worker_id: str, token_id: str) -> None:
        """Cache the (permanent) link between a worker and the token that registered it."""
        with self._owners_lock:
            if len(self._owners) > 100_000:
                self._owners.clear()
            self._owners[worker_id] = token_id

    def check_worker(self, principal: auth.Principal, worker_id: str) -> None:
        """Raise AccessDenied unless ``worker_id`` was registered by the calling token."""
        owner = self._owners.get(worker_id)
        if owner is None:
            owner = auth.worker_token(self.queue, worker_id)
            if owner is not None:
                self.remember_worker(worker_id, owner)
        if owner is None or not hmac.compare_digest(owner, principal.token_id):
            raise auth.AccessDenied(f"worker {worker_id!r} was not registered with this token")


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    header = request.headers.get("authorization")
    if not header:
        return None
    m = _BEARER.match(header)
    if m is None:
        raise auth.Unauthorized("the Authorization header must be 'Bearer <token>'")
    return m.group(1)


def client_address(request: Request) -> str:
    """The peer address (the service trusts no forwarding header)."""
    return request.client.host if request.client else "unknown"


def api_principal(request: Request) -> auth.Principal:
    """FastAPI dependency: the verified caller of a JSON API request (bearer token only)."""
    access: Access = request.app.state.access
    principal = access.authenticate(bearer_token(request), client_address(request))
    request.state.principal = principal
    return principal


_WHAT = {"work": "use the worker API", "read": "read tasks", "operate": "perform operator actions",
         "admin": "manage tokens and retention", "enqueue": "enqueue tasks"}


def need(right: str) -> Callable[..., auth.Principal]:
    """A dependency that requires ``right`` (see :data:`leaseq.auth.RIGHTS`)."""

    def dependency(principal: auth.Principal = Depends(api_principal)) -> auth.Principal:
        if not principal.can(right):
            raise auth.AccessDenied(f"the {principal.role} role cannot {_WHAT.get(right, right)}")
        return principal

    dependency.__name__ = f"need_{right}"
    return dependency


def require_queue(principal: auth.Principal, queue: str) -> None:
    """Raise AccessDenied if the token is limited to other queues."""
    if not principal.may_use_queue(queue):
        raise auth.AccessDenied(f"this token may not use queue {queue!r}")


def csrf_token(session_token: str) -> str:
    """The CSRF token of a dashboard session: an HMAC keyed by the session's own token.

    Stateless, so it holds across replicas, and unguessable without the
    HttpOnly session cookie.
    """
    key = hashlib.sha256(session_token.encode()).digest()
    return hmac.new(key, b"leaseq dashboard csrf", hashlib.sha256).hexdigest()


class BodyLimit:
    """ASGI middleware: bodies over ``max_bytes`` get 413 before any handler runs.

    A declared Content-Length is checked up front; a streamed body is counted
    as it arrives and refused once it passes the limit.
    """

    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = self.max_bytes + 1
                if declared > self.max_bytes:
                    await self._drain(receive)
                    await self._refuse(send)
                    return
        seen = 0
        exceeded = False
        replaced = False

        async def counted_receive() -> dict[str, Any]:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    exceeded = True
                    if message.get("more_body"):
                        await self._drain(receive)
                    raise BodyTooLarge(f"request body is larger than {self.max_bytes} bytes")
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            # Whatever the application answers after its body was cut off
            # (frameworks report read errors their own way), the client gets 413.
            nonlocal replaced
            if exceeded:
                if message["type"] == "http.response.start" and not replaced:
                    replaced = True
                    await self._refuse(send)
                return
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except BodyTooLarge:
            if not replaced:
                await self._refuse(send)

    async def _drain(self, receive: Callable[..., Any]) -> None:
        # Read (and drop) what the client is still sending, up to a bound, so the
        # 413 arrives instead of a connection reset; past the bound, we just close.
        drained = 0
        while drained < 8 * self.max_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))
            if not message.get("more_body"):
                return

    async def _refuse(self, send: Callable[..., Any]) -> None:
        import json

        body = json.dumps({"error": {"code": "too_large",
                                     "message": f"request body is larger than {self.max_bytes} bytes"}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
