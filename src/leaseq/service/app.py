"""The application factory: routes, error mapping, body limit, metrics, maintenance.

The service is stateless apart from the database (rate buckets and a cache
of worker-to-token links are per process and safe to lose), so several
replicas can serve one database behind a load balancer. Maintenance that must
run once (the expired-lease sweep, retention) runs on the one replica that
holds the maintenance leader lease (:mod:`leaseq.service.maintenance`).

Errors are JSON, ``{"error": {"code": ..., "message": ...}}``, with a stable
code: ``lease_lost`` and ``stale_token`` (409), ``not_found`` (404),
``invalid`` (422; 400 for a body that is not JSON), ``unauthorized`` (401),
``forbidden`` (403), ``rate_limited`` (429), ``too_large`` (413), and
``invalid_transition``, ``paused``, ``unknown_worker`` (409),
``unavailable`` (503). A 500 is a bug.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from .. import __version__, access
from ..core.errors import BackendUnavailable, InvalidInput, LeaseqError, RateLimited
from ..db.postgres import pool_party
from ..engine.expiry import SWEEP_MAX_QUEUES
from ..queue import Queue
from .access import Access, BodyLimit, api_principal
from .maintenance import (DEFAULT_APPROVALS_EVERY, DEFAULT_LEADER_LEASE_SECONDS, DEFAULT_SWEEP_EVERY, Maintenance,
                          MaintenanceCollector, MaintenanceConfig)
from .metrics import ServiceMetrics
from .wakeups import WAITS_PER_PROCESS, WAITS_PER_TOKEN, WorkSignal

logger = logging.getLogger("leaseq.service")

#: Host names every service answers: this machine's own.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class ServiceSettings:
    """How one service process behaves. Every field has a safe default."""

    #: Largest request body accepted (413 above it).
    max_body_bytes: int = 2 * 1024 * 1024
    #: Requests per second per token, with bursts up to ``burst`` (0 disables). Per replica. A
    #: remote worker that claims and completes one task at a time makes two requests a task: a
    #: bound of 100 held a busy worker token to 50 tasks a second, and turned its own long polls'
    #: wake-ups into 429s (they spend from another bucket now: ``looks_per_second``).
    rate_per_second: float = 1000.0
    burst: float = 2000.0
    #: Looks per second per token that its waiting requests take when woken (a long-poll
    #: claim or a task wait looking again), with bursts up to ``looks_burst``; past it a look
    #: waits, it is never refused. Each look is a claim transaction or a read: this bounds what
    #: one token's waits make every notification of a busy queue cost (0 disables).
    looks_per_second: float = 100.0
    looks_burst: float = 200.0
    #: Failed authentications per second, with bursts, per token id that failed
    #: (per client address for missing, malformed or unknown tokens). Only failing
    #: requests are refused by it (429): a valid credential always gets through.
    failed_auth_per_second: float = 2.0
    failed_auth_burst: float = 20.0
    #: Most keys each rate-limit table holds (least recently used dropped first).
    rate_limit_keys: int = 50_000
    #: Proxies whose ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are believed:
    #: comma-separated addresses or networks, ``*`` for any. Empty: none (the
    #: TCP peer is the client). Applied by :func:`server_config`.
    forwarded_allow_ips: str = ""
    #: Host names (the ``Host`` header, without its port) the service answers, besides
    #: :data:`LOOPBACK_HOSTS`: the names clients reach it by (``*.example.com`` for a
    #: domain's names, ``*`` for any). A request naming another host gets 400, so a
    #: name an attacker points at the service (DNS rebinding) reaches nothing.
    trusted_hosts: tuple[str, ...] = ()
    #: Serve /metrics without a token (else a viewer token or better is needed).
    public_metrics: bool = False
    #: Mark the dashboard cookie Secure even when a request arrives over plain
    #: HTTP (a TLS-terminating proxy whose X-Forwarded-Proto is not trusted).
    #: Requests that arrive over HTTPS always get a Secure cookie.
    secure_cookies: bool = False
    #: How long a dashboard session lasts (seconds) before a new login is needed.
    session_seconds: float = 12 * 3600.0
    #: Serve Swagger UI at /docs. Off by default: it loads scripts from a CDN
    #: into the dashboard's origin. /openapi.json is always served.
    docs: bool = False
    #: Retention the service applies itself: delete ended tasks older than this (seconds),
    #: each leaving its evidence record...
    prune_older_than: float | None = None
    #: ...clear their user data after this (seconds), keeping the rows...
    prune_payloads_older_than: float | None = None
    #: ...delete the evidence records of tasks that ended longer ago than this (seconds;
    #: None: a year, or prune_older_than if longer)...
    prune_evidence_older_than: float | None = None
    #: ...delete the streams of tasks that ended longer ago than this (seconds; None: with
    #: the task's other user data)...
    prune_streams_older_than: float | None = None
    #: ...checking this often (seconds).
    prune_every: float = 3600.0
    #: The longest a claim request may wait for work (its ``wait`` is cut to this).
    claim_wait_limit: float = 30.0
    #: The longest one ``GET /v1/tasks/{id}/wait`` request waits (its ``timeout`` is cut to this);
    #: RemoteQueue.wait asks again until its own timeout.
    wait_limit: float = 25.0
    #: The longest one ``GET /v1/tasks/{id}/stream`` response follows a stream, and the most
    #: entries it sends (then ``event: reconnect``: the client asks again after its last id).
    stream_seconds: float = 25.0
    stream_items: int = 1000
    #: How often a waiting claim looks again without being woken (None: 1 s where
    #: LISTEN/NOTIFY wakes it, 0.2 s on SQLite). See :mod:`leaseq.service.wakeups`.
    claim_recheck: float | None = None
    #: Most requests one token may hold waiting at once in one process: long-poll claims,
    #: task waits and live streams together (429 with Retry-After past it)...
    waits_per_token: int = WAITS_PER_TOKEN
    #: ...and all tokens together. A waiting request holds no database connection:
    #: the process's one listener wakes them all (see :mod:`leaseq.service.wakeups`).
    waits_per_process: int = WAITS_PER_PROCESS
    #: Dashboard pages update themselves (server-sent events on /live and a
    #: script served by the service itself). Off: the pages are static, reload to refresh.
    live_updates: bool = True
    #: How often an open live stream checks whether its page changed (seconds).
    live_interval: float = 1.0
    #: How long one live stream lasts before the browser opens the next (seconds):
    #: bounds how long a shutting-down service waits for open streams.
    live_stream_seconds: float = 25.0
    #: Route expired leases this often (seconds; None: only claims and `leaseq sweep` do).
    sweep_every: float | None = DEFAULT_SWEEP_EVERY
    #: How many queues one sweep pass examines at most; with more, the next pass follows at once.
    sweep_max_queues: int = SWEEP_MAX_QUEUES
    #: Deny approval requests whose deadline passed this often (seconds; None: only
    #: ``Queue.expire_approvals`` does).
    approvals_every: float | None = DEFAULT_APPROVALS_EVERY
    #: Lease of the maintenance leadership (seconds): the sweep and retention run on
    #: one replica at a time, and a dead leader is replaced within about this long.
    leader_lease_seconds: float = DEFAULT_LEADER_LEASE_SECONDS



class HostCheck(TrustedHostMiddleware):
    """Starlette's trusted-host check, for requests that name a host. A request with no
    ``Host`` header at all (an HTTP/1.0 health check, as HAProxy's ``option httpchk``
    sends) passes: the check stops a browser sent to this service under another name
    (DNS rebinding), and a browser always names the host it was sent to."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and not any(k == b"host" for k, _ in scope["headers"]):
            await self.app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

def server_config(app: FastAPI, *, host: str = "127.0.0.1", port: int = 8765, **options: Any) -> Any:
    """The ``uvicorn.Config`` that serves ``app`` as its settings say.

    Forwarding headers are believed only from ``forwarded_allow_ips``
    (uvicorn on its own believes them from 127.0.0.1): the client address
    limits failed logins and the scheme decides the Secure cookie flag.
    ``options`` go to ``uvicorn.Config`` as they are.
    """
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, **server_options(app.state.settings.forwarded_allow_ips),
                          **options)


#: How long an idle keep-alive connection stays open (seconds). Longer than the ``Retry-After``
#: the service sends most often (a wait past its cap: 5 to 10 s): a client that honours it sends
#: its next request on the connection it has. With uvicorn's own 5 s the two met, and the server closed the
#: connection just as the client wrote to it ("server disconnected without sending a response").
KEEP_ALIVE_SECONDS = 15


def server_options(forwarded_allow_ips: str) -> dict[str, Any]:
    """The ``uvicorn.Config`` options every leaseq service runs with."""
    trusted = forwarded_allow_ips.strip()
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted or "", "server_header": False,
            "timeout_keep_alive": KEEP_ALIVE_SECONDS}


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The JSON error document."""
    return {"error": {"code": code, "message": message, **{k: v for k, v in extra.items() if v is not None}}}


class ErrorResponse(JSONResponse):
    """A JSON error. ASCII-escaped, so text echoed from hostile input (a lone
    surrogate in a field name, say) can never make the error itself fail."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return ErrorResponse(error_body(code, message, **extra), status_code=status, headers=headers)


def _leaseq_error(request: Request, exc: Exception) -> Response:
    # Code, status, extra fields and headers all come from the error registry (core.errors).
    assert isinstance(exc, LeaseqError)
    if _wants_html(request):
        from .dashboard import render

        return render("error.html", request, None, status_code=exc.http_status, message=str(exc))
    return _error(exc.http_status, exc.code, str(exc), exc.http_headers() or None, **exc.wire_fields())


def _wants_html(request: Request) -> bool:
    # Dashboard pages answer browsers in HTML; the API and /metrics always answer JSON.
    path = request.url.path
    return (not path.startswith(("/v1/", "/metrics", "/healthz", "/openapi", "/docs"))
            and "text/html" in request.headers.get("accept", ""))


_FRIENDLY = {"extra_forbidden": "unknown field", "missing": "required field is missing"}


def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first: dict[str, Any] = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": "invalid"}
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        problem = f"malformed JSON ({ctx.get('error', first.get('msg'))})"
        return _error(400, "invalid", f"body: {problem}", field="body", problem=problem)
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    field = (first.get("ctx") or {}).get("field") or ".".join(loc) or "body"
    message = _FRIENDLY.get(first.get("type", ""), first.get("msg", "invalid"))
    if message.startswith(f"{field}: "):
        message = message[len(field) + 2:]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _error(422, "invalid", f"{field}: {message}{more}", field=field, problem=message + more,
                  details=[{"field": ".".join(str(p) for p in e.get("loc", ())), "problem": e.get("msg")}
                           for e in errors[:20]])


def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 403: "forbidden"}.get(
        exc.status_code, "invalid")
    if exc.status_code == 400:  # FastAPI could not parse the body (e.g. JSON nested too deep)
        return _error(400, "invalid", f"body: {exc.detail}", field="body", problem=str(exc.detail))
    message = "no such route" if exc.status_code == 404 else str(exc.detail)
    return _error(exc.status_code, code, message, headers=getattr(exc, "headers", None))


def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return _error(500, "internal", "internal error (logged on the server)")


class RequestMetrics:
    """ASGI middleware counting requests and their latency by route template."""

    def __init__(self, app: Any, metrics: ServiceMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.requests.labels(method=scope["method"], route=route, status=str(status)).inc()
            self.metrics.request_latency.labels(route=route).observe(time.perf_counter() - started)


class PoolParty:
    """ASGI middleware: the database work of a request is done as its client's party
    (:data:`leaseq.db.postgres.pool_party`): the token id its bearer token names (unverified:
    it only decides whose turn a connection is, never what is allowed), else its address. The
    asyncio pool hands its connections out in turn among the parties waiting, so a burst of
    one token's requests waits behind itself, not in front of every other token's."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token_id = _named_token_id(scope)
        client = scope.get("client")
        party = f"token {token_id}" if token_id is not None else f"client {client[0] if client else '?'}"
        reset = pool_party.set(party)
        try:
            await self.app(scope, receive, send)
        finally:
            pool_party.reset(reset)


class _Refused:
    """What :class:`WaitCapGate` puts in the scope as the route it answered (for the metrics' label)."""

    def __init__(self, path: str):
        self.path = path


class WaitCapGate:
    """ASGI middleware: a waiting request (a task wait, a task's stream, a claim that waits)
    whose token already holds its most waiting requests is refused here (429, ``Retry-After``),
    before routing, validation, dependencies or the token's lookup.

    It is the refusal :func:`leaseq.service.access.room_to_wait` makes (which the routes still
    make, for the requests that pass here), made as cheaply as it can be: a flood of waits
    past its cap comes back every few seconds, and each refusal that went through the router
    took CPU from every other request of the process. It reads the token id the header names,
    unverified: it only ever refuses, never grants, and a token at its cap is refused whoever
    presents its id (as before). A claim's body (bounded by :class:`BodyLimit`) is read to
    see whether it waits, and handed on whole to the route when it is not refused.
    """

    _WAITS = re.compile(r"/v1/tasks/[0-9]{1,19}/(wait|stream)")
    _CLAIM = re.compile(r"/v1/workers/[A-Za-z0-9_.:\-]{1,120}/claim")

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and (m := self._WAITS.fullmatch(path)):
            route = f"/v1/tasks/{{task_id}}/{m.group(1)}"
        elif method == "POST" and self._CLAIM.fullmatch(path):
            route = "/v1/workers/{worker_id}/claim"
        else:
            await self.app(scope, receive, send)
            return
        token_id = _named_token_id(scope)
        if token_id is None:
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        if route.endswith("/claim"):
            receive, waits = await _claim_waits(receive, state.settings.claim_wait_limit)
            if not waits:
                await self.app(scope, receive, send)
                return
        try:
            state.work_signal.check_room(token_id)
        except RateLimited as exc:
            scope["route"] = _Refused(route)
            response = _error(exc.http_status, exc.code, str(exc), exc.http_headers(), **exc.wire_fields())
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


_NAMED_ID = re.compile(rb"Bearer\s+lq_([0-9a-f]{12})_", re.IGNORECASE)


def _named_token_id(scope: dict[str, Any]) -> str | None:
    """The token id the request's bearer token names, unverified (see :func:`leaseq.service.access.named_token_id`)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            m = _NAMED_ID.match(value)
            return m.group(1).decode() if m else None
    return None


async def _claim_waits(receive: Any, wait_limit: float) -> tuple[Any, bool]:
    """Read a claim's body: whether it asks to wait, and a ``receive`` that hands the body on."""
    messages: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    try:
        wait = json.loads(b"".join(chunks)).get("wait", 0)
        waits = (isinstance(wait, (int, float)) and not isinstance(wait, bool)
                 and math.isfinite(wait) and min(wait, wait_limit) > 0)
    except (ValueError, AttributeError, TypeError):
        waits = False  # the route says what is wrong with it

    async def replay() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        return await receive()  # type: ignore[no-any-return]

    return replay, waits


#: How long the warm-up waits for the database before the service starts without it.
WARM_UP_SECONDS = 5.0


async def _warm_up(app: FastAPI, queue: Queue) -> None:
    """Build now what the first request would otherwise build, before the service
    says it is listening, so a new replica answers its first request about as fast
    as its thousandth (measured: 85 -> 30 ms for the first /healthz of a process).

    - FastAPI builds an included router's routes (dependencies, validators) when a
      request first meets them: one path that no route serves meets them all.
    - anyio imports its asyncio backend and makes the worker-thread limiter on the
      first call that runs in a thread (the synchronous endpoints).
    - Where the worker API runs on the event loop (PostgreSQL), its asyncio pool
      opens with the first request: opened here. Best effort: a database out of
      reach now is the first request's error to report, not a reason not to start.
    """
    scope = {"type": "http", "method": "GET", "path": "/.leaseq-warm-up", "root_path": "", "headers": [],
             "query_string": b""}
    for route in app.router.routes:
        route.matches(scope)
    await anyio.to_thread.run_sync(time.monotonic)
    if queue.native_async:
        try:
            with anyio.fail_after(WARM_UP_SECONDS):
                async with queue.ajoined() as (_, tx):
                    await tx.rows("db_now")
        except (LeaseqError, TimeoutError) as exc:
            logger.warning("service warm-up: the database's asyncio pool did not open (%s); "
                           "the first request will open it", exc)


def trusted_hosts(names: Any) -> list[str]:
    """``names`` (host names, or one comma-separated string) checked: ``name``, ``*.domain`` or ``*``."""
    if isinstance(names, str):
        names = names.split(",")
    out = []
    for name in names or ():
        name = str(name).strip().lower()
        if not name:
            continue
        if name != "*" and ("*" in name[1:] or (name.startswith("*") and not name.startswith("*."))
                            or not re.fullmatch(r"[a-z0-9.*\-\[\]:]{1,253}", name)):
            raise InvalidInput("trusted_hosts", f"each must be a host name, '*.domain' or '*' (got {name!r})")
        out.append(name)
    return out


def create_app(queue: Queue, settings: ServiceSettings | None = None, **options: Any) -> FastAPI:
    """The ASGI application serving ``queue``. ``options`` override fields of ``settings``."""
    settings = settings or ServiceSettings()
    unknown = set(options) - {f.name for f in fields(ServiceSettings)}
    if unknown:
        raise TypeError(f"unknown service settings: {', '.join(sorted(unknown))}")
    settings = replace(settings, **options)
    for name in ("waits_per_token", "waits_per_process"):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(name, f"must be a whole number, 1 or more (got {value!r})")
    metrics = ServiceMetrics(queue)
    gate = Access(queue, rate=settings.rate_per_second, burst=settings.burst,
                    looks_rate=settings.looks_per_second, looks_burst=settings.looks_burst,
                    failed_rate=settings.failed_auth_per_second, failed_burst=settings.failed_auth_burst,
                    max_keys=settings.rate_limit_keys)
    work_signal = WorkSignal(queue, recheck=settings.claim_recheck, per_token=settings.waits_per_token,
                             per_process=settings.waits_per_process, charge=gate.looks.take)
    maintenance = Maintenance(queue, MaintenanceConfig(
        leader_lease_seconds=settings.leader_lease_seconds, sweep_every=settings.sweep_every,
        sweep_max_queues=settings.sweep_max_queues,
        approvals_every=settings.approvals_every,
        prune_older_than=settings.prune_older_than, prune_payloads_older_than=settings.prune_payloads_older_than,
        prune_evidence_older_than=settings.prune_evidence_older_than,
        prune_streams_older_than=settings.prune_streams_older_than, prune_every=settings.prune_every))
    metrics.registry.register(MaintenanceCollector(maintenance))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        await _warm_up(app, queue)
        maintenance.start()
        try:
            yield
        finally:
            work_signal.close()
            maintenance.stop()
            await queue.close_async()  # the asyncio pool the worker API's hot path opened on this loop

    app = FastAPI(title="leaseq", version=__version__, lifespan=lifespan, redoc_url=None,
                  docs_url="/docs" if settings.docs else None,
                  description="Leases with fencing tokens, over HTTP. Authenticate with "
                              "`Authorization: Bearer <token>`; errors are `{\"error\": {\"code\", \"message\"}}`.")
    app.state.queue = queue
    app.state.settings = settings
    app.state.access = gate
    app.state.metrics = metrics
    app.state.maintenance = maintenance
    app.state.work_signal = work_signal
    #: Open live-update streams (see leaseq.service.live); changed on the event loop only.
    app.state.live_streams = 0
    #: open GET /v1/tasks/{id}/stream responses
    app.state.task_streams = 0

    from . import dashboard, dashboard_flow, insight, live, operator_api, worker_api, worker_batch

    app.add_exception_handler(dashboard.LoginRequired, dashboard.login_redirect)
    app.add_exception_handler(LeaseqError, _leaseq_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    app.add_middleware(PoolParty)  # whose turn the database connection of a request's work is
    app.add_middleware(WaitCapGate)  # inside the metrics: its refusals are counted by route
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(HostCheck, www_redirect=False,  # added last: runs first
                       allowed_hosts=[*LOOPBACK_HOSTS, *trusted_hosts(settings.trusted_hosts)])

    app.include_router(worker_batch.router)
    app.include_router(worker_api.router)
    app.include_router(operator_api.router)
    app.include_router(dashboard.router)
    app.include_router(dashboard_flow.router)
    app.include_router(insight.router)
    app.include_router(live.router)

    @app.get("/healthz", tags=["service"], summary="Liveness and database reachability (no token needed)")
    def healthz() -> JSONResponse:
        try:
            now = queue.now()
        except LeaseqError as exc:
            return _error(BackendUnavailable.http_status, BackendUnavailable.code, str(exc))
        # Whether this replica leads maintenance, but not its id: the id names the
        # host, which /healthz (no token) should not tell; /metrics has it.
        return JSONResponse({"ok": True, "database_time": now.isoformat(), "version": __version__,
                             "maintenance_leader": maintenance.leading})

    @app.get("/metrics", tags=["service"], summary="Prometheus metrics", response_class=Response)
    async def metrics_endpoint(request: Request) -> Response:
        if not settings.public_metrics:
            principal = await api_principal(request)
            access.authorize_role(principal, "read")  # metrics span every queue
        text = await run_in_threadpool(generate_latest, metrics.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    return app
