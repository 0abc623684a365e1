"""Who may call the service, how often, and with how large a body.

* :class:`Access` verifies bearer tokens (through :mod:`leaseq.access.tokens`),
  rate-limits per token, and answers :func:`leaseq.access.authorize`'s
  look-ups (which token registered a worker, whether a token's workers held
  a task), caching the permanent worker-to-token links.
* :func:`in_one_transaction` checks a worker's token and runs its request
  in one database transaction; :func:`serve_operation` does so for an
  engine operation, on the event loop where the backend has an asyncio
  driver (every lease-guarded route of the worker API).
* :func:`need` builds the FastAPI dependency that authorizes one action
  (the decision itself is :func:`leaseq.access.authorize`'s).
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
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from .. import engine
from ..access import actions, operator, principals, tokens
from ..access.principals import Principal
from ..core.errors import BodyTooLarge, BudgetSpent, InvalidInput, RateLimited, ToolCallDiverged, Unauthorized
from ..engine import common
from ..engine.steps import Op
from ..queue import Queue

#: Worker ids are issued by the queue: a name, a dash and 12 hex digits.
#: (A path pattern, checked by pydantic's regex engine, where "$" is the very
#: end of the text: "w-1\n" is refused. Python's re needs fullmatch for that.)
WORKER_ID_PATTERN = r"^[A-Za-z0-9_.:\-]{1,120}$"
T = TypeVar("T")
_BEARER = re.compile(r"Bearer\s+(\S+)\s*", re.IGNORECASE)


class TokenBuckets:
    """Token buckets keyed by a string: ``rate`` per second, up to ``burst`` stored.

    Thread-safe, O(1) per call, and bounded: at most ``max_keys`` buckets are
    kept, the least recently used dropped first. A dropped bucket comes back
    full, which is what an idle bucket would have refilled to anyway.
    """

    def __init__(self, rate: float, burst: float, *, max_keys: int = 50_000):
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, cost: float = 1.0) -> float:
        """Spend ``cost``; returns 0 when allowed, else the seconds until it would be."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            level = self._level(self._buckets.pop(key, None), now)
            allowed = level >= cost
            self._buckets[key] = (level - cost if allowed else level, now)  # re-inserted: most recent
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        return self._owed(level, cost)

    def wait(self, key: str, cost: float = 1.0) -> float:
        """The seconds until ``cost`` could be spent (0: now), spending nothing."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            state = self._buckets.get(key)
        return self._owed(self._level(state, time.monotonic()), cost)

    def _level(self, state: tuple[float, float] | None, now: float) -> float:
        """A bucket's tokens at ``now``: refilled since it was last touched, up to the burst."""
        if state is None:
            return self.burst
        level, last = state
        return min(self.burst, level + (now - last) * self.rate)

    def _owed(self, level: float, cost: float) -> float:
        return 0.0 if level >= cost else (cost - level) / self.rate


class Access:
    """Authentication state of one application: the queue, rate buckets, worker links.

    Failed authentications are limited by what failed: the token id presented
    when that token exists (a wrong secret, or a revoked or expired token),
    the client address only when the token is missing, malformed or unknown.
    Only a failing request is refused by a failure limit, so a valid token is
    never refused because of someone else's failures, even behind one shared
    address.

    A failing token costs no database lookup once it can be told bad without
    one (:meth:`precheck`): token ids and stored hashes never change, so a
    token whose id is known here and whose hash is not the stored one is
    refused at once; one whose id is unknown, from an address that has failed
    too often, is refused after a look at the list of token ids (at most once
    a second). Dashboard sessions are limited the same way (:meth:`verify_session`).
    """

    #: Seconds between two reads of the token list made for unknown ids (see :meth:`precheck`).
    REFRESH_SECONDS = 1.0

    def __init__(self, queue: Queue, *, rate: float, burst: float, failed_rate: float = 2.0,
                 failed_burst: float = 20.0, looks_rate: float | None = None, looks_burst: float | None = None,
                 max_keys: int = 50_000):
        self.queue = queue
        self.buckets = TokenBuckets(rate, burst, max_keys=max_keys)
        #: the looks a token's waiting requests take after their first (a long-poll claim or a
        #: task wait looking again when woken): paced from a bucket of their own (by default at
        #: the request rate), so that a worker's waits woken by a busy queue never spend what its
        #: requests (the completions of what it claimed) may
        self.looks = TokenBuckets(rate if looks_rate is None else looks_rate,
                                  burst if looks_burst is None else looks_burst, max_keys=max_keys)
        self.failures = TokenBuckets(failed_rate, failed_burst, max_keys=max_keys)
        self._owners: dict[str, str] = {}
        self._owners_lock = threading.Lock()
        #: token id -> stored hash, of tokens looked up or listed here (both never change)
        self._hashes: dict[str, str] = {}
        self._hashes_read_at = float("-inf")
        self._hashes_lock = threading.Lock()
        #: hashes of dashboard sessions verified here lately: exempt from the address's failure limit
        self._sessions: OrderedDict[str, None] = OrderedDict()

    def precheck(self, token: str | None, client: str) -> None:
        """Refuse, before any lookup, a well-formed token that can be told bad without one.

        Counted as a failure (so RateLimited once its key has failed too often,
        else Unauthorized). Missing and malformed tokens need no lookup to be
        refused, and a token that may be valid is left to the lookup."""
        token_id = tokens.token_id_of(token)
        if token is None or token_id is None:
            return
        stored = self._hashes.get(token_id)
        if stored is None and self.failures.wait(f"addr:{client}"):
            self._read_hashes()  # this address is failing: is the id one at all?
            stored = self._hashes.get(token_id)
            if stored is None:
                self.failed(Unauthorized("invalid token"), client)  # raises: the bucket is empty
        if stored is not None and not hmac.compare_digest(tokens.hash_token(token), stored):
            exc = Unauthorized("invalid token", token_id=token_id)
            self.failed(exc, client)
            raise exc

    def verified(self, token: str | None, principal: Principal) -> None:
        """Remember a token that passed its lookup: its id and hash, which never change."""
        if token is not None and len(self._hashes) < 100_000:
            self._hashes[principal.token_id] = tokens.hash_token(token)

    def _read_hashes(self) -> None:
        with self._hashes_lock:
            if time.monotonic() - self._hashes_read_at < self.REFRESH_SECONDS:
                return
            self._hashes_read_at = time.monotonic()
            self._hashes = tokens.token_hashes(self.queue)

    def verify_session(self, session_id: str | None, client: str) -> Principal:
        """The principal of a dashboard session (:func:`leaseq.access.verify_session`), failure-limited
        like tokens: a session that fails counts against its token's or its address's limit, and
        from an address that has failed too often, only a session verified here before is looked up."""
        key = tokens.session_hash(session_id)
        if key is None or key not in self._sessions:
            wait = self.failures.wait(f"addr:{client}")
            if wait:
                raise RateLimited("too many failed authentications for this address", wait)
        with self._counting_failures(client):
            principal = tokens.verify_session(self.queue, session_id)
        if key is not None:
            with self._owners_lock:
                self._sessions[key] = None
                self._sessions.move_to_end(key)
                if len(self._sessions) > 10_000:
                    self._sessions.popitem(last=False)
        return self.charge(principal)

    def authenticate(self, token: str | None, client: str) -> Principal:
        """Verify ``token`` and charge its rate bucket; raises Unauthorized or RateLimited."""
        self.precheck(token, client)
        with self._counting_failures(client):
            principal = tokens.verify_token(self.queue, token)
        self.verified(token, principal)
        return self.charge(principal)

    async def aauthenticate(self, token: str | None, client: str) -> Principal:
        """:meth:`authenticate` for the event loop (the lookup awaited there on PostgreSQL)."""
        self.precheck(token, client)
        with self._counting_failures(client):
            principal = await tokens.averify_token(self.queue, token)
        self.verified(token, principal)
        return self.charge(principal)

    @contextmanager
    def _counting_failures(self, client: str) -> Iterator[None]:
        """A verification whose refusal counts against the failed-authentication limit."""
        try:
            yield
        except Unauthorized as exc:
            self.failed(exc, client)
            raise

    def failed(self, exc: Unauthorized, client: str) -> None:
        """Count a failed authentication; raises RateLimited once its key has failed too often."""
        key = f"token:{exc.token_id}" if exc.token_id else f"addr:{client}"
        wait = self.failures.take(key)
        if wait:
            what = f"token {exc.token_id}" if exc.token_id else "this address"
            raise RateLimited(f"too many failed authentications for {what} ({exc})", wait) from None

    def charge(self, principal: Principal, cost: float = 1.0) -> Principal:
        """Charge ``principal``'s request-rate bucket ``cost`` requests' worth; raises
        RateLimited when the bucket holds less."""
        wait = self.buckets.take(principal.token_id, cost)
        if wait:
            worth = f" (this request costs {cost:g} requests' worth)" if cost != 1 else ""
            raise RateLimited(f"rate limit for token {principal.token_id} exceeded{worth}", wait)
        return principal

    def remember_worker(self, worker_id: str, token_id: str) -> None:
        """Cache the (permanent) link between a worker and the token that registered it."""
        with self._owners_lock:
            if len(self._owners) > 100_000:
                self._owners.clear()
            self._owners[worker_id] = token_id

    def owner(self, worker_id: str) -> Op[str | None]:
        """The token that registered ``worker_id``, as a step of the caller's transaction:
        remembered (the link never changes), else read (:func:`leaseq.engine.common.worker_token`)
        and remembered."""
        owner = self._owners.get(worker_id)
        if owner is None:
            owner = yield from common.worker_token(worker_id)
            if owner is not None:
                self.remember_worker(worker_id, owner)
        return owner

    def worker_token(self, worker_id: str) -> str | None:
        """The token that registered ``worker_id`` (:meth:`owner`, in a statement of its own when not remembered)."""
        owner = self._owners.get(worker_id)
        return owner if owner is not None else engine.drive(self.queue.store, tokens.alone(self.owner(worker_id)))

    def token_held_task(self, token_id: str, task_id: int) -> bool:
        """Whether a worker of ``token_id`` holds or has held a lease on ``task_id``."""
        return tokens.token_held_task(self.queue, token_id, task_id)

    def task_queue(self, task_id: int) -> str | None:
        """The queue of task ``task_id`` (None: no such task)."""
        return operator.task_queue(self.queue, task_id)


class _TxFacts:
    """:class:`leaseq.access.Facts` read inside the request's transaction (cached by :class:`Access`)."""

    def __init__(self, access: Access, tx: Any):
        self.access = access
        self.tx = tx

    def worker_token(self, worker_id: str) -> str | None:
        return engine.drive_in(self.tx, self.access.owner(worker_id))

    def token_held_task(self, token_id: str, task_id: int) -> bool:
        return engine.drive_in(self.tx, tokens.token_held(token_id, task_id))

    def task_queue(self, task_id: int) -> str | None:  # pragma: no cover - no worker action asks
        raise TypeError("a worker action's facts name no task's queue")


def in_one_transaction(request: Request, action: str, worker_id: str, operation: Callable[[Queue], T], *,
                       queue: str | None = None, charge: bool = True) -> T:
    """Check the bearer token, authorize ``action`` for ``worker_id`` and run
    ``operation(view)``, all in one transaction; returns what ``operation`` returns.

    A refused credential counts against the failed-authentication limit and a
    valid one is charged to its rate bucket, exactly as for every other route
    (``charge=False``: a request's later attempts or second transaction, already
    charged, or counted as failed, once).
    """
    access: Access = request.app.state.access
    token = _presented_token(request, access) if charge else bearer_token(request)
    with request.app.state.queue.joined() as (view, tx):
        try:
            principal = tokens.check_token(tx, token)
        except Unauthorized as exc:
            _refused(request, access, exc, charge)
            raise
        access.verified(token, principal)
        _admit(request, access, principal, action, worker_id, queue, _TxFacts(access, tx), charge)
        return operation(view)


async def ain_one_transaction(request: Request, action: str, worker_id: str,
                              operation: Callable[[Queue], Awaitable[T]], *, queue: str | None = None,
                              charge: bool = True) -> T:
    """:func:`in_one_transaction` on the event loop, for a backend with an asyncio driver
    (PostgreSQL): the same checks, in one asyncio transaction with the awaited
    ``operation(view)``, and no thread between the request and the database."""
    access: Access = request.app.state.access
    token = _presented_token(request, access) if charge else bearer_token(request)
    async with request.app.state.queue.ajoined() as (view, atx):
        try:
            principal = await tokens.acheck_token(atx, token)
        except Unauthorized as exc:
            _refused(request, access, exc, charge)
            raise
        access.verified(token, principal)
        owner = await engine.adrive_in(atx, access.owner(worker_id))
        _admit(request, access, principal, action, worker_id, queue, _Known(owner), charge)
        return await operation(view)


async def serve_operation(request: Request, action: str, worker_id: str, operation: Callable[[Queue], Op[T]], *,
                          queue: str | None = None, charge: bool = True) -> T:
    """The engine operation ``operation(view)`` builds on the request's joined view, in the
    request's one transaction with its token check: awaited on the event loop where the
    backend has an asyncio driver (PostgreSQL, :func:`ain_one_transaction`), else in a
    thread. Under load, threads that hand the interpreter lock back and forth at every
    statement cost a request more than its SQL (measured: 418 µs of CPU a transaction
    against 159). ``queue``: the queue the action is authorized for."""
    ended: list[ToolCallDiverged | BudgetSpent] = []

    def kept(view: Queue) -> Any:
        try:
            return engine.drive(view.store, operation(view))
        except (ToolCallDiverged, BudgetSpent) as exc:
            ended.append(exc)
            return None

    async def akept(view: Queue) -> Any:
        try:
            return await engine.adrive(view.store, operation(view))
        except (ToolCallDiverged, BudgetSpent) as exc:
            ended.append(exc)
            return None

    # A diverged handler's operation, or a ledger step of a task whose tree's budget is spent,
    # ends its attempt and commits that before it raises (leaseq.engine.replay,
    # leaseq.engine.budgets.gate): the request's transaction commits it too, then the error is told.
    if request.app.state.queue.native_async:
        result: T = await ain_one_transaction(request, action, worker_id, akept, queue=queue, charge=charge)
    else:
        result = await run_in_threadpool(in_one_transaction, request, action, worker_id, kept, queue=queue,
                                         charge=charge)
    if ended:
        raise ended[0]
    return result


def authorize_also(request: Request, action: str, worker_id: str, queue: str | None) -> None:
    """Authorize a second ``action`` of a request already admitted by :func:`in_one_transaction`
    or :func:`ain_one_transaction` (its principal and the worker's token known by then)."""
    access: Access = request.app.state.access
    principals.authorize(request.state.principal, action, worker_id=worker_id, queue=queue,
                    facts=_Known(access._owners.get(worker_id)))


def _refused(request: Request, access: Access, exc: Unauthorized, charge: bool) -> None:
    """A refused credential counts against the failed-authentication limit (once a request)."""
    if charge:
        access.failed(exc, client_address(request))


def _admit(request: Request, access: Access, principal: Principal, action: str, worker_id: str,
           queue: str | None, facts: Any, charge: bool) -> None:
    """Charge a valid credential to its rate bucket (once a request) and authorize ``action``."""
    if charge:
        access.charge(principal)
    request.state.principal = principal
    principals.authorize(principal, action, worker_id=worker_id, queue=queue, facts=facts)


class _Known:
    """:class:`leaseq.access.Facts` for a worker action, the worker's token already looked up."""

    def __init__(self, owner: str | None):
        self.owner = owner

    def worker_token(self, worker_id: str) -> str | None:
        return self.owner

    def token_held_task(self, token_id: str, task_id: int) -> bool:  # pragma: no cover - no worker action asks
        raise TypeError("a worker action's facts hold the worker's token only")

    def task_queue(self, task_id: int) -> str | None:  # pragma: no cover - no worker action asks
        raise TypeError("a worker action's facts hold the worker's token only")


def _presented_token(request: Request, access: Access) -> str | None:
    """The bearer token; a malformed header, or a token told bad without a lookup
    (:meth:`Access.precheck`), counts against the failed-authentication limit."""
    try:
        token = bearer_token(request)
    except Unauthorized as exc:
        access.failed(exc, client_address(request))
        raise
    access.precheck(token, client_address(request))
    return token


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    header = request.headers.get("authorization")
    if not header:
        return None
    m = _BEARER.fullmatch(header)
    if m is None:
        raise Unauthorized("the Authorization header must be 'Bearer <token>'")
    return m.group(1)


def named_token_id(request: Request) -> str | None:
    """The token id the request's bearer token names, *unverified*: only for a refusal
    that costs nothing (its token's waits are at their cap already), never for a grant."""
    header = request.headers.get("authorization") or ""
    m = _NAMED_ID.match(header)
    return m.group(1) if m else None


_NAMED_ID = re.compile(r"Bearer\s+lq_([0-9a-f]{12})_", re.IGNORECASE)


async def room_to_wait(request: Request) -> None:
    """FastAPI dependency of the routes that wait: a request whose token already holds its
    most waiting requests is refused (429) before its token is looked up or anything runs."""
    token_id = named_token_id(request)
    if token_id is not None:
        request.app.state.work_signal.check_room(token_id)


def client_address(request: Request) -> str:
    """The client's address, as the server hands it over.

    That is the TCP peer unless the server was told to trust forwarding
    headers from that peer: ``leaseq serve`` trusts none unless given
    ``--forwarded-allow-ips`` (see :func:`leaseq.service.app.server_config`);
    uvicorn on its own trusts ``X-Forwarded-For`` from 127.0.0.1.
    """
    return request.client.host if request.client else "unknown"


async def api_principal(request: Request) -> Principal:
    """FastAPI dependency: the verified caller of a JSON API request (bearer token only).

    Asynchronous, so that FastAPI runs it on the event loop, where the token
    lookup is awaited on PostgreSQL, rather than on a thread of its own
    before the route's (a hop each way per request)."""
    access: Access = request.app.state.access
    try:
        token = bearer_token(request)
    except Unauthorized as exc:
        access.failed(exc, client_address(request))
        raise
    principal = await access.aauthenticate(token, client_address(request))
    request.state.principal = principal
    return principal


def need(action: str) -> Callable[..., Principal]:
    """A dependency authorizing ``action`` (see :data:`leaseq.access.ACTIONS`) for the caller.

    For actions whose scope is in the request's body (a queue to claim from
    or enqueue on) the route calls :func:`leaseq.access.authorize` itself.
    """
    actions.ACTIONS[action]  # a typo fails at import, not at the first request

    def dependency(request: Request, principal: Principal = Depends(api_principal)) -> Principal:
        task = request.path_params.get("task_id")
        if task is not None and not (str(task).isdigit() and 1 <= int(task) < 2**63):
            raise InvalidInput("task_id", f"must be a task id, a positive integer (got {str(task)[:40]!r})")
        principals.authorize(principal, action, queue=request.path_params.get("name"),
                        task=int(task) if task is not None else None, facts=request.app.state.access)
        return principal

    dependency.__name__ = f"need_{action}"
    return dependency


def csrf_token(session_id: str) -> str:
    """The CSRF token of a dashboard session: an HMAC keyed by the session id.

    Stateless, so it holds across replicas; unguessable without the HttpOnly
    session cookie; and a new login (a new session) gets a new one.
    """
    key = hashlib.sha256(session_id.encode()).digest()
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
            message: dict[str, Any] = await receive()
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
