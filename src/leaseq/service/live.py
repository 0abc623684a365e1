"""Live updates for the dashboard: a server-sent event stream and the small script that reads it.

``GET /live?view=<page>&v=<version>&...`` is an ``text/event-stream``
authenticated by the dashboard session, like every page. It checks, every
``live_interval`` seconds, a fingerprint of what the page shows
(:func:`leaseq.service.stats.version`) and sends ``event: change`` when it
differs from the version the page was rendered with; the script
(``/static/live.js``, served from the package: no CDN) then fetches the page
again and swaps its live regions. A stream ends after ``live_stream_seconds``
(``event: reconnect``; the script opens a new one, which checks the session
again), or with ``event: end`` when the session is over, so a revoked token
stops streaming within one stream's length at most, and a service that is
shutting down never waits long for an open stream.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from importlib import resources

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from .. import access
from ..core.errors import InvalidInput, LeaseqError, NotFound, RateLimited
from . import stats
from .dashboard import COOKIE, LoginRequired, Session, session
from .wakeups import WorkSignal

router = APIRouter(include_in_schema=False)
VIEWS = ("overview", "tasks", "task", "workers", "inbox")
_VERSION = re.compile(r"[0-9a-f]{16}")
#: Sent every so often on a quiet stream, so proxies keep the connection open.
KEEPALIVE_SECONDS = 15.0


def _script() -> bytes:
    return resources.files("leaseq.service").joinpath("static", "live.js").read_bytes()


@router.get("/static/live.js")
def live_script(request: Request) -> Response:
    """The dashboard's live-update script (no session needed: it holds no data)."""
    if not request.app.state.settings.live_updates:
        raise NotFound("live updates are off")
    return Response(_script(), media_type="text/javascript; charset=utf-8",
                    headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


def _params(request: Request) -> tuple[str, str, dict[str, str]]:
    query = dict(request.query_params)
    view = query.pop("view", "")
    seen = query.pop("v", "")
    if view not in VIEWS:
        raise InvalidInput("view", f"must be one of {', '.join(VIEWS)} (got {view[:40]!r})")
    if seen and not _VERSION.fullmatch(seen):
        raise InvalidInput("v", "must be a version the dashboard gave (16 hex digits)")
    if view != "task":
        query.pop("id", None)
    # the task list checks its own parameters (stats.TaskFilter); the other views take none but id
    extra = sorted(set(query) - {"id"}) if view != "tasks" else []
    if extra:
        raise InvalidInput(extra[0][:40], "unknown parameter")
    return view, seen, query


def _live_session(request: Request) -> Session | None:
    # Not the pages' redirect: a stream opened just after the session ended must not
    # clear the cookie behind the page's back; the page's next load says why it ended.
    try:
        return session(request)
    except LoginRequired:
        return None


@router.get("/live")
async def live(request: Request, s: Session | None = Depends(_live_session)) -> Response:
    """The page's change events (``text/event-stream``); 204 (stop) without a live session."""
    settings = request.app.state.settings
    if not settings.live_updates:
        raise NotFound("live updates are off")
    if s is None:
        return Response(status_code=204)  # EventSource does not reconnect after a 204
    view, seen, params = _params(request)
    q = request.app.state.queue
    # Computed before the stream starts, so a bad filter or task id is a 4xx, not a broken stream.
    first = await run_in_threadpool(stats.version, q, view, params, s.principal)
    session_id = request.cookies.get(COOKIE, "")
    # A stream is one of the token's waiting requests: refused (429, Retry-After) past
    # its cap before it starts; held from its first event to its last.
    signal: WorkSignal = request.app.state.work_signal
    token_id = s.principal.token_id
    signal.check_room(token_id)

    async def events() -> AsyncIterator[str]:
        request.app.state.live_streams += 1
        try:
            with signal.slot(token_id):
                async for event in _changes(request, view, params, seen or first, first, session_id, s.principal):
                    yield event
        except RateLimited as exc:  # another stream took the last slot meanwhile: the page tries again later
            yield f"retry: {int(exc.retry_after * 1000)}\n\nevent: reconnect\ndata: \n\n"
        finally:
            # Counted down only once no database call of this stream is in flight: the
            # thread-pool calls it awaits are not abandoned when the stream is cancelled.
            request.app.state.live_streams -= 1

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _changes(request: Request, view: str, params: dict[str, str], last: str, current: str,
                   session_id: str, principal: access.Principal) -> AsyncIterator[str]:
    """The events of one stream: a change when the page's version moves, until it is time to reconnect."""
    settings = request.app.state.settings
    q = request.app.state.queue
    started = quiet_since = time.monotonic()
    yield "retry: 2000\n\n"
    while True:
        if current != last:
            last = current
            quiet_since = time.monotonic()
            yield f"event: change\ndata: {current}\n\n"
        elif time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
            quiet_since = time.monotonic()
            yield ": still here\n\n"
        if time.monotonic() - started > settings.live_stream_seconds:
            yield "event: reconnect\ndata: \n\n"
            return
        await asyncio.sleep(settings.live_interval)
        if await request.is_disconnected():
            return
        if not await request.app.state.work_signal.paced(principal.token_id, time.monotonic() + settings.live_interval):
            continue  # the token's rate bucket is empty: this look is skipped
        try:
            await run_in_threadpool(access.verify_session, q, session_id)
            current = await run_in_threadpool(stats.version, q, view, params, principal)
        except access.Unauthorized:
            yield "event: end\ndata: session ended\n\n"
            return
        except LeaseqError:
            continue  # the database is away for now (or the task was pruned): try again next tick
