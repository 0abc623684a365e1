"""RemoteQueue: the worker transport over HTTP.

It offers the calls the worker runtime makes on a :class:`leaseq.Queue`, with
the same signatures, return types and exceptions, against a ``leaseq serve``
service instead of a database::

    q = RemoteQueue("http://127.0.0.1:8765", token)
    w = q.register_worker("agent")
    for claim in q.claim(w, queue="default", limit=4):
        q.complete(w, claim, result={"ok": True})

Every request carries the bearer token; the service derives the worker's
identity from it, and the lease guard in the database decides every
guarded call, so this module holds no lease rules. Errors come back as the
library's exceptions, rebuilt from their code by the error registry
(:func:`leaseq.core.errors.error_class`): :class:`LeaseLost` (409 ``lease_lost``),
:class:`QueuePaused`, :class:`UnknownWorker`, :class:`InvalidInput`,
:class:`NotFound`, :class:`InvalidTransition`; a network failure or a 5xx is
:class:`BackendUnavailable`; a refused credential is
:class:`leaseq.auth.Unauthorized` (also an :class:`UnknownWorker`), a refused
role :class:`leaseq.auth.AccessDenied`. A 429 is retried after the service's
``Retry-After`` (a few times, briefly) before :class:`leaseq.auth.RateLimited`.

Batched calls (:meth:`RemoteQueue.complete_many`, :meth:`RemoteQueue.fail_many`,
:meth:`RemoteQueue.renew_leases`) take many leases in one request; the
service runs each request in one transaction and reports per task which
leases were refused. ``claim(..., wait=s)`` is a long poll: the service
answers as soon as work arrives, within ``s`` seconds.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import warnings
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import urllib3

from . import __version__
from .core.errors import (BackendUnavailable, ConfigError, InvalidInput, LeaseLost, LeaseqError, RateLimited,
                          error_class)
from .core import policy
from .core.checks import check_trace_context
from .engine.durable import check_signal_name, check_until
from .core.model import Claim, Claims, Effect, Task, Worker
from .engine.effects import check_effect_of
from .engine.waits import check_timeout, timed_out
from .observability.tracing import traced_enqueue
from .core.capabilities import Capabilities
from .service.wire import claim_from, effect_from, event_from, parse_time, task_from, worker_from

#: Seconds one wait request asks the service to wait (it may cut that to its ``wait_limit``).
WAIT_REQUEST = 25.0


#: Set to 1 to let :class:`RemoteQueue` send its token over plain http:// to another machine.
INSECURE_HTTP_ENV = "LEASEQ_ALLOW_INSECURE_HTTP"


def _loopback(url: str) -> bool:
    """Whether ``url`` names this machine: ``localhost`` or a loopback address."""
    import ipaddress

    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _task_id(task_id: Any) -> int:
    if isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 1:
        raise InvalidInput("task_id", f"must be a positive integer (got {task_id!r})")
    return task_id
def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url`` (None: direct, or NO_PROXY covers its host)."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy is None or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def _limit_key(key: str) -> str:
    """A limit key, checked here as the queue checks it (a key that is no path segment never leaves)."""
    return policy.check_name("key", key)


def _wid(worker: Worker | str) -> str:
    wid = worker.id if isinstance(worker, Worker) else worker
    if not isinstance(wid, str) or not wid:
        raise InvalidInput("worker", f"must be a Worker from register_worker() (got {worker!r})")
    return wid


def _claim_body(queue: str, limit: int, lease_seconds: float | None, kinds: list[str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"queue": queue, "limit": limit, "lease_seconds": lease_seconds}
    if kinds is not None:
        body["kinds"] = list(kinds)
    return body


def _claims_from(data: dict[str, Any]) -> Claims:
    """The claims of a claim (or complete-and-claim) answer, with its rate-limit hint."""
    out = Claims(claim_from(c) for c in data["claims"])
    out.limit_wait = data.get("limit_wait")
    return out


def _retry_after(resp: Any) -> float:
    """How long to wait before asking again after a 429, at most 2 s: the error document's
    ``retry_after`` (to the millisecond: a token bucket of 100 requests a second owes 10 ms),
    else the ``Retry-After`` header (whole seconds, as HTTP writes it)."""
    try:
        owed = json.loads(resp.data)["error"]["retry_after"]
        if isinstance(owed, (int, float)) and not isinstance(owed, bool) and owed >= 0:
            return min(2.0, float(owed))
    except (ValueError, KeyError, TypeError):
        pass
    try:
        return min(2.0, max(0.0, float(resp.headers.get("Retry-After", "1") or 1)))
    except ValueError:
        return 1.0


class RemoteQueue:
    """A queue reached through the leaseq service. Thread-safe; share one per process.

    ``url`` is the service's base address; ``token`` a ``worker`` token (or an
    operator token for :meth:`enqueue` and :meth:`get` only).

    The token goes with every request, so a plain ``http://`` address is accepted
    only on this machine (a loopback address or ``localhost``): anywhere else, use
    ``https://``, or say you accept sending the token in clear text with
    ``allow_insecure_http=True`` or ``LEASEQ_ALLOW_INSECURE_HTTP=1`` in the environment
    (a private network you trust, say).
    """

    #: How the queue is reached: over HTTP, through the leaseq service (which
    #: database stands behind it is the service's business).
    transport = "http"
    #: Completions in batches (which may lease the next tasks in the same request),
    #: claims that wait on the service's side for work, each call in a thread
    #: (see :class:`leaseq.worker.Capabilities`).
    capabilities = Capabilities(loss_reports=True, batched_completion=True, long_poll=True,
                                claim_with_completion=True)

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, rate_limit_retries: int = 3,
                 allow_insecure_http: bool = False):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"server: must be an http:// or https:// address (got {url!r})")
        if (url.startswith("http://") and not _loopback(url) and not allow_insecure_http
                and os.environ.get(INSECURE_HTTP_ENV, "") not in ("1", "true", "yes")):
            raise ConfigError(f"server: {urlsplit(url).hostname or url!r} is not this machine, and plain http:// "
                              f"would send the token in clear text: use https://, or set {INSECURE_HTTP_ENV}=1 "
                              "(allow_insecure_http=True) to accept that")
        if not isinstance(token, str) or not token.strip():
            raise ConfigError("token: must be a non-empty string")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.rate_limit_retries = rate_limit_retries
        self._urls: dict[str, str] = {}
        self._headers = {"Authorization": f"Bearer {token.strip()}", "User-Agent": f"leaseq/{__version__}",
                         "Content-Type": "application/json"}
        self._timeout = urllib3.Timeout(connect=timeout, read=timeout)
        # urllib3 rather than httpx: half the client's CPU per request (a worker makes many).
        # Proxies as the environment names them (HTTP_PROXY, HTTPS_PROXY, NO_PROXY), as httpx did.
        # No retries here: a request that may have reached the service is the caller's to repeat.
        options: dict[str, Any] = {"maxsize": 16, "retries": False, "timeout": self._timeout}
        proxy = _proxy_for(self.url)
        self._http = (urllib3.ProxyManager(proxy, **options) if proxy is not None
                      else urllib3.PoolManager(**options))

    @property
    def dialect(self) -> str:
        """Deprecated: it named the transport, not a database; use :attr:`transport`."""
        warnings.warn("RemoteQueue.dialect is deprecated: it never named a database; use RemoteQueue.transport",
                      DeprecationWarning, stacklevel=2)
        return self.transport

    @classmethod
    def from_token_file(cls, url: str, path: str | os.PathLike[str], **options: Any) -> RemoteQueue:
        """Read the token from a file (its first line), as ``leaseq worker --token-file`` does."""
        try:
            with open(path, encoding="utf-8") as fh:
                token = fh.readline().strip()
        except OSError as exc:
            raise ConfigError(f"token-file: cannot read {str(path)!r}: {exc.strerror}") from None
        if not token:
            raise ConfigError(f"token-file: {str(path)!r} is empty")
        return cls(url, token, **options)

    # -- plumbing ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None, *,
              wait: float = 0.0, headers: dict[str, str] | None = None) -> Any:
        # A long poll may take ``wait`` seconds before the service answers at all.
        timeout = self._timeout if not wait else urllib3.Timeout(connect=self.timeout, read=self.timeout + wait)
        url = self._url(path) if not params else f"{self._url(path)}?{urlencode(params)}"
        data = None if body is None else json.dumps(body).encode()
        sent = self._headers if headers is None else {**self._headers, **headers}
        for attempt in range(self.rate_limit_retries + 1):
            try:
                resp = self._http.urlopen(method, url, body=data, headers=sent, timeout=timeout, redirect=False)
            except urllib3.exceptions.HTTPError as exc:
                raise BackendUnavailable(f"leaseq service at {self.url}: {type(exc).__name__}: {exc}") from None
            if resp.status == RateLimited.http_status and attempt < self.rate_limit_retries:
                time.sleep(_retry_after(resp))
                continue
            break
        if 200 <= resp.status < 300:
            return json.loads(resp.data) if resp.data else None
        raise self._error(resp)

    def _url(self, path: str) -> str:
        """The absolute URL of ``path`` (kept: a worker calls the same few paths again and again)."""
        url = self._urls.get(path)
        if url is None:
            if len(self._urls) >= 256:  # task-level paths come and go: keep the cache small
                self._urls.clear()
            url = self._urls[path] = self.url + path
        return url

    def _error(self, resp: urllib3.BaseHTTPResponse) -> LeaseqError:
        text = resp.data.decode("utf-8", "replace")
        try:
            err = json.loads(text)["error"]
            code, message = err["code"], err["message"]
        except (ValueError, KeyError, TypeError):
            err, code, message = {}, "", text[:200]
        cls = error_class(code) if isinstance(code, str) else None
        if cls is not None:  # the registry rebuilds the class the service raised
            try:
                return cls.from_wire(str(message), err)
            except (TypeError, ValueError):  # fields of the wrong shape: keep the class, drop them
                return cls.from_wire(str(message), {})
        if resp.status >= 500:
            return BackendUnavailable(f"leaseq service at {self.url} answered {resp.status}: {message}")
        return LeaseqError(f"leaseq service answered {resp.status}: {message}")

    def _worker_path(self, worker: Worker | str, claim: Claim | None = None, *rest: str) -> tuple[str, str]:
        wid = _wid(worker)
        if claim is not None:
            if not isinstance(claim, Claim):
                raise InvalidInput("claim", f"must be a Claim returned by claim() (got {type(claim).__name__})")
            if claim.worker_id != wid:
                raise InvalidInput("claim", f"belongs to worker {claim.worker_id!r}, not {wid!r}")
        path = f"/v1/workers/{quote(wid, safe='')}"
        if claim is not None:
            path += f"/tasks/{claim.task_id}"
        return wid, "/".join([path, *rest])

    # -- the worker transport --------------------------------------------------------------------

    def register_worker(self, name: str = "worker", *, kinds: list[dict[str, Any]] | None = None,
                        heartbeat_seconds: float | None = None, lease_seconds: float | None = None) -> Worker:
        """Register a worker under this client's token; the service issues the id.
        ``kinds``, ``heartbeat_seconds``, ``lease_seconds``: see :meth:`leaseq.Queue.register_worker`."""
        body: dict[str, Any] = {"name": name}
        if kinds is not None:
            body["kinds"] = kinds
        if heartbeat_seconds is not None or lease_seconds is not None:
            body.update(heartbeat_seconds=heartbeat_seconds, lease_seconds=lease_seconds)
        return worker_from(self._call("POST", "/v1/workers", body))

    def heartbeat_worker(self, worker: Worker | str) -> None:
        """Say the worker process is alive; see :meth:`leaseq.Queue.heartbeat_worker`."""
        _, path = self._worker_path(worker, None, "heartbeat")
        self._call("POST", path, {})

    def stop_worker(self, worker: Worker | str, reason: str = "stopped") -> None:
        """Record the worker's clean exit; see :meth:`leaseq.Queue.stop_worker`."""
        _, path = self._worker_path(worker, None, "stopped")
        self._call("POST", path, {"reason": reason})

    def claim(self, worker: Worker | str, *, queue: str = "default", limit: int = 1,
              lease_seconds: float | None = None, kinds: list[str] | None = None, wait: float = 0.0) -> list[Claim]:
        """Lease up to ``limit`` due tasks of ``queue``; see :meth:`leaseq.Queue.claim`.

        ``wait``: when nothing is due, the service holds the request up to this
        many seconds (it caps the value) and answers as soon as work arrives.
        """
        _, path = self._worker_path(worker, None, "claim")
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < float("inf"):
            raise InvalidInput("wait", f"must be a number of seconds, 0 or more (got {wait!r})")
        body = _claim_body(queue, limit, lease_seconds, kinds)
        if wait:
            body["wait"] = float(wait)
        return _claims_from(self._call("POST", path, body, wait=float(wait)))

    def interrupt_claims(self, worker: Worker | str) -> None:
        """End the worker's claims waiting in the service at once, empty-handed (at shutdown)."""
        _, path = self._worker_path(worker, None, "claim", "interrupt")
        self._call("POST", path)

    def renew_leases(self, worker: Worker | str, claims: list[Claim]) -> dict[int, datetime]:
        """Renew many leases in one request; a claim missing from the result was lost."""
        _, path = self._worker_path(worker, None, "renew")
        for c in claims:
            self._worker_path(worker, c)
        if not claims:
            return {}
        data = self._call("POST", path, {"leases": [{"task_id": c.task_id, "generation": c.generation}
                                                    for c in claims]})
        return {r["task_id"]: parse_time(r["expires_at"]) for r in data["renewed"]}  # type: ignore[misc]

    def heartbeat(self, worker: Worker | str, claim: Claim) -> datetime:
        """Renew one lease; returns the new deadline or raises :class:`LeaseLost`."""
        renewed = self.renew_leases(worker, [claim])
        if claim.task_id not in renewed:
            raise LeaseLost(claim.task_id, claim.generation, "heartbeat refused: lease no longer held")
        return renewed[claim.task_id]

    def complete(self, worker: Worker | str, claim: Claim, result: Any = None) -> None:
        """Finish the task with ``result``; raises :class:`LeaseLost` without authority."""
        _, path = self._worker_path(worker, claim, "complete")
        self._call("POST", path, {"generation": claim.generation, "result": result})

    def fail(self, worker: Worker | str, claim: Claim, error: str, *, retry: bool = True, block: bool = False,
             delay: float | None = None) -> Task:
        """End the attempt with ``error``; see :meth:`leaseq.Queue.fail`."""
        _, path = self._worker_path(worker, claim, "fail")
        return task_from(self._call("POST", path, {"generation": claim.generation, "error": error, "retry": retry,
                                                   "block": block, "delay": delay}))

    def retry(self, worker: Worker | str, claim: Claim, after: float = 0.0, reason: str = "retry requested") -> Task:
        """End the attempt on request, to run again ``after`` seconds later; see :meth:`leaseq.Queue.retry`
        (sent as a fail with ``retry_after``)."""
        _, path = self._worker_path(worker, claim, "fail")
        return task_from(self._call("POST", path, {"generation": claim.generation, "error": reason,
                                                   "retry_after": after}))

    def complete_many(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> set[int]:
        """Finish many tasks in one request (one guarded statement on the service's side).

        ``done`` holds ``(claim, result)`` pairs. Returns the ids completed; a
        task missing from the answer had lost its lease and was left untouched.
        """
        path, items = self._completions(worker, done)
        if not items:
            return set()
        return set(self._call("POST", path, {"tasks": items})["completed"])

    def complete_and_claim(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]], *, queue: str = "default",
                           limit: int = 1, lease_seconds: float | None = None,
                           kinds: list[str] | None = None) -> tuple[set[int], Claims]:
        """:meth:`complete_many`, and lease up to ``limit`` more tasks of ``queue`` in the same request.

        Returns the ids completed and the new claims. The service runs the claim
        after the completions, in their transaction where it can (else in one of
        its own after their commit), and it never waits for work; if it is refused
        or fails, the completions stand and no claims come back (a later
        :meth:`claim` meets the same trouble and raises it).
        """
        path, items = self._completions(worker, done)
        data = self._call("POST", path, {"tasks": items, "claim": _claim_body(queue, limit, lease_seconds, kinds)})
        return set(data["completed"]), _claims_from(data)

    def _completions(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> tuple[str, list[Any]]:
        """The complete route's path and its ``tasks`` items, each claim checked against ``worker``."""
        _, path = self._worker_path(worker, None, "complete")
        items = []
        for claim, result in done:
            self._worker_path(worker, claim)
            items.append({"task_id": claim.task_id, "generation": claim.generation, "result": result})
        return path, items

    def fail_many(self, worker: Worker | str, failed: Sequence[tuple[Claim, str]], *, retry: bool = True,
                  block: bool = False, delay: float | None = None) -> dict[int, Task]:
        """End many attempts in one request, each ``(claim, error)`` as :meth:`fail` would.

        Returns ``{task_id: task}`` for the attempts ended; a task missing from
        the answer had lost its lease and was left untouched.
        """
        _, path = self._worker_path(worker, None, "fail")
        items = []
        for claim, error in failed:
            self._worker_path(worker, claim)
            items.append({"task_id": claim.task_id, "generation": claim.generation, "error": error,
                          "retry": retry, "block": block, "delay": delay})
        if not items:
            return {}
        return {t.id: t for t in (task_from(d) for d in self._call("POST", path, {"tasks": items})["failed"])}

    def release(self, worker: Worker | str, claim: Claim, reason: str = "released", *,
                started: bool = True) -> Task:
        """Give a lease back early; the task goes through the recovery policy (``started=False``:
        the handler never began, and the attempt is given back too; see :meth:`leaseq.Queue.release`)."""
        _, path = self._worker_path(worker, claim, "release")
        body: dict[str, Any] = {"generation": claim.generation, "reason": reason}
        if started is not True:  # sent only when it says something: an older service refuses unknown fields
            body["started"] = started
        return task_from(self._call("POST", path, body))

    def begin_effect(self, worker: Worker | str, claim: Claim, action: str, key: str | None = None, *,
                     resource: str | None = None, effect: str | None = None,
                     args_digest: str | None = None) -> Effect:
        """Record a tool-call intent under the lease; see :meth:`leaseq.Queue.begin_effect`."""
        _, path = self._worker_path(worker, claim, "effects")
        body = {"generation": claim.generation, "action": action, "key": key}
        if resource is not None:
            body["resource"] = resource
        if effect is not None:
            body["effect"] = effect
        if args_digest is not None:
            body["args_digest"] = args_digest
        return effect_from(self._call("POST", path, body))

    def finish_effect(self, worker: Worker | str, claim: Claim, effect: Effect, response: Any = None) -> Effect:
        """Record the response of a tool call whose intent :meth:`begin_effect` recorded."""
        wid, _ = self._worker_path(worker, claim)
        check_effect_of(claim, effect)
        if effect.replayed:
            return effect
        _, path = self._worker_path(wid, claim, "effects", str(effect.id), "response")
        return effect_from(self._call("POST", path, {"generation": claim.generation, "response": response}))

    def intend(self, worker: Worker | str, claim: Claim, kind: str, payload: Any = None, *, key: str,
               **options: Any) -> Task:
        """Record an intent for an executor under the lease; see :meth:`leaseq.Queue.intend`."""
        _, path = self._worker_path(worker, claim, "intents")
        body = {"generation": claim.generation, "kind": kind, "payload": payload, "key": key}
        body.update({name: value for name, value in options.items() if value is not None})
        return task_from(self._call("POST", path, body))

    def sleep(self, worker: Worker | str, claim: Claim, key: str, *, seconds: float | None = None,
              until: Any = None) -> dict[str, Any]:
        """A durable sleep of the attempt, under the lease; see :meth:`leaseq.Queue.sleep`."""
        _, path = self._worker_path(worker, claim, "sleep")
        body: dict[str, Any] = {"generation": claim.generation, "key": key}
        if seconds is not None:
            body["seconds"] = seconds
        if until is not None:
            body["until"] = check_until(until)
        return dict(self._call("POST", path, body))

    def wait_signal(self, worker: Worker | str, claim: Claim, key: str, name: str, *,
                    timeout: float | None = None) -> dict[str, Any]:
        """A durable wait for a signal, under the lease; see :meth:`leaseq.Queue.wait_signal`."""
        _, path = self._worker_path(worker, claim, "signal-wait")
        return dict(self._call("POST", path, {"generation": claim.generation, "key": key, "name": name,
                                              "timeout": timeout}))

    def consume(self, worker: Worker | str, claim: Claim, key: str, limit_key: str, units: int) -> dict[str, Any]:
        """Usage settled after the call, under the lease; see :meth:`leaseq.Queue.consume`."""
        _, path = self._worker_path(worker, claim, "consume")
        return dict(self._call("POST", path, {"generation": claim.generation, "key": key, "limit_key": limit_key,
                                              "units": units}))

    def signal(self, task_id: int, name: str, payload: Any = None) -> dict[str, Any]:
        """Send the signal ``name`` to a task (an operator token); see :meth:`leaseq.Queue.signal`.
        The sender recorded is this token's principal."""
        check_signal_name(name)
        path = f"/v1/tasks/{int(task_id)}/signals/{quote(name, safe='')}"
        return dict(self._call("POST", path, {"payload": payload}))

    def signals(self, task_id: int) -> list[dict[str, Any]]:
        """A task's signals, oldest first; see :meth:`leaseq.Queue.signals`."""
        return list(self._call("GET", f"/v1/tasks/{int(task_id)}/signals")["signals"])

    def report_loss(self, worker: Worker | str, claim: Claim, reason: str) -> None:
        """Add the worker's own account of losing a lease to the evidence trail."""
        _, path = self._worker_path(worker, claim, "loss")
        self._call("POST", path, {"generation": claim.generation, "reason": reason})

    @traced_enqueue
    def enqueue(self, kind: str, payload: Any = None, **options: Any) -> Task:
        """Add a task; options as for :meth:`leaseq.Queue.enqueue` (``deadline`` a datetime or a
        timedelta, sent as ``deadline`` or ``deadline_in``). The trace context
        travels as the W3C ``traceparent`` header, which the service stores with the task."""
        traceparent = check_trace_context("trace_context", options.pop("trace_context", None))
        headers = {"traceparent": traceparent} if traceparent is not None else None
        deadline = options.pop("deadline", None)
        if isinstance(deadline, timedelta):  # a length from now, by the database's clock
            options["deadline_in"] = deadline.total_seconds()
        elif isinstance(deadline, datetime):  # without an offset, the service refuses it as Queue does
            options["deadline"] = deadline.isoformat()
        elif deadline is not None:
            options["deadline"] = deadline
        return task_from(self._call("POST", "/v1/tasks", {"kind": kind, "payload": payload, **options},
                                    headers=headers))

    def redrive(self, *, status: str | list[str] = "dead", queue: str | None = None, kind: str | None = None,
                error: str | None = None, older_than: float | None = None, limit: int = 1000,
                dry_run: bool = False, note: str = "redriven") -> dict[str, Any]:
        """Requeue the dead (or blocked) tasks matching a filter (an operator token); see
        :meth:`leaseq.Queue.redrive`."""
        done: dict[str, Any] = self._call("POST", "/v1/tasks/redrive", {
            "status": status, "queue": queue, "kind": kind, "error": error, "older_than": older_than,
            "limit": limit, "dry_run": dry_run, "note": note})
        return done

    def cancel_where(self, *, status: str | list[str], queue: str | None = None, kind: str | None = None,
                     error: str | None = None, older_than: float | None = None, limit: int = 1000,
                     dry_run: bool = False, reason: str = "cancelled") -> dict[str, Any]:
        """Cancel the tasks matching a filter (an operator token); see :meth:`leaseq.Queue.cancel_where`."""
        done: dict[str, Any] = self._call("POST", "/v1/tasks/cancel-where", {
            "status": status, "queue": queue, "kind": kind, "error": error, "older_than": older_than,
            "limit": limit, "dry_run": dry_run, "note": reason})
        return done

    def set_limit(self, key: str, *, max_running: int | None = None, per_second: float | None = None,
                  burst: float | None = None, counts: str = "tasks", per_minute: int | None = None,
                  per_hour: int | None = None, per_day: int | None = None) -> dict[str, Any]:
        """Create or change a limit (an operator token); see :meth:`leaseq.Queue.set_limit`."""
        limit: dict[str, Any] = self._call("PUT", f"/v1/limits/{_limit_key(key)}", {
            "max_running": max_running, "per_second": per_second, "burst": burst, "counts": counts,
            "per_minute": per_minute, "per_hour": per_hour, "per_day": per_day})
        return limit

    def delete_limit(self, key: str) -> None:
        """Remove a limit (an operator token); see :meth:`leaseq.Queue.delete_limit`."""
        self._call("DELETE", f"/v1/limits/{_limit_key(key)}")

    def limits(self) -> list[dict[str, Any]]:
        """Every limit with its usage (a viewer token or better); see :meth:`leaseq.Queue.limits`."""
        limits: list[dict[str, Any]] = self._call("GET", "/v1/limits")["limits"]
        return limits

    def limit_spend(self, key: str | None = None, *, days: int = 7) -> list[dict[str, Any]]:
        """Usage settled per key and day (a viewer token or better); see :meth:`leaseq.Queue.limit_spend`."""
        params: dict[str, Any] = {"days": days} if key is None else {"days": days, "key": key}
        spend: list[dict[str, Any]] = self._call("GET", "/v1/limits/spend", params=params)["spend"]
        return spend

    def get(self, task_id: int) -> Task:
        """One task; raises :class:`NotFound`."""
        return task_from(self._call("GET", f"/v1/tasks/{_task_id(task_id)}"))

    def dependency_results(self, task_id: int) -> dict[int, Any]:
        """The results of the tasks ``task_id`` waits (or waited) for, ``{task id: result}``;
        see :meth:`leaseq.Queue.dependency_results` (a worker token: for tasks its workers hold)."""
        data = self._call("GET", f"/v1/tasks/{_task_id(task_id)}/dependency-results")
        return {r["task_id"]: r["result"] for r in data["results"]}

    def wait(self, task_id: int, *, timeout: float | None = None) -> Task:
        """Block until the task has ended or is parked for a person; see :meth:`leaseq.Queue.wait`.

        A long poll: each request waits on the service's side (up to its
        ``wait_limit``, 25 s by default) and this asks again until ``timeout``
        (None: no limit), then raises :class:`TimeoutError`."""
        task_id = _task_id(task_id)
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_REQUEST if deadline is None else max(0.0, deadline - time.monotonic())
            step = min(left, WAIT_REQUEST)
            data = self._call("GET", f"/v1/tasks/{task_id}/wait", params={"timeout": step}, wait=step)
            task = task_from(data["task"])
            if data["settled"]:
                return task
            if deadline is not None and time.monotonic() >= deadline:
                raise timed_out(task, timeout)

    def events(self, task_id: int) -> list[Any]:
        """The evidence trail of a task (needs a viewer token or better)."""
        return [event_from(e) for e in self._call("GET", f"/v1/tasks/{int(task_id)}/events")["events"]]

    def whoami(self) -> dict[str, Any]:
        """The calling token's identity, role and rights."""
        identity: dict[str, Any] = self._call("GET", "/v1/whoami")
        return identity

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.clear()

    def __enter__(self) -> RemoteQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
