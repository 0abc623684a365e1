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
:class:`leaseq.access.Unauthorized` (also an :class:`UnknownWorker`), a refused
role :class:`leaseq.access.AccessDenied`. A 429 is retried after the service's
``Retry-After`` (a few times, briefly) before :class:`leaseq.access.RateLimited`.

Batched calls (:meth:`RemoteQueue.complete_many`, :meth:`RemoteQueue.fail_many`,
:meth:`RemoteQueue.renew_leases`) take many leases in one request; the
service runs each request in one transaction and reports per task which
leases were refused. ``claim(..., wait=s)`` is a long poll: the service
answers as soon as work arrives, within ``s`` seconds.

:class:`AsyncRemoteQueue` offers the same calls awaited: the worker
runtime's port onto the service (:meth:`RemoteQueue.worker_port`). Each
operation is written once, as a generator of the requests it sends
(:class:`_Request`) that parses their answers; both clients send those
requests with urllib3 (half httpx's CPU per request), the async one from a
few threads of its own, and both read the answers and errors through
:func:`_answer`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
import warnings
from collections.abc import AsyncIterator, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import urllib3

from . import __version__
from .core.errors import (BackendUnavailable, ConfigError, InvalidInput, LeaseLost, LeaseqError, RateLimited,
                          error_class)
from .core import policy
from .core.checks import check_trace_context
from .engine.children import check_children
from .engine.durable import check_signal_name, check_until
from .core.model import AttemptRef, Claim, Claims, Effect, Ended, Ending, StreamItem, Task, Worker
from .engine.effects import check_effect_of
from .engine.endings import check_endings
from .engine.streams import check_cursor, check_follow, check_item
from .engine.waits import check_timeout, timed_out
from .observability.tracing import atraced_enqueue, atraced_enqueue_many, traced_enqueue, traced_enqueue_many
from .core.capabilities import Capabilities
from .service.wire import (SseReader, claim_from, effect_from, event_from, parse_time, stream_item_from, task_from,
                           worker_from)

#: Seconds one wait request asks the service to wait (it may cut that to its ``wait_limit``).
WAIT_REQUEST = 25.0
#: Seconds a stream's response may stay silent before the client gives up on it (the service
#: sends a keep-alive every 15 s).
STREAM_READ = 30.0


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


def _deadline_option(options: dict[str, Any]) -> None:
    """An enqueue's ``deadline`` as the service takes it: a timedelta as ``deadline_in`` (a length
    from now, by the database's clock), a datetime as ISO 8601 text (without an offset, the
    service refuses it as Queue does)."""
    deadline = options.pop("deadline", None)
    if isinstance(deadline, timedelta):
        options["deadline_in"] = deadline.total_seconds()
    elif isinstance(deadline, datetime):
        options["deadline"] = deadline.isoformat()
    elif deadline is not None:
        options["deadline"] = deadline


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


def _retry_after(data: bytes, headers: Mapping[str, str]) -> float:
    """How long to wait before asking again after a 429, at most 2 s: the error document's
    ``retry_after`` (to the millisecond: a token bucket of 100 requests a second owes 10 ms),
    else the ``Retry-After`` header (whole seconds, as HTTP writes it)."""
    try:
        owed = json.loads(data)["error"]["retry_after"]
        if isinstance(owed, (int, float)) and not isinstance(owed, bool) and owed >= 0:
            return min(2.0, float(owed))
    except (ValueError, KeyError, TypeError):
        pass
    try:
        return min(2.0, max(0.0, float(headers.get("Retry-After", "1") or 1)))
    except ValueError:
        return 1.0


T = TypeVar("T")

#: The threads an :class:`AsyncRemoteQueue` sends its requests from, as many as its
#: connections (:class:`RemoteQueue` keeps 16 open): a long poll holds one.
HTTP_THREADS = 16


@dataclass(frozen=True, slots=True)
class _Request:
    """One request an operation sends; the operation is sent the answer's decoded JSON."""

    method: str
    path: str
    body: Any = None
    params: dict[str, Any] | None = None
    #: a long poll: the service may hold the request this many seconds before it answers
    wait: float = 0.0
    headers: dict[str, str] | None = None


#: What ``next`` answers for an iterator that has no more entries (AsyncRemoteQueue.stream)
_ENDED: Any = object()

def _close(entries: Iterator[Any]) -> None:
    """Close a generator of entries (its open response with it)."""
    close = getattr(entries, "close", None)
    if close is not None:
        close()


#: An operation: yields the requests it sends, is sent each one's decoded answer, returns its value.
_Op = Generator[_Request, Any, T]

#: Each outcome's fields on the wire (``POST /v1/workers/{id}/end``), from a checked Ending.
_ENDING_FIELDS: dict[str, Any] = {
    "complete": lambda e: {"result": e.result},
    "fail": lambda e: {"error": e.error, "retry": e.retry, "block": e.block, "delay": e.delay},
    "retry": lambda e: {"after": e.after, "reason": e.reason},
    "release": lambda e: {"reason": e.reason, "started": e.started},
}


def _answer(url: str, status: int, data: bytes) -> Any:
    """The decoded JSON of a 2xx answer, else raises the library's exception for it: the
    registry rebuilds the class the service raised; a 5xx without one is
    :class:`BackendUnavailable`."""
    if 200 <= status < 300:
        return json.loads(data) if data else None
    text = data.decode("utf-8", "replace")
    try:
        err = json.loads(text)["error"]
        code, message = err["code"], err["message"]
    except (ValueError, KeyError, TypeError):
        err, code, message = {}, "", text[:200]
    cls = error_class(code) if isinstance(code, str) else None
    if cls is not None:  # the registry rebuilds the class the service raised
        try:
            error = cls.from_wire(str(message), err)
        except (TypeError, ValueError):  # fields of the wrong shape: keep the class, drop them
            error = cls.from_wire(str(message), {})
        raise error
    if status >= 500:
        raise BackendUnavailable(f"leaseq service at {url} answered {status}: {message}")
    raise LeaseqError(f"leaseq service answered {status}: {message}")


def _unreachable(url: str, exc: BaseException) -> BackendUnavailable:
    """A request that failed in transit (no answer): the service is out of reach for now."""
    return BackendUnavailable(f"leaseq service at {url}: {type(exc).__name__}: {exc}")


def _check_url(url: str, allow_insecure_http: bool) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"server: must be an http:// or https:// address (got {url!r})")
    if (url.startswith("http://") and not _loopback(url) and not allow_insecure_http
            and os.environ.get(INSECURE_HTTP_ENV, "") not in ("1", "true", "yes")):
        raise ConfigError(f"server: {urlsplit(url).hostname or url!r} is not this machine, and plain http:// "
                          f"would send the token in clear text: use https://, or set {INSECURE_HTTP_ENV}=1 "
                          "(allow_insecure_http=True) to accept that")
    return url.rstrip("/")


def _check_token(token: str) -> str:
    if not isinstance(token, str) or not token.strip():
        raise ConfigError("token: must be a non-empty string")
    return token.strip()


class _Operations:
    """Every call of the HTTP client, written once: what it checks, the request it sends, how
    it reads the answer. :class:`RemoteQueue` and :class:`AsyncRemoteQueue` send the requests."""

    url: str

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

    def _register_worker(self, name: str, kinds: list[dict[str, Any]] | None, heartbeat_seconds: float | None,
                         lease_seconds: float | None, version: str | None = None,
                         compatible_versions: list[str] | None = None) -> _Op[Worker]:
        body: dict[str, Any] = {"name": name}
        if kinds is not None:
            body["kinds"] = kinds
        if version is not None or compatible_versions is not None:
            body.update(version=version, compatible_versions=compatible_versions)
        if heartbeat_seconds is not None or lease_seconds is not None:
            body.update(heartbeat_seconds=heartbeat_seconds, lease_seconds=lease_seconds)
        return worker_from((yield _Request("POST", "/v1/workers", body)))

    def _heartbeat_worker(self, worker: Worker | str) -> _Op[None]:
        _, path = self._worker_path(worker, None, "heartbeat")
        yield _Request("POST", path, {})

    def _stop_worker(self, worker: Worker | str, reason: str) -> _Op[None]:
        _, path = self._worker_path(worker, None, "stopped")
        yield _Request("POST", path, {"reason": reason})

    def _claim(self, worker: Worker | str, queue: str, limit: int, lease_seconds: float | None,
               kinds: list[str] | None, wait: float) -> _Op[Claims]:
        _, path = self._worker_path(worker, None, "claim")
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < float("inf"):
            raise InvalidInput("wait", f"must be a number of seconds, 0 or more (got {wait!r})")
        body = _claim_body(queue, limit, lease_seconds, kinds)
        if wait:
            body["wait"] = float(wait)
        return _claims_from((yield _Request("POST", path, body, wait=float(wait))))

    def _interrupt_claims(self, worker: Worker | str) -> _Op[None]:
        _, path = self._worker_path(worker, None, "claim", "interrupt")
        yield _Request("POST", path)

    def _renew_leases(self, worker: Worker | str, claims: list[Claim]) -> _Op[dict[int, datetime]]:
        _, path = self._worker_path(worker, None, "renew")
        for c in claims:
            self._worker_path(worker, c)
        if not claims:
            return {}
        data = yield _Request("POST", path, {"leases": [{"task_id": c.task_id, "generation": c.generation}
                                                        for c in claims]})
        return {r["task_id"]: parse_time(r["expires_at"]) for r in data["renewed"]}  # type: ignore[misc]

    def _heartbeat(self, worker: Worker | str, claim: Claim) -> _Op[datetime]:
        renewed = yield from self._renew_leases(worker, [claim])
        if claim.task_id not in renewed:
            raise LeaseLost(claim.task_id, claim.generation, "heartbeat refused: lease no longer held")
        return renewed[claim.task_id]

    def _complete(self, worker: Worker | str, claim: Claim, result: Any) -> _Op[None]:
        _, path = self._worker_path(worker, claim, "complete")
        yield _Request("POST", path, {"generation": claim.generation, "result": result})

    def _fail(self, worker: Worker | str, claim: Claim, error: str, retry: bool, block: bool,
              delay: float | None) -> _Op[Task]:
        _, path = self._worker_path(worker, claim, "fail")
        return task_from((yield _Request("POST", path, {"generation": claim.generation, "error": error,
                                                         "retry": retry, "block": block, "delay": delay})))

    def _retry(self, worker: Worker | str, claim: Claim, after: float, reason: str) -> _Op[Task]:
        _, path = self._worker_path(worker, claim, "fail")
        return task_from((yield _Request("POST", path, {"generation": claim.generation, "error": reason,
                                                         "retry_after": after})))

    def _complete_many(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> _Op[set[int]]:
        path, items = self._completions(worker, done)
        if not items:
            return set()
        return set((yield _Request("POST", path, {"tasks": items}))["completed"])

    def _complete_and_claim(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]], queue: str, limit: int,
                            lease_seconds: float | None, kinds: list[str] | None) -> _Op[tuple[set[int], Claims]]:
        path, items = self._completions(worker, done)
        data = yield _Request("POST", path, {"tasks": items, "claim": _claim_body(queue, limit, lease_seconds, kinds)})
        return set(data["completed"]), _claims_from(data)

    def _completions(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> tuple[str, list[Any]]:
        """The complete route's path and its ``tasks`` items, each claim checked against ``worker``."""
        _, path = self._worker_path(worker, None, "complete")
        items = []
        for claim, result in done:
            self._worker_path(worker, claim)
            items.append({"task_id": claim.task_id, "generation": claim.generation, "result": result})
        return path, items

    def _fail_many(self, worker: Worker | str, failed: Sequence[tuple[Claim, str]], retry: bool, block: bool,
                   delay: float | None) -> _Op[dict[int, Task]]:
        _, path = self._worker_path(worker, None, "fail")
        items = []
        for claim, error in failed:
            self._worker_path(worker, claim)
            items.append({"task_id": claim.task_id, "generation": claim.generation, "error": error,
                          "retry": retry, "block": block, "delay": delay})
        if not items:
            return {}
        data = yield _Request("POST", path, {"tasks": items})
        return {t.id: t for t in (task_from(d) for d in data["failed"])}

    def _end_attempts(self, worker: Worker | str,
                      endings: Sequence[Ending]) -> _Op[tuple[list[Ended], list[AttemptRef]]]:
        wid, path = self._worker_path(worker, None, "end")
        items = []
        for ref, e in check_endings(wid, endings):
            item: dict[str, Any] = {"task_id": ref.task_id, "generation": ref.generation, "outcome": e.outcome}
            # only the outcome's own fields, and only those that say something
            item.update({k: v for k, v in _ENDING_FIELDS[e.outcome](e).items() if v is not None})
            items.append(item)
        if not items:
            return [], []
        data = yield _Request("POST", path, {"attempts": items})
        ended = [Ended(d["task_id"], d["generation"], d["outcome"], None if d["task"] is None else task_from(d["task"]))
                 for d in data["ended"]]
        return ended, [AttemptRef(r["task_id"], r["generation"], wid) for r in data["refused"]]

    def _release(self, worker: Worker | str, claim: Claim, reason: str, started: bool) -> _Op[Task]:
        _, path = self._worker_path(worker, claim, "release")
        body: dict[str, Any] = {"generation": claim.generation, "reason": reason}
        if started is not True:  # sent only when it says something: an older service refuses unknown fields
            body["started"] = started
        return task_from((yield _Request("POST", path, body)))

    def _begin_effect(self, worker: Worker | str, claim: Claim, action: str, key: str | None,
                      resource: str | None, effect: str | None, args_digest: str | None) -> _Op[Effect]:
        _, path = self._worker_path(worker, claim, "effects")
        body = {"generation": claim.generation, "action": action, "key": key}
        if resource is not None:
            body["resource"] = resource
        if effect is not None:
            body["effect"] = effect
        if args_digest is not None:
            body["args_digest"] = args_digest
        return effect_from((yield _Request("POST", path, body)))

    def _finish_effect(self, worker: Worker | str, claim: Claim, effect: Effect, response: Any) -> _Op[Effect]:
        wid, _ = self._worker_path(worker, claim)
        check_effect_of(claim, effect)
        if effect.replayed:
            return effect
        _, path = self._worker_path(wid, claim, "effects", str(effect.id), "response")
        return effect_from((yield _Request("POST", path, {"generation": claim.generation, "response": response})))

    def _intend(self, worker: Worker | str, claim: Claim, kind: str, payload: Any, key: str,
                options: dict[str, Any]) -> _Op[Task]:
        _, path = self._worker_path(worker, claim, "intents")
        body = {"generation": claim.generation, "kind": kind, "payload": payload, "key": key}
        body.update({name: value for name, value in options.items() if value is not None})
        return task_from((yield _Request("POST", path, body)))

    def _sleep(self, worker: Worker | str, claim: Claim, key: str, seconds: float | None,
               until: Any) -> _Op[dict[str, Any]]:
        _, path = self._worker_path(worker, claim, "sleep")
        body: dict[str, Any] = {"generation": claim.generation, "key": key}
        if seconds is not None:
            body["seconds"] = seconds
        if until is not None:
            body["until"] = check_until(until)
        return dict((yield _Request("POST", path, body)))

    def _wait_signal(self, worker: Worker | str, claim: Claim, key: str, name: str,
                     timeout: float | None, ask: dict[str, Any] | None = None) -> _Op[dict[str, Any]]:
        _, path = self._worker_path(worker, claim, "signal-wait")
        body: dict[str, Any] = {"generation": claim.generation, "key": key, "name": name, "timeout": timeout}
        if ask is not None:
            body["ask"] = ask
        return dict((yield _Request("POST", path, body)))

    def _emit(self, worker: Worker | str, claim: Claim, item: Any, key: str | None) -> _Op[dict[str, Any]]:
        _, path = self._worker_path(worker, claim, "stream")
        check_item(item)  # JSON, and not too large: refused here, as the queue would
        body: dict[str, Any] = {"generation": claim.generation, "item": item}
        if key is not None:
            body["key"] = key
        return dict((yield _Request("POST", path, body)))

    def _spawn(self, worker: Worker | str, claim: Claim, kind: str, payload: Any, key: str,
               options: dict[str, Any]) -> _Op[Task]:
        _, path = self._worker_path(worker, claim, "children")
        body = {"generation": claim.generation, "kind": kind, "payload": payload, "key": key}
        body.update({name: list(value) if name in ("actions", "limits", "resources") else value
                     for name, value in options.items() if value is not None})
        return task_from((yield _Request("POST", path, body)))

    def _wait_children(self, worker: Worker | str, claim: Claim, key: str, child_ids: Sequence[int],
                       timeout: float | None = None) -> _Op[dict[str, Any]]:
        _, path = self._worker_path(worker, claim, "children-wait")
        body: dict[str, Any] = {"generation": claim.generation, "key": key, "children": check_children(child_ids)}
        if timeout is not None:  # sent only when given: a service from before timeouts takes the rest
            body["timeout"] = timeout
        return dict((yield _Request("POST", path, body)))

    def _consume(self, worker: Worker | str, claim: Claim, key: str, limit_key: str,
                 units: int) -> _Op[dict[str, Any]]:
        _, path = self._worker_path(worker, claim, "consume")
        return dict((yield _Request("POST", path, {"generation": claim.generation, "key": key,
                                                   "limit_key": limit_key, "units": units})))

    def _report_loss(self, worker: Worker | str, claim: Claim, reason: str) -> _Op[None]:
        _, path = self._worker_path(worker, claim, "loss")
        yield _Request("POST", path, {"generation": claim.generation, "reason": reason})

    # -- tasks and limits --------------------------------------------------------------------------

    def _enqueue(self, kind: str, payload: Any, options: dict[str, Any]) -> _Op[Task]:
        traceparent = check_trace_context("trace_context", options.pop("trace_context", None))
        headers = {"traceparent": traceparent} if traceparent is not None else None
        _deadline_option(options)
        return task_from((yield _Request("POST", "/v1/tasks", {"kind": kind, "payload": payload, **options},
                                         headers=headers)))

    def _enqueue_many(self, kind: str, payloads: Iterable[Any], options: dict[str, Any]) -> _Op[list[int]]:
        traceparent = check_trace_context("trace_context", options.pop("trace_context", None))
        headers = {"traceparent": traceparent} if traceparent is not None else None
        _deadline_option(options)
        for name in ("idempotency_keys", "actions", "resources", "limits", "after"):
            if options.get(name) is not None:
                options[name] = list(options[name])
        answer = yield _Request("POST", "/v1/tasks/batch", {"kind": kind, "payloads": list(payloads), **options},
                                headers=headers)
        return [int(task_id) for task_id in answer["task_ids"]]

    def _set_limit(self, key: str, max_running: int | None, per_second: float | None, burst: float | None,
                   counts: str, per_minute: int | None = None, per_hour: int | None = None,
                   per_day: int | None = None) -> _Op[dict[str, Any]]:
        limit: dict[str, Any] = yield _Request("PUT", f"/v1/limits/{_limit_key(key)}", {
            "max_running": max_running, "per_second": per_second, "burst": burst, "counts": counts,
            "per_minute": per_minute, "per_hour": per_hour, "per_day": per_day})
        return limit

    def _delete_limit(self, key: str) -> _Op[None]:
        yield _Request("DELETE", f"/v1/limits/{_limit_key(key)}")

    def _limits(self) -> _Op[list[dict[str, Any]]]:
        limits: list[dict[str, Any]] = (yield _Request("GET", "/v1/limits"))["limits"]
        return limits

    def _get(self, task_id: int) -> _Op[Task]:
        return task_from((yield _Request("GET", f"/v1/tasks/{_task_id(task_id)}")))

    def _dependency_results(self, task_id: int) -> _Op[dict[int, Any]]:
        data = yield _Request("GET", f"/v1/tasks/{_task_id(task_id)}/dependency-results")
        return {r["task_id"]: r["result"] for r in data["results"]}

    def _wait(self, task_id: int, timeout: float | None) -> _Op[Task]:
        task_id = _task_id(task_id)
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_REQUEST if deadline is None else max(0.0, deadline - time.monotonic())
            step = min(left, WAIT_REQUEST)
            data = yield _Request("GET", f"/v1/tasks/{task_id}/wait", params={"timeout": step}, wait=step)
            task = task_from(data["task"])
            if data["settled"]:
                return task
            if deadline is not None and time.monotonic() >= deadline:
                raise timed_out(task, timeout)

    def _events(self, task_id: int) -> _Op[list[Any]]:
        return [event_from(e) for e in (yield _Request("GET", f"/v1/tasks/{int(task_id)}/events"))["events"]]

    def _signal(self, task_id: int, name: str, payload: Any) -> _Op[dict[str, Any]]:
        check_signal_name(name)
        path = f"/v1/tasks/{int(task_id)}/signals/{quote(name, safe='')}"
        return dict((yield _Request("POST", path, {"payload": payload})))

    def _signals(self, task_id: int) -> _Op[list[dict[str, Any]]]:
        return list((yield _Request("GET", f"/v1/tasks/{int(task_id)}/signals"))["signals"])

    def _bulk(self, path: str, status: str | list[str], queue: str | None, kind: str | None, error: str | None,
              older_than: float | None, limit: int, dry_run: bool, note: str) -> _Op[dict[str, Any]]:
        """A bulk operator action on the tasks a filter matches (redrive, cancel-where)."""
        done: dict[str, Any] = yield _Request("POST", path, {
            "status": status, "queue": queue, "kind": kind, "error": error, "older_than": older_than,
            "limit": limit, "dry_run": dry_run, "note": note})
        return done

    def _whoami(self) -> _Op[dict[str, Any]]:
        identity: dict[str, Any] = yield _Request("GET", "/v1/whoami")
        return identity


class RemoteQueue(_Operations):
    """A queue reached through the leaseq service. Thread-safe; share one per process.

    ``url`` is the service's base address; ``token`` a ``worker`` token (or an
    operator token for :meth:`enqueue` and :meth:`get` only).

    The token goes with every request, so a plain ``http://`` address is accepted
    only on this machine (a loopback address or ``localhost``): anywhere else, use
    ``https://``, or say you accept sending the token in clear text with
    ``allow_insecure_http=True`` or ``LEASEQ_ALLOW_INSECURE_HTTP=1`` in the environment
    (a private network you trust, say).

    Its calls block; the worker runtime awaits the same calls on an
    :class:`AsyncRemoteQueue` (:meth:`worker_port`).
    """

    #: How the queue is reached: over HTTP, through the leaseq service (which
    #: database stands behind it is the service's business).
    transport = "http"
    #: Completions in batches (which may lease the next tasks in the same request),
    #: claims that wait on the service's side for work (see :class:`leaseq.worker.Capabilities`).
    capabilities = Capabilities(loss_reports=True, batched_completion=True, long_poll=True,
                                claim_with_completion=True)

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, rate_limit_retries: int = 3,
                 allow_insecure_http: bool = False):
        self.url = _check_url(url, allow_insecure_http)
        self._token = _check_token(token)
        self._allow_insecure_http = allow_insecure_http
        self.timeout = timeout
        self.rate_limit_retries = rate_limit_retries
        self._urls: dict[str, str] = {}
        self._headers = {"Authorization": f"Bearer {self._token}", "User-Agent": f"leaseq/{__version__}",
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
        return cls(url, _read_token_file(path), **options)

    def worker_port(self) -> AsyncRemoteQueue:
        """The same service, token and settings as an :class:`AsyncRemoteQueue`: what the
        worker runtime awaits (on its own event loop) when it is given this queue."""
        return AsyncRemoteQueue(self.url, self._token, timeout=self.timeout,
                                rate_limit_retries=self.rate_limit_retries,
                                allow_insecure_http=self._allow_insecure_http)

    # -- plumbing ---------------------------------------------------------------------------

    def _run(self, op: _Op[T]) -> T:
        """Send each request of ``op`` and hand it the answer; returns what ``op`` returns."""
        answer: Any = None
        while True:
            try:
                request = op.send(answer)
            except StopIteration as stop:
                value: T = stop.value
                return value
            try:
                answer = self._send(request)
            except BaseException:
                op.close()
                raise

    def _send(self, request: _Request) -> Any:
        return self._call(request.method, request.path, request.body, request.params, wait=request.wait,
                          headers=request.headers)

    def _call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None, *,
              wait: float = 0.0, headers: dict[str, str] | None = None) -> Any:
        resp = self._urlopen(method, path, body, params, wait=wait, headers=headers)
        return _answer(self.url, resp.status, resp.data)

    def _urlopen(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None, *,
              wait: float = 0.0, headers: dict[str, str] | None = None,
              preload: bool = True) -> urllib3.BaseHTTPResponse:
        """The response to one request, after the 429s it may be retried for (``preload=False``:
        its body is read as it arrives)."""
        # A long poll may take ``wait`` seconds before the service answers at all.
        timeout = self._timeout if not wait else urllib3.Timeout(connect=self.timeout, read=self.timeout + wait)
        url = self._url(path) if not params else f"{self._url(path)}?{urlencode(params)}"
        data = None if body is None else json.dumps(body).encode()
        sent = self._headers if headers is None else {**self._headers, **headers}
        for attempt in range(self.rate_limit_retries + 1):
            try:
                resp = self._http.urlopen(method, url, body=data, headers=sent, timeout=timeout, redirect=False,
                                          preload_content=preload)
            except urllib3.exceptions.HTTPError as exc:
                raise _unreachable(self.url, exc) from None
            if resp.status == RateLimited.http_status and attempt < self.rate_limit_retries:
                time.sleep(_retry_after(resp.data, resp.headers))
                continue
            break
        return resp

    def _url(self, path: str) -> str:
        """The absolute URL of ``path`` (kept: a worker calls the same few paths again and again)."""
        url = self._urls.get(path)
        if url is None:
            if len(self._urls) >= 256:  # task-level paths come and go: keep the cache small
                self._urls.clear()
            url = self._urls[path] = self.url + path
        return url

    # -- the worker transport --------------------------------------------------------------------

    def register_worker(self, name: str = "worker", *, kinds: list[dict[str, Any]] | None = None,
                        heartbeat_seconds: float | None = None, lease_seconds: float | None = None,
                        version: str | None = None, compatible_versions: list[str] | None = None) -> Worker:
        """Register a worker under this client's token; the service issues the id.
        ``kinds``, ``heartbeat_seconds``, ``lease_seconds``, ``version``, ``compatible_versions``:
        see :meth:`leaseq.Queue.register_worker`."""
        return self._run(self._register_worker(name, kinds, heartbeat_seconds, lease_seconds, version,
                                               compatible_versions))

    def heartbeat_worker(self, worker: Worker | str) -> None:
        """Say the worker process is alive; see :meth:`leaseq.Queue.heartbeat_worker`."""
        self._run(self._heartbeat_worker(worker))

    def stop_worker(self, worker: Worker | str, reason: str = "stopped") -> None:
        """Record the worker's clean exit; see :meth:`leaseq.Queue.stop_worker`."""
        self._run(self._stop_worker(worker, reason))

    def claim(self, worker: Worker | str, *, queue: str = "default", limit: int = 1,
              lease_seconds: float | None = None, kinds: list[str] | None = None, wait: float = 0.0) -> list[Claim]:
        """Lease up to ``limit`` due tasks of ``queue``; see :meth:`leaseq.Queue.claim`.

        ``wait``: when nothing is due, the service holds the request up to this
        many seconds (it caps the value) and answers as soon as work arrives.
        """
        return self._run(self._claim(worker, queue, limit, lease_seconds, kinds, wait))

    def interrupt_claims(self, worker: Worker | str) -> None:
        """End the worker's claims waiting in the service at once, empty-handed (at shutdown)."""
        self._run(self._interrupt_claims(worker))

    def renew_leases(self, worker: Worker | str, claims: list[Claim]) -> dict[int, datetime]:
        """Renew many leases in one request; a claim missing from the result was lost."""
        return self._run(self._renew_leases(worker, claims))

    def heartbeat(self, worker: Worker | str, claim: Claim) -> datetime:
        """Renew one lease; returns the new deadline or raises :class:`LeaseLost`."""
        return self._run(self._heartbeat(worker, claim))

    def complete(self, worker: Worker | str, claim: Claim, result: Any = None) -> None:
        """Finish the task with ``result``; raises :class:`LeaseLost` without authority."""
        self._run(self._complete(worker, claim, result))

    def fail(self, worker: Worker | str, claim: Claim, error: str, *, retry: bool = True, block: bool = False,
             delay: float | None = None) -> Task:
        """End the attempt with ``error``; see :meth:`leaseq.Queue.fail`."""
        return self._run(self._fail(worker, claim, error, retry, block, delay))

    def retry(self, worker: Worker | str, claim: Claim, after: float = 0.0, reason: str = "retry requested") -> Task:
        """End the attempt on request, to run again ``after`` seconds later; see :meth:`leaseq.Queue.retry`
        (sent as a fail with ``retry_after``)."""
        return self._run(self._retry(worker, claim, after, reason))

    def complete_many(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> set[int]:
        """Finish many tasks in one request (one guarded statement on the service's side).

        ``done`` holds ``(claim, result)`` pairs. Returns the ids completed; a
        task missing from the answer had lost its lease and was left untouched.
        """
        return self._run(self._complete_many(worker, done))

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
        return self._run(self._complete_and_claim(worker, done, queue, limit, lease_seconds, kinds))

    def fail_many(self, worker: Worker | str, failed: Sequence[tuple[Claim, str]], *, retry: bool = True,
                  block: bool = False, delay: float | None = None) -> dict[int, Task]:
        """End many attempts in one request, each ``(claim, error)`` as :meth:`fail` would.

        Returns ``{task_id: task}`` for the attempts ended; a task missing from
        the answer had lost its lease and was left untouched.
        """
        return self._run(self._fail_many(worker, failed, retry, block, delay))

    def end_attempts(self, worker: Worker | str,
                     endings: Sequence[Ending]) -> tuple[list[Ended], list[AttemptRef]]:
        """End many attempts in one request (``POST /v1/workers/{id}/end``), each as its
        :class:`leaseq.Ending` says: see :meth:`leaseq.Queue.end_attempts`."""
        return self._run(self._end_attempts(worker, endings))

    def release(self, worker: Worker | str, claim: Claim, reason: str = "released", *,
                started: bool = True) -> Task:
        """Give a lease back early; the task goes through the recovery policy (``started=False``:
        the handler never began, and the attempt is given back too; see :meth:`leaseq.Queue.release`)."""
        return self._run(self._release(worker, claim, reason, started))

    def begin_effect(self, worker: Worker | str, claim: Claim, action: str, key: str | None = None, *,
                     resource: str | None = None, effect: str | None = None,
                     args_digest: str | None = None) -> Effect:
        """Record a tool-call intent under the lease; see :meth:`leaseq.Queue.begin_effect`."""
        return self._run(self._begin_effect(worker, claim, action, key, resource, effect, args_digest))

    def finish_effect(self, worker: Worker | str, claim: Claim, effect: Effect, response: Any = None) -> Effect:
        """Record the response of a tool call whose intent :meth:`begin_effect` recorded."""
        return self._run(self._finish_effect(worker, claim, effect, response))

    def intend(self, worker: Worker | str, claim: Claim, kind: str, payload: Any = None, *, key: str,
               **options: Any) -> Task:
        """Record an intent for an executor under the lease; see :meth:`leaseq.Queue.intend`."""
        return self._run(self._intend(worker, claim, kind, payload, key, options))

    def sleep(self, worker: Worker | str, claim: Claim, key: str, *, seconds: float | None = None,
              until: Any = None) -> dict[str, Any]:
        """A durable sleep of the attempt, under the lease; see :meth:`leaseq.Queue.sleep`."""
        return self._run(self._sleep(worker, claim, key, seconds, until))

    def wait_signal(self, worker: Worker | str, claim: Claim, key: str, name: str, *,
                    timeout: float | None = None, ask: dict[str, Any] | None = None) -> dict[str, Any]:
        """A durable wait for a signal (or, with ``ask``, a person's answer), under the lease; see
        :meth:`leaseq.Queue.wait_signal`."""
        return self._run(self._wait_signal(worker, claim, key, name, timeout, ask))

    def spawn(self, worker: Worker | str, claim: Claim, kind: str, payload: Any = None, *, key: str,
              **options: Any) -> Task:
        """Enqueue a child task of the claimed one under its lease; see :meth:`leaseq.Queue.spawn`."""
        return self._run(self._spawn(worker, claim, kind, payload, key, options))

    def wait_children(self, worker: Worker | str, claim: Claim, key: str,
                      child_ids: Sequence[int], *, timeout: float | None = None) -> dict[str, Any]:
        """A durable wait for children of the claimed task, under its lease; see
        :meth:`leaseq.Queue.wait_children`."""
        return self._run(self._wait_children(worker, claim, key, child_ids, timeout))

    def cancel(self, task_id: int, reason: str = "cancelled", *, tree: bool = False) -> Task | dict[str, Any]:
        """Cancel a task (an operator token), recorded under this token's principal; with
        ``tree=True`` answer the cancel tree's report. See :meth:`leaseq.Queue.cancel`."""
        body: dict[str, Any] = {"reason": reason}
        if tree:
            body["tree"] = True
        answer = self._call("POST", f"/v1/tasks/{_task_id(task_id)}/cancel", body)
        return dict(answer) if tree else task_from(answer)

    def consume(self, worker: Worker | str, claim: Claim, key: str, limit_key: str, units: int) -> dict[str, Any]:
        """Usage settled after the call, under the lease; see :meth:`leaseq.Queue.consume`."""
        return self._run(self._consume(worker, claim, key, limit_key, units))

    def signal(self, task_id: int, name: str, payload: Any = None) -> dict[str, Any]:
        """Send the signal ``name`` to a task (an operator token); see :meth:`leaseq.Queue.signal`.
        The sender recorded is this token's principal."""
        return self._run(self._signal(task_id, name, payload))

    def signals(self, task_id: int) -> list[dict[str, Any]]:
        """A task's signals, oldest first; see :meth:`leaseq.Queue.signals`."""
        return self._run(self._signals(task_id))

    def emit(self, worker: Worker | str, claim: Claim, item: Any, *, key: str | None = None) -> dict[str, Any]:
        """Append ``item`` to the task's stream under the lease; see :meth:`leaseq.Queue.emit`."""
        return self._run(self._emit(worker, claim, item, key))

    def stream(self, task_id: int, *, after: int = 0, follow: bool = True,
               timeout: float | None = None) -> Iterator[StreamItem]:
        """A task's stream after the cursor ``after``; see :meth:`leaseq.Queue.stream` (a token that
        may read the task; a token that may not read payloads gets each item redacted).

        Server-sent events from ``GET /v1/tasks/{id}/stream``: each response follows for
        the service's ``stream_seconds`` at most (or sends its ``stream_items``), then this
        asks again after the last entry it got, until the stream is over or ``timeout``
        seconds have passed."""
        cursor = check_cursor(after)
        check_follow(follow)
        timeout = check_timeout(timeout)
        return self._follow(_task_id(task_id), cursor, follow,
                            None if timeout is None else time.monotonic() + timeout)

    def _follow(self, task_id: int, cursor: int, follow: bool, deadline: float | None) -> Iterator[StreamItem]:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            params: dict[str, Any] = {"after": cursor, "follow": "true" if follow else "false"}
            if left is not None:
                params["timeout"] = left
            resp = self._urlopen("GET", f"/v1/tasks/{task_id}/stream", params=params, preload=False,
                              headers={"Accept": "text/event-stream", "Last-Event-ID": str(cursor)},
                              wait=STREAM_READ)
            try:
                if not 200 <= resp.status < 300:
                    _answer(self.url, resp.status, resp.data)  # raises the service's error
                reader = SseReader()
                try:
                    for chunk in resp.stream(65536):
                        for event, event_id, data in reader.feed(chunk):
                            if event in ("item", "reset"):
                                entry = stream_item_from(data)
                                cursor = event_id if event_id is not None else entry.seq
                                yield entry
                            elif event == "end":
                                return
                            elif event == "error":
                                cls = error_class(str(data.get("code")))
                                if cls is not None:
                                    raise cls.from_wire(str(data.get("message")), {})
                                raise BackendUnavailable(f"leaseq service at {self.url}: {data.get('message')}")
                except urllib3.exceptions.HTTPError as exc:
                    raise BackendUnavailable(f"leaseq service at {self.url}: {type(exc).__name__}: {exc}") from None
            finally:  # closed, not kept: a stream left early has unread entries on its connection
                resp.close()
                resp.release_conn()
            # the response ended without "end" (its time or its count was up): ask again after the last entry

    def asks(self, *, queue: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The open questions of the queues this token may read; see :meth:`leaseq.Queue.asks`
        (times as ISO 8601 text; the question redacted for a token that may not read payloads)."""
        params: dict[str, Any] = {"limit": limit}
        if queue is not None:
            params["queue"] = queue
        return list(self._call("GET", "/v1/asks", params=params)["asks"])

    def answer(self, task_id: int, answer: Any) -> dict[str, Any]:
        """Answer a task's question (an operator token); see :meth:`leaseq.Queue.answer`. The
        answerer recorded is this token's principal."""
        return dict(self._call("POST", f"/v1/tasks/{int(task_id)}/answer", {"answer": answer}))

    def report_loss(self, worker: Worker | str, claim: Claim, reason: str) -> None:
        """Add the worker's own account of losing a lease to the evidence trail."""
        self._run(self._report_loss(worker, claim, reason))

    @traced_enqueue
    def enqueue(self, kind: str, payload: Any = None, **options: Any) -> Task:
        """Add a task; options as for :meth:`leaseq.Queue.enqueue` (``deadline`` a datetime or a
        timedelta, sent as ``deadline`` or ``deadline_in``). The trace context
        travels as the W3C ``traceparent`` header, which the service stores with the task."""
        return self._run(self._enqueue(kind, payload, options))

    @traced_enqueue_many
    def enqueue_many(self, kind: str, payloads: Iterable[Any], **options: Any) -> list[int]:
        """Add many tasks of one ``kind`` at once (``POST /v1/tasks/batch``); returns their ids, in
        order. Options as for :meth:`leaseq.Queue.enqueue_many` (``idempotency_keys``, one per
        payload; ``budget``, each task's own; the others shared), every task or none, in one
        transaction; at most 1000 payloads per call. ``trace_context`` travels as the W3C
        ``traceparent`` header, which the service stores with every task (by default, with
        OpenTelemetry tracing on, that of this call's own ``leaseq.enqueue_many`` span)."""
        return self._run(self._enqueue_many(kind, payloads, options))

    def redrive(self, *, status: str | list[str] = "dead", queue: str | None = None, kind: str | None = None,
                error: str | None = None, older_than: float | None = None, limit: int = 1000,
                dry_run: bool = False, note: str = "redriven") -> dict[str, Any]:
        """Requeue the dead (or blocked) tasks matching a filter (an operator token); see
        :meth:`leaseq.Queue.redrive`."""
        return self._run(self._bulk("/v1/tasks/redrive", status, queue, kind, error, older_than, limit, dry_run,
                                    note))

    def cancel_where(self, *, status: str | list[str], queue: str | None = None, kind: str | None = None,
                     error: str | None = None, older_than: float | None = None, limit: int = 1000,
                     dry_run: bool = False, reason: str = "cancelled") -> dict[str, Any]:
        """Cancel the tasks matching a filter (an operator token); see :meth:`leaseq.Queue.cancel_where`."""
        return self._run(self._bulk("/v1/tasks/cancel-where", status, queue, kind, error, older_than, limit,
                                    dry_run, reason))

    def set_limit(self, key: str, *, max_running: int | None = None, per_second: float | None = None,
                  burst: float | None = None, counts: str = "tasks", per_minute: int | None = None,
                  per_hour: int | None = None, per_day: int | None = None) -> dict[str, Any]:
        """Create or change a limit (an operator token); see :meth:`leaseq.Queue.set_limit`."""
        return self._run(self._set_limit(key, max_running, per_second, burst, counts, per_minute, per_hour,
                                         per_day))

    def delete_limit(self, key: str) -> None:
        """Remove a limit (an operator token); see :meth:`leaseq.Queue.delete_limit`."""
        self._run(self._delete_limit(key))

    def limits(self) -> list[dict[str, Any]]:
        """Every limit with its usage (a viewer token or better); see :meth:`leaseq.Queue.limits`."""
        return self._run(self._limits())

    def limit_spend(self, key: str | None = None, *, days: int = 7) -> list[dict[str, Any]]:
        """Usage settled per key and day (a viewer token or better); see :meth:`leaseq.Queue.limit_spend`."""
        params: dict[str, Any] = {"days": days} if key is None else {"days": days, "key": key}
        spend: list[dict[str, Any]] = self._call("GET", "/v1/limits/spend", params=params)["spend"]
        return spend

    def get(self, task_id: int) -> Task:
        """One task; raises :class:`NotFound`."""
        return self._run(self._get(task_id))

    def dependency_results(self, task_id: int) -> dict[int, Any]:
        """The results of the tasks ``task_id`` waits (or waited) for, ``{task id: result}``;
        see :meth:`leaseq.Queue.dependency_results` (a worker token: for tasks its workers hold)."""
        return self._run(self._dependency_results(task_id))

    def wait(self, task_id: int, *, timeout: float | None = None) -> Task:
        """Block until the task has ended or is parked for a person; see :meth:`leaseq.Queue.wait`.

        A long poll: each request waits on the service's side (up to its
        ``wait_limit``, 25 s by default) and this asks again until ``timeout``
        (None: no limit), then raises :class:`TimeoutError`."""
        return self._run(self._wait(task_id, timeout))

    def events(self, task_id: int) -> list[Any]:
        """The evidence trail of a task (needs a viewer token or better)."""
        return self._run(self._events(task_id))

    def whoami(self) -> dict[str, Any]:
        """The calling token's identity, role and rights."""
        return self._run(self._whoami())

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.clear()

    def __enter__(self) -> RemoteQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_token_file(path: str | os.PathLike[str]) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.readline().strip()
    except OSError as exc:
        raise ConfigError(f"token-file: cannot read {str(path)!r}: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"token-file: {str(path)!r} is empty")
    return token


class AsyncRemoteQueue(_Operations):
    """:class:`RemoteQueue`'s calls, awaited: each request is sent by a :class:`RemoteQueue`
    (urllib3, connections kept open between calls) from one of :data:`HTTP_THREADS` threads
    of this client's, while the event loop goes on.

    The worker runtime's port onto the service (:class:`leaseq.worker.transport.Transport`).
    Any event loop may await it; :meth:`close_async` closes the connections and ends the
    threads (a later call opens new ones).
    """

    transport = "http"
    capabilities = RemoteQueue.capabilities

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, rate_limit_retries: int = 3,
                 allow_insecure_http: bool = False):
        self.url = _check_url(url, allow_insecure_http)
        self._token = _check_token(token)
        self._allow_insecure_http = allow_insecure_http
        self.timeout = timeout
        self.rate_limit_retries = rate_limit_retries
        self._headers = {"Authorization": f"Bearer {self._token}", "User-Agent": f"leaseq/{__version__}",
                         "Content-Type": "application/json"}
        self._pool: ThreadPoolExecutor | None = None
        self._sync: RemoteQueue | None = None

    @property
    def sync(self) -> RemoteQueue:
        """The same service, token and settings, blocking (for blocking code on the event loop's thread)."""
        if self._sync is None:
            self._sync = RemoteQueue(self.url, self._token, timeout=self.timeout,
                                     rate_limit_retries=self.rate_limit_retries,
                                     allow_insecure_http=self._allow_insecure_http)
        return self._sync

    @classmethod
    def from_token_file(cls, url: str, path: str | os.PathLike[str], **options: Any) -> AsyncRemoteQueue:
        """Read the token from a file (its first line), as ``leaseq worker --token-file`` does."""
        return cls(url, _read_token_file(path), **options)

    # -- plumbing ---------------------------------------------------------------------------

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=HTTP_THREADS, thread_name_prefix="leaseq-http")
        return self._pool

    async def _run(self, op: _Op[T]) -> T:
        """Send each request of ``op`` and hand it the answer; returns what ``op`` returns."""
        answer: Any = None
        while True:
            try:
                request = op.send(answer)
            except StopIteration as stop:
                value: T = stop.value
                return value
            try:
                answer = await self._send(request)
            except BaseException:
                op.close()
                raise

    async def _send(self, request: _Request) -> Any:
        # urllib3 in a thread: an httpx.AsyncClient on the loop cost a remote worker twice the
        # CPU per request, and a worker of no-op tasks spends most of its CPU on requests.
        return await asyncio.get_running_loop().run_in_executor(self._threads(), self.sync._send, request)

    async def close_async(self) -> None:
        """Close the HTTP connections (a later call opens new ones)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        if self._sync is not None:
            self._sync.close()

    async def close(self) -> None:
        """:meth:`close_async`."""
        await self.close_async()

    async def __aenter__(self) -> AsyncRemoteQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close_async()

    # -- the worker transport --------------------------------------------------------------------

    async def register_worker(self, name: str = "worker", *, kinds: list[dict[str, Any]] | None = None,
                              heartbeat_seconds: float | None = None, lease_seconds: float | None = None,
                              version: str | None = None, compatible_versions: list[str] | None = None) -> Worker:
        """:meth:`RemoteQueue.register_worker`, awaited."""
        return await self._run(self._register_worker(name, kinds, heartbeat_seconds, lease_seconds, version,
                                                     compatible_versions))

    async def heartbeat_worker(self, worker: Worker | str) -> None:
        """:meth:`RemoteQueue.heartbeat_worker`, awaited."""
        await self._run(self._heartbeat_worker(worker))

    async def stop_worker(self, worker: Worker | str, reason: str = "stopped") -> None:
        """:meth:`RemoteQueue.stop_worker`, awaited."""
        await self._run(self._stop_worker(worker, reason))

    async def claim(self, worker: Worker | str, *, queue: str = "default", limit: int = 1,
                    lease_seconds: float | None = None, kinds: list[str] | None = None,
                    wait: float = 0.0) -> list[Claim]:
        """:meth:`RemoteQueue.claim`, awaited."""
        return await self._run(self._claim(worker, queue, limit, lease_seconds, kinds, wait))

    async def interrupt_claims(self, worker: Worker | str) -> None:
        """:meth:`RemoteQueue.interrupt_claims`, awaited."""
        await self._run(self._interrupt_claims(worker))

    async def renew_leases(self, worker: Worker | str, claims: list[Claim]) -> dict[int, datetime]:
        """:meth:`RemoteQueue.renew_leases`, awaited."""
        return await self._run(self._renew_leases(worker, claims))

    async def heartbeat(self, worker: Worker | str, claim: Claim) -> datetime:
        """:meth:`RemoteQueue.heartbeat`, awaited."""
        return await self._run(self._heartbeat(worker, claim))

    async def complete(self, worker: Worker | str, claim: Claim, result: Any = None) -> None:
        """:meth:`RemoteQueue.complete`, awaited."""
        await self._run(self._complete(worker, claim, result))

    async def fail(self, worker: Worker | str, claim: Claim, error: str, *, retry: bool = True, block: bool = False,
                   delay: float | None = None) -> Task:
        """:meth:`RemoteQueue.fail`, awaited."""
        return await self._run(self._fail(worker, claim, error, retry, block, delay))

    async def retry(self, worker: Worker | str, claim: Claim, after: float = 0.0,
                    reason: str = "retry requested") -> Task:
        """:meth:`RemoteQueue.retry`, awaited."""
        return await self._run(self._retry(worker, claim, after, reason))

    async def complete_many(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> set[int]:
        """:meth:`RemoteQueue.complete_many`, awaited."""
        return await self._run(self._complete_many(worker, done))

    async def complete_and_claim(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]], *,
                                 queue: str = "default", limit: int = 1, lease_seconds: float | None = None,
                                 kinds: list[str] | None = None) -> tuple[set[int], Claims]:
        """:meth:`RemoteQueue.complete_and_claim`, awaited."""
        return await self._run(self._complete_and_claim(worker, done, queue, limit, lease_seconds, kinds))

    async def fail_many(self, worker: Worker | str, failed: Sequence[tuple[Claim, str]], *, retry: bool = True,
                        block: bool = False, delay: float | None = None) -> dict[int, Task]:
        """:meth:`RemoteQueue.fail_many`, awaited."""
        return await self._run(self._fail_many(worker, failed, retry, block, delay))

    async def end_attempts(self, worker: Worker | str,
                           endings: Sequence[Ending]) -> tuple[list[Ended], list[AttemptRef]]:
        """:meth:`RemoteQueue.end_attempts`, awaited."""
        return await self._run(self._end_attempts(worker, endings))

    async def release(self, worker: Worker | str, claim: Claim, reason: str = "released", *,
                      started: bool = True) -> Task:
        """:meth:`RemoteQueue.release`, awaited."""
        return await self._run(self._release(worker, claim, reason, started))

    async def begin_effect(self, worker: Worker | str, claim: Claim, action: str, key: str | None = None, *,
                           resource: str | None = None, effect: str | None = None,
                           args_digest: str | None = None) -> Effect:
        """:meth:`RemoteQueue.begin_effect`, awaited."""
        return await self._run(self._begin_effect(worker, claim, action, key, resource, effect, args_digest))

    async def finish_effect(self, worker: Worker | str, claim: Claim, effect: Effect,
                            response: Any = None) -> Effect:
        """:meth:`RemoteQueue.finish_effect`, awaited."""
        return await self._run(self._finish_effect(worker, claim, effect, response))

    async def intend(self, worker: Worker | str, claim: Claim, kind: str, payload: Any = None, *, key: str,
                     **options: Any) -> Task:
        """:meth:`RemoteQueue.intend`, awaited."""
        return await self._run(self._intend(worker, claim, kind, payload, key, options))

    async def sleep(self, worker: Worker | str, claim: Claim, key: str, *, seconds: float | None = None,
                    until: Any = None) -> dict[str, Any]:
        """:meth:`RemoteQueue.sleep`, awaited."""
        return await self._run(self._sleep(worker, claim, key, seconds, until))

    async def wait_signal(self, worker: Worker | str, claim: Claim, key: str, name: str, *,
                          timeout: float | None = None, ask: dict[str, Any] | None = None) -> dict[str, Any]:
        """:meth:`RemoteQueue.wait_signal`, awaited."""
        return await self._run(self._wait_signal(worker, claim, key, name, timeout, ask))

    async def emit(self, worker: Worker | str, claim: Claim, item: Any, *,
                   key: str | None = None) -> dict[str, Any]:
        """Append ``item`` to the task's stream under the lease; see :meth:`leaseq.Queue.emit`."""
        return await self._run(self._emit(worker, claim, item, key))

    def stream(self, task_id: int, *, after: int = 0, follow: bool = True,
               timeout: float | None = None) -> AsyncIterator[StreamItem]:
        """:meth:`RemoteQueue.stream` for asyncio code: ``async for entry in arq.stream(task_id):``.

        The same server-sent events, read by :meth:`RemoteQueue.stream` in this client's
        threads (one is held while the stream waits for entries); the arguments are
        checked now, as there."""
        return self._in_threads(self.sync.stream(task_id, after=after, follow=follow, timeout=timeout))

    async def _in_threads(self, entries: Iterator[StreamItem]) -> AsyncIterator[StreamItem]:
        """Each entry of the blocking iterator ``entries``, read in this client's threads; it is
        closed (its response with it) when the loop is left, once a read in flight returns."""
        reading: Future[Any] | None = None
        try:
            while True:
                reading = self._threads().submit(next, entries, _ENDED)
                entry = await asyncio.wrap_future(reading)
                if entry is _ENDED:
                    return
                yield entry
        finally:
            if reading is not None and not reading.done():  # left while a thread reads: close after it
                reading.add_done_callback(lambda _read: _close(entries))
            else:
                self._threads().submit(_close, entries)

    async def spawn(self, worker: Worker | str, claim: Claim, kind: str, payload: Any = None, *, key: str,
                    **options: Any) -> Task:
        """:meth:`RemoteQueue.spawn`, awaited."""
        return await self._run(self._spawn(worker, claim, kind, payload, key, options))

    async def wait_children(self, worker: Worker | str, claim: Claim, key: str,
                            child_ids: Sequence[int], *, timeout: float | None = None) -> dict[str, Any]:
        """:meth:`RemoteQueue.wait_children`, awaited."""
        return await self._run(self._wait_children(worker, claim, key, child_ids, timeout))

    async def consume(self, worker: Worker | str, claim: Claim, key: str, limit_key: str,
                      units: int) -> dict[str, Any]:
        """:meth:`RemoteQueue.consume`, awaited."""
        return await self._run(self._consume(worker, claim, key, limit_key, units))

    async def report_loss(self, worker: Worker | str, claim: Claim, reason: str) -> None:
        """:meth:`RemoteQueue.report_loss`, awaited."""
        await self._run(self._report_loss(worker, claim, reason))

    @atraced_enqueue
    async def enqueue(self, kind: str, payload: Any = None, **options: Any) -> Task:
        """:meth:`RemoteQueue.enqueue`, awaited."""
        return await self._run(self._enqueue(kind, payload, options))

    @atraced_enqueue_many
    async def enqueue_many(self, kind: str, payloads: Iterable[Any], **options: Any) -> list[int]:
        """:meth:`RemoteQueue.enqueue_many`, awaited."""
        return await self._run(self._enqueue_many(kind, payloads, options))

    async def get(self, task_id: int) -> Task:
        """:meth:`RemoteQueue.get`, awaited."""
        return await self._run(self._get(task_id))

    async def dependency_results(self, task_id: int) -> dict[int, Any]:
        """:meth:`RemoteQueue.dependency_results`, awaited."""
        return await self._run(self._dependency_results(task_id))

    async def wait(self, task_id: int, *, timeout: float | None = None) -> Task:
        """:meth:`RemoteQueue.wait`, awaited."""
        return await self._run(self._wait(task_id, timeout))

    async def events(self, task_id: int) -> list[Any]:
        """:meth:`RemoteQueue.events`, awaited."""
        return await self._run(self._events(task_id))

    async def whoami(self) -> dict[str, Any]:
        """:meth:`RemoteQueue.whoami`, awaited."""
        return await self._run(self._whoami())
