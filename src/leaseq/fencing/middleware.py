"""ASGI middleware: the fence, the idempotency records and the action tokens, from request headers.

The safe set-up, for any ASGI framework (Starlette, FastAPI)::

    from leaseq.fencing import FencedStore, FencingMiddleware, QueueVerifier, route_param

    app.add_middleware(FencingMiddleware, store=FencedStore(dsn),
                       verifier=QueueVerifier(verifier_dsn),     # leaseq roles create verifier NAME
                       resource=route_param("order_id", prefix="order:"),
                       actions={"POST /orders/{order_id}/pay": "orders.pay",
                                "POST /orders/{order_id}/refund": "orders.refund"},
                       exempt=["POST /orders/search"])

The verifier asks the queue about every token (:class:`QueueVerifier`):
only the queue's database mints one, and the token of an attempt that no
longer holds its lease (cancelled, revoked, superseded) is refused at once.
A service that cannot reach the queue may instead pass
``insecure_offline_signer=ActionSigner.from_env()`` (or the older
``signer=``): HMAC tokens checked offline, which anyone holding the key can
mint and which stay good until they expire (the lease deadline they were
issued under, plus ``leeway_seconds``) after their attempt is superseded;
the middleware logs and warns that it is running so.

Every request whose method is guarded (POST, PUT, PATCH, DELETE by default;
GET, HEAD and OPTIONS pass untouched) must say what it does and to what,
or it is refused (``403``, code ``forbidden``, nothing runs):

- Its route, as the app's own router matches it: a path no route takes ->
  ``reason`` ``unknown_route`` (an app with no Starlette router names the
  action and the resource through ``action=`` and ``resource=`` callables).
  A route listed in ``exempt=`` (``"METHOD /path/template"``, as declared)
  is let through unfenced, as a safe method is: for guarded routes that
  change nothing the fence guards.
- Its action: the one ``actions=`` declares for its route
  (``"POST /orders/{order_id}/pay": "orders.pay"``, the template as the route
  was declared, mount and router prefixes included; see
  :class:`RouteActions`), or what an ``action=`` callable names instead. A
  route that performs no declared action -> ``undeclared_action``. Only
  ``insecure_any_action=True`` (loud, and warned of) accepts a token for any
  action on every route.
- Its resource, ``resource(scope)``: a request whose resource cannot be named
  (a record identified in the body, a route without the path parameter) ->
  ``no_resource``; exempt the route if it needs no fence.

Then:

- A valid ``Leaseq-Action-Token`` is required (``403``, code ``forbidden``,
  with a ``reason``): vouched for by the queue (online: its attempt still
  holds a live lease; offline: signed), unexpired (its expiry is the
  lease deadline it was issued under; ``leeway_seconds``, default 1, covers
  clock skew), issued for the request's action (``reason`` ``wrong_action``
  otherwise: a token for ``orders.pay`` does not refund), and naming
  the request's resource (a token that names another resource, or none while
  ``require_resource_binding`` is on, is refused). The verified
  :class:`ActionClaims` are in ``scope["leaseq.action"]``.
- The fencing token is the token's task and generation; a
  ``Leaseq-Fencing-Token`` header, if sent, must equal it
  (``"<task_id>.<generation>"``, or the bare generation), so a caller
  cannot raise its own. The same task's older attempt -> ``409``
  ``stale_token``; other tasks' attempts are never compared.
- The idempotency key is the token's; an ``Idempotency-Key`` header, if
  sent, must equal it. A key already answered -> the stored response (status,
  the ``replay_headers``, body) with ``Idempotent-Replayed: true``, only to a
  caller holding a valid token of the task that caused it, so a replay never
  bypasses the authority the first request needed; the same key on another
  resource or for another task -> ``422`` (``idempotency_key_reused``).
- With the store's ``lease_check`` (:class:`QueueLeaseCheck`), an attempt
  that no longer holds its lease -> ``409``.

Without a verifier or a signer the middleware refuses to start, unless
``insecure_trust_all_callers=True``: then any caller may name any task and
generation in ``Leaseq-Fencing-Token: <task_id>.<generation>`` and replay
any stored response by its key; use it only where every caller is trusted.
There a request with no fencing token gets ``428`` (``token_required``)
unless ``require_token=False``, which lets it through unfenced; there is no
token to hold to an action, so ``actions=`` is optional (given, it still
refuses the routes it does not declare).

``resource(scope)`` must give one key per record, however the path spells
it: :func:`route_param` reads a path parameter through the app's own router
and normalises integers (``/orders/01`` and ``/orders/+1`` are ``order:1``).
A callable that returns None names no resource: the request is refused
unless its route is exempt.

The handler runs inside the fence, in :meth:`FencedStore.apply`'s
transaction, with the fence row locked until it returns: requests of one
task on one resource run one at a time. ``scope["leaseq.fence"]`` (see
:func:`fence_grant`) carries that transaction's connection:

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
import logging
import re
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread

from ..core.errors import BackendUnavailable, ConfigError, InvalidInput, LeaseqError, StaleToken
from .errors import IdempotencyKeyReused, InvalidActionToken
from .store import MAX_TOKEN, FencedStore
from .routes import RouteActions, RouteMatch, match_route, route_key
from .routes import route_param  # noqa: F401 - re-exported: it was defined here
from ..core import action_tokens
from .online import QueueVerifier
from .tokens import ActionClaims, ActionSigner

logger = logging.getLogger("leaseq.fencing")


class UnsafeOfflineTokens(UserWarning):
    """A fence accepts offline (HMAC) action tokens: anyone holding the key can mint one, and a
    superseded attempt's token is accepted until it expires."""


def warn_offline(where: str) -> None:
    """Say loudly that ``where`` trusts offline HMAC tokens."""
    message = (f"{where}: UNSAFE offline action tokens (HMAC, LEASEQ_ACTION_KEYS): every holder of the key "
               "(each worker, each verifier) can mint a token for anything, and a cancelled or superseded "
               "attempt's token is accepted until it expires (its lease deadline plus leeway_seconds). "
               "Check tokens online instead: verifier=QueueVerifier(dsn) with a role from "
               "`leaseq roles create verifier NAME`")
    logger.warning(message)
    warnings.warn(message, UnsafeOfflineTokens, stacklevel=3)

class UnsafeAnyAction(UserWarning):
    """A fence accepts an action token issued for any action on every route (``insecure_any_action=True``)."""


def warn_any_action(where: str) -> None:
    """Say loudly that ``where`` accepts a token for any action on every route."""
    message = (f"{where}: UNSAFE insecure_any_action=True: a token issued for one action (orders.pay) is "
               "accepted on every guarded route (orders.refund, orders.delete), so a worker allowed one action "
               "may perform all of them. Declare what each route does instead: "
               "actions={'POST /orders/{order_id}/pay': 'orders.pay', ...}")
    logger.warning(message)
    warnings.warn(message, UnsafeAnyAction, stacklevel=3)


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The scope key holding the :class:`FenceGrant` of a fenced request.
SCOPE_KEY = "leaseq.fence"
_TOKEN = re.compile(r"[0-9]{1,19}(?:\.[0-9]{1,19}){0,2}")
_KEY = re.compile(r"[\x21-\x7e]{1,255}")


@dataclass(frozen=True)
class FenceGrant:
    """What the middleware established for one request, in ``scope["leaseq.fence"]``."""

    #: The fence transaction's connection (psycopg or sqlite3; see FencedStore.apply).
    connection: Any
    #: ``"postgres"`` or ``"sqlite"``.
    dialect: str
    resource_key: str
    #: ``"<task_id>.<generation>"``, or None for an unfenced request
    fencing_token: str | None
    idempotency_key: str | None
    #: The verified action token's claims, when a signer is configured.
    claims: ActionClaims | None = None


def fence_grant(request_or_scope: Any) -> FenceGrant | None:
    """The :class:`FenceGrant` of a request (a Starlette ``Request`` or an ASGI scope), if fenced."""
    scope = getattr(request_or_scope, "scope", request_or_scope)
    grant: FenceGrant | None = scope.get(SCOPE_KEY)
    return grant


def _where(scope: Scope) -> str:
    """The request as an error names it: its method and path (cut short)."""
    return f"{scope['method']} {str(scope.get('path', ''))[:200]}"


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
    """Refuse stale and unauthorised writers and replay repeated requests; see the module docstring.

    ``verifier`` (a :class:`QueueVerifier`: tokens checked online, the
    lease with them) is the default to pass. ``insecure_offline_signer``
    (an :class:`ActionSigner` holding the queue's HMAC keys; ``signer`` is
    the older name) checks HMAC tokens offline, for services that cannot
    reach the queue, and warns that it does; with both, reference tokens go
    to the verifier and HMAC tokens to the signer.
    ``insecure_trust_all_callers=True`` is the explicit opt-out
    for services whose every caller is trusted. ``resource(scope)`` names the
    fenced resource of a request (see :func:`route_param`); a guarded request
    whose resource it cannot name (None) is refused. ``actions`` maps each
    guarded route, ``"METHOD /path/template"`` as declared, to the action it
    performs (a :class:`RouteActions` or a plain dict); a token issued for
    another action is refused, and so is a guarded request whose route
    performs no declared action or that no route takes. ``action(scope)``, a
    callable returning the action's name (None: no declared action), overrides
    the table. One of the two is required with a verifier or a signer;
    ``insecure_any_action=True`` is the explicit, warned-of opt-out that
    accepts a token for any action on every route. ``exempt`` lists guarded
    routes (same spelling) let through unfenced. ``leeway_seconds`` is the
    clock skew tolerated past a token's expiry. ``max_concurrency`` bounds
    the fenced requests in flight (each holds a thread and, on PostgreSQL, a
    pooled connection while its handler runs).
    """

    def __init__(self, app: ASGIApp, store: FencedStore, resource: Callable[[Scope], str | None], *,
                 verifier: QueueVerifier | None = None, insecure_offline_signer: ActionSigner | None = None,
                 signer: ActionSigner | None = None, insecure_trust_all_callers: bool = False,
                 actions: Mapping[str, str] | None = None, action: Callable[[Scope], str | None] | None = None,
                 exempt: Iterable[str] = (), insecure_any_action: bool = False,
                 require_resource_binding: bool = True,
                 leeway_seconds: float = 1.0, require_token: bool = True,
                 token_header: str = "Leaseq-Fencing-Token", key_header: str = "Idempotency-Key",
                 action_header: str = "Leaseq-Action-Token",
                 methods: Iterable[str] = ("POST", "PUT", "PATCH", "DELETE"),
                 replay_headers: Iterable[str] = ("content-type",), max_concurrency: int = 40):
        if not isinstance(store, FencedStore):
            raise InvalidInput("store", "must be a leaseq.fencing.FencedStore")
        if not callable(resource):
            raise InvalidInput("resource", "must be a callable taking the ASGI scope (e.g. route_param(...))")
        if verifier is not None and not isinstance(verifier, QueueVerifier):
            raise InvalidInput("verifier", "must be a leaseq.fencing.QueueVerifier")
        if signer is not None and insecure_offline_signer is not None:
            raise ConfigError("signer: the older name of insecure_offline_signer; pass one of them")
        signer = insecure_offline_signer if insecure_offline_signer is not None else signer
        field_name = "signer" if insecure_offline_signer is None else "insecure_offline_signer"
        if signer is not None and not isinstance(signer, ActionSigner):
            raise InvalidInput(field_name, "must be a leaseq.fencing.ActionSigner")
        if signer is None and verifier is None and insecure_trust_all_callers is not True:
            raise ConfigError("verifier: FencingMiddleware needs a QueueVerifier (tokens checked online against "
                              "the queue, through a role from `leaseq roles create verifier NAME`), or for a "
                              "service that cannot reach the queue insecure_offline_signer=ActionSigner.from_env(); "
                              "to trust every caller's headers instead, pass insecure_trust_all_callers=True")
        if (signer is not None or verifier is not None) and insecure_trust_all_callers:
            raise ConfigError("insecure_trust_all_callers: contradicts verifier= and signer=; pass one of them")
        if action is not None and not callable(action):
            raise InvalidInput("action", "must be a callable taking the ASGI scope and returning the action's name")
        if action is not None and actions is not None:
            raise ConfigError("action: overrides the table actions=; pass one of them")
        table = RouteActions(actions) if actions is not None and not isinstance(actions, RouteActions) else actions
        if insecure_any_action is not False and insecure_any_action is not True:
            raise InvalidInput("insecure_any_action", "must be True or False")
        if insecure_any_action and (table is not None or action is not None):
            raise ConfigError("insecure_any_action: contradicts actions= and action=; pass one of them")
        if (table is None and action is None and not insecure_any_action
                and (signer is not None or verifier is not None)):
            raise ConfigError("actions: FencingMiddleware needs the action each guarded route performs, so that "
                              "a token issued for another action is refused: actions={'POST /orders/{order_id}/pay': "
                              "'orders.pay', ...} (routes as declared), or an action=callable(scope); to accept a "
                              "token for any action on every route, pass insecure_any_action=True")
        if isinstance(exempt, str) or not isinstance(exempt, Iterable):
            raise InvalidInput("exempt", "must be a list of routes, 'METHOD /path/template' as declared")
        exempted = frozenset(route_key(route, "exempt") for route in exempt)
        both = sorted(exempted & set(table or ()))
        if both:
            raise ConfigError(f"exempt: {both[0]!r} is also in actions=; a route is fenced or exempt, not both")
        if signer is not None:
            warn_offline("FencingMiddleware")
        if insecure_any_action:
            warn_any_action("FencingMiddleware")
        if (isinstance(leeway_seconds, bool) or not isinstance(leeway_seconds, (int, float))
                or not 0 <= leeway_seconds <= 60):
            raise InvalidInput("leeway_seconds", f"must be between 0 and 60 seconds, not {leeway_seconds!r}")
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
        self.verifier = verifier
        #: True only when explicitly asked for: callers' headers are believed as sent
        self.insecure_trust_all_callers = signer is None and verifier is None
        #: The action of a request: the table's (``actions=``) or the ``action=`` callable's.
        self.action: Callable[[Scope], str | None] | None = table if table is not None else action
        self.actions: RouteActions | None = table
        #: Guarded routes let through unfenced, as the safe methods are.
        self.exempt = exempted
        #: True only when explicitly asked for: a token for any action is accepted on every route
        self.insecure_any_action = bool(insecure_any_action)
        self.require_resource_binding = require_resource_binding
        self.leeway_seconds = float(leeway_seconds)
        self._names = {"token": token_header, "key": key_header, "action": action_header}
        self.max_concurrency = max_concurrency
        self._limiter: anyio.CapacityLimiter | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        scope = dict(scope)
        scope.setdefault("leaseq.app", self.app)  # route_param's router when not under Starlette
        # Responses are buffered, so the zero-copy file extension cannot be honoured.
        scope["extensions"] = {k: v for k, v in (scope.get("extensions") or {}).items()
                               if k != "http.response.pathsend"}
        try:
            routed, route = self._route(scope)
            if routed and route is None:
                raise _Refused(403, "forbidden", f"{_where(scope)}: no route of this "
                               "service takes the request, so it performs no declared action",
                               reason="unknown_route")
            if route is not None and route.key in self.exempt:
                await self.app(scope, receive, send)
                return
            action = self._action(scope, route)
            resource_key = self._resource(scope)
            if resource_key is None:
                where = route.key if route is not None else _where(scope)
                raise _Refused(403, "forbidden", f"{where}: the fence cannot name the resource this request "
                               "changes (a guarded method on a route without the resource in its path); name "
                               "it with resource= (e.g. route_param(...)), or list the route in exempt= if "
                               "it changes nothing the fence guards", reason="no_resource")
            if self.verifier is not None:  # a round trip to the queue: off the event loop
                token, key, claims = await anyio.to_thread.run_sync(self._read_headers, scope, resource_key,
                                                                    action, limiter=self._threads())
            else:
                token, key, claims = self._read_headers(scope, resource_key, action)
        except _Refused as refusal:
            await _send_json(send, refusal.status, {"error": {"code": refusal.code, "message": refusal.message,
                                                              **refusal.extra}})
            return
        if token is None and key is None:
            await self.app(scope, receive, send)  # only with insecure_trust_all_callers and require_token=False
            return
        await self._guarded(scope, receive, send, resource_key, token, key, claims)

    def _route(self, scope: Scope) -> tuple[bool, RouteMatch | None]:
        """Whether the app has a router to ask, and the route the request reaches (None: no route
        takes it). Without a router, only ``action=`` and ``resource=`` callables can say."""
        try:
            return True, match_route(scope)
        except ConfigError as exc:
            if self.actions is not None or self.exempt:
                raise _Refused(500, exc.code, f"actions=, exempt=: {exc}") from None
            return False, None

    def _action(self, scope: Scope, route: RouteMatch | None) -> str | None:
        """The action the request performs (None: any, with insecure_any_action or no tokens to check)."""
        if self.action is None:
            return None
        try:
            action = self.action(scope)
        except InvalidInput as exc:
            raise _Refused(400, exc.code, f"action: {exc}") from None
        except LeaseqError as exc:
            raise _Refused(500, exc.code, f"the request's action could not be named: {exc}") from None
        if action is not None and (not isinstance(action, str) or not action):
            raise _Refused(500, "config", "action(scope) must return an action's name or None")
        if action is None:
            where = route.key if route is not None else _where(scope)
            hint = (f"declare it in actions= ({where!r}: '<the action>')" if self.actions is not None
                    else "action(scope) named none")
            raise _Refused(403, "forbidden", f"{where} performs no declared action: {hint}, or list the route in "
                           "exempt= if it changes nothing the fence guards", reason="undeclared_action")
        return action

    def _resource(self, scope: Scope) -> str | None:
        try:
            resource_key = self.resource(scope)
        except InvalidInput as exc:
            raise _Refused(400, exc.code, f"resource: {exc}") from None
        except LeaseqError as exc:
            raise _Refused(500, exc.code, f"the fenced resource could not be named: {exc}") from None
        if resource_key is not None and not isinstance(resource_key, str):
            raise _Refused(500, "config", "resource(scope) must return a string or None")
        return resource_key

    def _read_headers(self, scope: Scope, resource_key: str, action: str | None
                      ) -> tuple[str | None, str | None, ActionClaims | None]:
        found: dict[bytes, str] = {}
        for name, value in scope.get("headers", []):
            found.setdefault(name.lower(), value.decode("latin-1").strip())
        token = key = None
        if self.token_header in found:
            raw = found[self.token_header]
            if not _TOKEN.fullmatch(raw) or any(int(part) > MAX_TOKEN for part in raw.split(".")):
                raise _Refused(400, "invalid", f"{self._names['token']}: must be '<task_id>.<generation>' "
                               f"or '<task_id>.<epoch>.<generation>' (integers up to {MAX_TOKEN}), "
                               f"not {raw[:40]!r}")
            token = raw
        if self.key_header in found:
            raw = found[self.key_header]
            if len(raw) >= 2 and raw[0] == raw[-1] == '"':  # the draft standard's quoted form
                raw = raw[1:-1]
            if not _KEY.fullmatch(raw):
                raise _Refused(400, "invalid", f"{self._names['key']}: must be 1-255 visible ASCII characters")
            key = raw
        if self.insecure_trust_all_callers:  # the headers are believed as sent
            if token is not None and "." not in token:
                raise _Refused(400, "invalid", f"{self._names['token']}: must name its task, "
                               "'<task_id>.<generation>'; a bare generation cannot be compared")
            if token is None and self.require_token:
                raise _Refused(428, "token_required", f"{self._names['token']}: this resource "
                               "requires a fencing token")
            return token, key, None
        claims = self._verify(found.get(self.action_header), action, resource_key, token, key)
        scope["leaseq.action"] = claims
        return claims.fencing_token, claims.idempotency_key, claims

    def _verify(self, raw: str | None, action: str | None, resource_key: str, token: str | None,
                key: str | None) -> ActionClaims:
        try:
            if not raw:
                raise InvalidActionToken("missing", f"{self._names['action']} header is required")
            if self.verifier is not None and (self.signer is None or action_tokens.is_reference(raw)):
                claims = self.verifier.verify(raw, action=action, idempotency_key=key, resource=resource_key)
            else:
                assert self.signer is not None
                claims = self.signer.verify(raw, action=action, idempotency_key=key, resource=resource_key,
                                            leeway_seconds=self.leeway_seconds)
            if claims.resource is None and self.require_resource_binding:
                raise InvalidActionToken("unbound_resource", f"the token names no resource; this service "
                                         f"requires tokens bound to {resource_key!r} "
                                         "(ctx.effect(..., resource=...))")
            if token is not None and token not in (claims.fencing_token, str(claims.generation)):
                raise InvalidActionToken("wrong_generation", f"{self._names['token']} {token!r} is not the "
                                         f"token's own {claims.fencing_token!r}")
            return claims
        except InvalidActionToken as exc:
            raise _Refused(403, exc.code, str(exc), reason=exc.reason) from None
        except BackendUnavailable as exc:  # never let a request through unchecked
            raise _Refused(503, exc.code, str(exc)) from None

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, resource_key: str,
                       token: str | None, key: str | None, claims: ActionClaims | None) -> None:
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
            status = captured.status
            if status is None or not captured.complete:
                raise RuntimeError("the application returned without a complete response")
            if status >= 400:
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
            # write did not run: apply returned the outcome stored under the key
            assert outcome is not None
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
