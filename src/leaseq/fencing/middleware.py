"""ASGI middleware enforcing fencing tokens and idempotency keys from request headers.

Works with any ASGI framework (Starlette, FastAPI)::

    app.add_middleware(FencingMiddleware, store=FencedStore(dsn),
                       resource=lambda scope: scope["path"])     # None: not fenced

For a request whose method is guarded (POST, PUT, PATCH, DELETE by default)
and whose ``resource(scope)`` is not None:

- ``Leaseq-Fencing-Token: <int>`` older than the newest token accepted for
  the resource -> ``409 {"error": {"code": "stale_token", ...}}``; a token
  that is not a non-negative integer -> ``400`` with code ``invalid``.
- ``Idempotency-Key: <key>`` already answered -> the stored response
  (status, the ``replay_headers``, body) with ``Idempotent-Replayed: true``;
  the same key on another resource -> ``422`` (``idempotency_key_reused``).
- With neither header the request passes through unfenced, unless
  ``require_token=True`` (then ``428``, code ``token_required``).
- With a ``signer`` (:class:`~leaseq.fencing.tokens.ActionSigner`), every
  guarded request must carry a valid ``Leaseq-Action-Token`` -> else ``403``
  (code ``forbidden``, with a ``reason``). The token's generation and
  idempotency key then stand in for missing headers, and must equal them
  when both are sent, so a caller cannot raise its own fencing token.
  The verified :class:`ActionClaims` are in ``scope["leaseq.action"]``.

The handler runs inside the fence, in :meth:`FencedStore.apply`'s
transaction, with the fence row of the resource locked until it returns:
requests for one resource run one at a time. ``scope["leaseq.fence"]``
(see :func:`fence_grant`) carries that transaction's connection:

- Atomic mode: the handler writes through ``fence_grant(request).connection``.
  Its writes, the accepted token and the recorded response commit together,
  or none of them does.
- Simple mode: the handler writes elsewhere (its own database session, an
  API). The fence still refuses stale tokens and serialises the resource,
  and the response is recorded after the handler succeeds, but the
  handler's writes commit on their own: if the fence transaction then fails
  (a crash, a lost database connection), the write happened with no record
  of it, and a retry with the same key runs the handler again.

Write atomic-mode handlers as plain ``def`` endpoints (the framework runs
them in a thread): the connection is a blocking driver connection, and an
``async def`` handler using it would stall the event loop on every
statement, including while it waits for a row lock another request holds.

Only a response with status below 400 is recorded and commits the fence;
4xx/5xx responses and exceptions roll it back (no token accepted, nothing
stored) and the response is passed on, so a retry can still succeed.
Responses are buffered until the transaction commits.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread

from ..core.errors import BackendUnavailable, InvalidInput, StaleToken
from .errors import IdempotencyKeyReused, InvalidActionToken
from .store import MAX_TOKEN, FencedStore
from .tokens import ActionClaims, ActionSigner

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The scope key holding the :class:`FenceGrant` of a fenced request.
SCOPE_KEY = "leaseq.fence"
_TOKEN = re.compile(r"[0-9]{1,19}")
_KEY = re.compile(r"[\x21-\x7e]{1,255}")


@dataclass(frozen=True)
class FenceGrant:
    """What the middleware established for one request, in ``scope["leaseq.fence"]``."""

    #: The fence transaction's connection (psycopg or sqlite3; see FencedStore.apply).
    connection: Any
    #: ``"postgres"`` or ``"sqlite"``.
    dialect: str
    resource_key: str
    fencing_token: int | None
    idempotency_key: str | None
    #: The verified action token's claims, when a signer is configured.
    claims: ActionClaims | None = None


def fence_grant(request_or_scope: Any) -> FenceGrant | None:
    """The :class:`FenceGrant` of a request (a Starlette ``Request`` or an ASGI scope), if fenced."""
    scope = getattr(request_or_scope, "scope", request_or_scope)
    return scope.get(SCOPE_KEY)


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any):
        self.status, self.code, self.message, self.extra = status, code, message, extra


class _NotRecorded(Exception):
    """The handler answered with an error status: roll the fence back, pass the answer on."""


@dataclass
class _Captured:
    messages: list[Message] = field(default_factory=list)

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.messages if m["type"] == "http.response.start"), None)

    @property
    def complete(self) -> bool:
        return self.status is not None and any(
            m["type"] == "http.response.body" and not m.get("more_body", False) for m in self.messages)

    def outcome(self, replay_headers: frozenset[bytes]) -> dict[str, Any]:
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")
        headers = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in start.get("headers", [])
                   if k.lower() in replay_headers]
        return {"status": start["status"], "headers": headers, "body": base64.b64encode(body).decode("ascii")}

    async def forward(self, send: Send) -> None:
        for message in self.messages:
            await send(message)


async def _send_json(send: Send, status: int, payload: dict[str, Any],
                     headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(payload).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode("ascii")), *headers]})
    await send({"type": "http.response.body", "body": body})


class FencingMiddleware:
    """Refuse stale writers and replay repeated requests; see the module docstring.

    ``resource(scope)`` names the fenced resource of a request, or returns
    None to leave the request alone. Fencing tokens are only comparable
    between attempts of the same task (they are its claim generations), so
    the resource key should be what those attempts contend for, such as
    the record the task updates or ``f"task:{claims.task_id}"``.
    ``action(scope)``, with a signer, names the action the request performs;
    tokens issued for another action are refused (without it, any action is
    accepted). ``max_concurrency`` bounds the fenced requests in flight (each
    holds a thread and, on PostgreSQL, a pooled connection while its handler
    runs).
    """

    def __init__(self, app: ASGIApp, store: FencedStore, resource: Callable[[Scope], str | None], *,
                 token_header: str = "Leaseq-Fencing-Token", key_header: str = "Idempotency-Key",
                 methods: Iterable[str] = ("POST", "PUT", "PATCH", "DELETE"),
                 replay_headers: Iterable[str] = ("content-type",), require_token: bool = False,
                 signer: ActionSigner | None = None, action_header: str = "Leaseq-Action-Token",
                 action: Callable[[Scope], str | None] | None = None, max_concurrency: int = 40):
        if not isinstance(store, FencedStore):
            raise InvalidInput("store", "must be a leaseq.fencing.FencedStore")
        if not callable(resource):
            raise InvalidInput("resource", "must be a callable taking the ASGI scope")
        self.app = app
        self.store = store
        self.resource = resource
        self.token_header = token_header.lower().encode("latin-1")
        self.key_header = key_header.lower().encode("latin-1")
        self.action_header = action_header.lower().encode("latin-1")
        self.methods = frozenset(m.upper() for m in methods)
        self.replay_headers = frozenset(h.lower().encode("latin-1") for h in replay_headers)
        self.require_token = require_token
        self.signer = signer
        self.action = action
        self._names = {"token": token_header, "key": key_header, "action": action_header}
        self.max_concurrency = max_concurrency
        self._limiter: anyio.CapacityLimiter | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        scope = dict(scope)
        # Responses are buffered, so the zero-copy file extension cannot be honoured.
        scope["extensions"] = {k: v for k, v in (scope.get("extensions") or {}).items()
                               if k != "http.response.pathsend"}
        try:
            token, key, claims = self._read_headers(scope)
            resource_key = self.resource(scope)
            if resource_key is not None and token is None and self.require_token:
                raise _Refused(428, "token_required", f"{self._names['token']}: this resource "
                               "requires a fencing token")
        except _Refused as refusal:
            await _send_json(send, refusal.status, {"error": {"code": refusal.code, "message": refusal.message,
                                                              **refusal.extra}})
            return
        if resource_key is None or (token is None and key is None):
            await self.app(scope, receive, send)
            return
        await self._guarded(scope, receive, send, resource_key, token, key, claims)

    def _read_headers(self, scope: Scope) -> tuple[int | None, str | None, ActionClaims | None]:
        found: dict[bytes, str] = {}
        for name, value in scope.get("headers", []):
            found.setdefault(name.lower(), value.decode("latin-1").strip())
        token = key = None
        if self.token_header in found:
            raw = found[self.token_header]
            if not _TOKEN.fullmatch(raw) or int(raw) > MAX_TOKEN:
                raise _Refused(400, "invalid", f"{self._names['token']}: must be an integer between 0 "
                               f"and {MAX_TOKEN}, not {raw[:40]!r}")
            token = int(raw)
        if self.key_header in found:
            raw = found[self.key_header]
            if len(raw) >= 2 and raw[0] == raw[-1] == '"':  # the draft standard's quoted form
                raw = raw[1:-1]
            if not _KEY.fullmatch(raw):
                raise _Refused(400, "invalid", f"{self._names['key']}: must be 1-255 visible ASCII characters")
            key = raw
        claims = None
        if self.signer is not None:
            claims = self._verify(scope, found.get(self.action_header), token, key)
            token = claims.generation if token is None else token
            key = claims.idempotency_key if key is None else key
            scope["leaseq.action"] = claims
        return token, key, claims

    def _verify(self, scope: Scope, raw: str | None, token: int | None, key: str | None) -> ActionClaims:
        assert self.signer is not None
        try:
            if not raw:
                raise InvalidActionToken("missing", f"{self._names['action']} header is required")
            action = self.action(scope) if self.action is not None else None
            return self.signer.verify(raw, action=action, idempotency_key=key, generation=token)
        except InvalidActionToken as exc:
            raise _Refused(403, exc.code, str(exc), reason=exc.reason) from None

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, resource_key: str,
                       token: int | None, key: str | None, claims: ActionClaims | None) -> None:
        captured = _Captured()
        ran = False

        async def run_app(conn: Any) -> None:
            scope[SCOPE_KEY] = FenceGrant(conn, self.store.dialect, resource_key, token, key, claims)
            await self.app(scope, receive, captured.send)

        def write(conn: Any) -> dict[str, Any] | None:
            # Called by FencedStore.apply in a worker thread, inside the fence
            # transaction; the app itself runs on the event loop meanwhile.
            nonlocal ran
            ran = True
            anyio.from_thread.run(run_app, conn)
            if not captured.complete:
                raise RuntimeError("the application returned without a complete response")
            if captured.status >= 400:
                raise _NotRecorded()
            return captured.outcome(self.replay_headers) if key is not None else None

        apply = partial(self.store.apply, resource_key, token, write, idempotency_key=key)
        try:
            outcome = await anyio.to_thread.run_sync(apply, limiter=self._threads())
        except _NotRecorded:
            await captured.forward(send)
            return
        except StaleToken as exc:
            await _send_json(send, 409, {"error": {"code": exc.code, "message": str(exc)}})
            return
        except IdempotencyKeyReused as exc:
            await _send_json(send, 422, {"error": {"code": exc.code, "message": str(exc)}})
            return
        except BackendUnavailable as exc:
            await _send_json(send, 503, {"error": {"code": exc.code, "message": str(exc)}})
            return
        except Exception:
            if captured.complete:  # e.g. an inner error handler already rendered a 500
                await captured.forward(send)
            raise
        if ran:
            await captured.forward(send)
        else:
            await self._replay(send, outcome)

    def _threads(self) -> anyio.CapacityLimiter:
        # A limiter of our own: each fenced request holds a thread while its
        # handler runs, and sync handlers need threads from the default
        # limiter; sharing one could leave every thread waiting on another.
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.max_concurrency)
        return self._limiter

    async def _replay(self, send: Send, outcome: dict[str, Any]) -> None:
        body = base64.b64decode(outcome["body"])
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in outcome["headers"]
                   if k.lower() != "content-length"]
        headers += [(b"content-length", str(len(body)).encode("ascii")), (b"idempotent-replayed", b"true")]
        await send({"type": "http.response.start", "status": outcome["status"], "headers": headers})
        await send({"type": "http.response.body", "body": body})
