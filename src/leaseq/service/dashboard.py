"""Server-rendered dashboard: queues, tasks, the evidence timeline, the inbox (reconciliation, questions) and approvals.

Login: a token (viewer or better) is entered once in a form; the service
answers with a session of its own (:func:`leaseq.access.create_session`), kept
in an HttpOnly, SameSite=Strict cookie (Secure over HTTPS). The browser never
holds the API token. Every page re-checks the session in the database, so
logout, expiry and revoking the token end it on every replica.

A token limited to some queues (``--queue``) sees and acts on its queues only:
every page, count, chart and live stream reads its queues' rows alone (the
scoped reads of :mod:`leaseq.service.stats` and :mod:`leaseq.service.views`),
a task of another queue is a 404 exactly as one that does not exist, and what
spans every queue (limits, revoking a worker) is not offered.

Forms are posted only from the dashboard itself: a POST whose
``Sec-Fetch-Site`` is not ``same-origin``, or whose ``Origin`` is another
origin or ``null``, is refused, and each form carries a CSRF token: the login
form a double-submit token (a cookie set with the form, echoed in a field),
the others one derived from the session (see
:func:`leaseq.service.access.csrf_token`). The action forms and their POST routes
are built from the action table (:data:`leaseq.access.ACTIONS`):
:func:`leaseq.access.authorize` decides, and :func:`leaseq.access.perform`
acts, writing the audit entry in the action's own transaction.

Flash messages (an action's outcome, "logged out", why a session ended) never
travel in the URL, so a crafted link cannot make the dashboard say anything:
an action's redirect sets a short-lived cookie holding its message, signed
with a key derived from the session (:func:`flash_value`), and the next page
of that session shows it once and deletes it. Another session, or a cookie
tossed in from elsewhere, fails the signature and shows nothing. The login
page, which has no session to sign with, takes only a code naming one of its
own fixed notices (:data:`LOGIN_NOTICES`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Form, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from .. import access
from ..core import checks
from ..core.errors import InvalidInput, LeaseqError, NotFound
from ..queue import Queue
from .access import Access, client_address, csrf_token
from .asks import answer_from_form, form_of, open_question, present_ask, readable_asks
from . import charts, stats
from ..engine.approvals import digest_of
from .views import (ATTENTION, OTHER_ENDINGS, STATUSES, attention_counts, present_approval, present_effect,
                    present_task, readable_approvals, readable_overview, readable_tasks, task_timeline)

router = APIRouter(include_in_schema=False)
COOKIE = "leaseq_session"
#: The login form's double-submit CSRF cookie (sent to /login only).
LOGIN_COOKIE = "leaseq_login"
#: An action's outcome, signed for the session, shown once by the next page (see :func:`flash_value`).
FLASH_COOKIE = "leaseq_flash"
#: The code of one of the login page's fixed notices (:data:`LOGIN_NOTICES`), sent to /login only.
NOTICE_COOKIE = "leaseq_notice"
#: Seconds a flash message or login notice waits for the page that shows it.
FLASH_SECONDS = 300
#: Longest encoded flash cookie value: browsers keep cookies of up to 4096 bytes.
FLASH_MAX_CHARS = 3000
#: The login page's notices, by the code its cookie carries: (kind, text); no other text is shown.
LOGIN_NOTICES: dict[str, tuple[str, str]] = {
    "logged-out": ("msg", "logged out"),
    "ended": ("err", "session ended (logged out, replaced, or its token revoked): log in again"),
    "session-expired": ("err", "session ended: it expired: log in again"),
    "token-revoked": ("err", "session ended: the token it was made from was revoked"),
    "token-expired": ("err", "session ended: the token it was made from has expired"),
    "refused": ("err", "session ended: this token may not use the dashboard (a role without read): "
                       "log in with another token"),
}
INBOX_STATUSES = ("needs_reconciliation", "blocked")
_HEADERS = {
    # Scripts only from the service itself (the live-update script), and only it may be fetched.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "script-src 'self'; connect-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    # "same-origin", not "no-referrer": under no-referrer a browser sends
    # "Origin: null" with the dashboard's own forms, and the origin check needs it.
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def _age(seconds: Any) -> str:
    if seconds is None:
        return "–"
    s = int(float(seconds))
    if s < 60:
        return f"{float(seconds):.1f}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _when(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return str(value)
    when: datetime = value
    return when.strftime("%Y-%m-%d %H:%M:%S.") + f"{when.microsecond // 1000:03d}"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


_env = Environment(loader=PackageLoader("leaseq.service", "templates"), autoescape=select_autoescape(["html"]),
                   trim_blocks=True, lstrip_blocks=True)
_env.filters.update(age=_age, when=_when, pretty=_pretty)
#: The dashboard's action forms, from the action table.
TASK_ACTIONS = [a for a in access.operator_actions("dashboard") if a.target == "task"]
QUEUE_ACTIONS = [a for a in access.operator_actions("dashboard") if a.target == "queue"]
WORKER_ACTIONS = [a for a in access.operator_actions("dashboard") if a.target == "worker"]
#: Actions the task list offers on the ticked tasks, with one note for all.
BULK_ACTIONS = [a for a in TASK_ACTIONS if a.bulk]
#: Dashboard actions by the path segment that names them (the verb, else the name).
_BY_SEGMENT = {a.verb or a.name: a for a in access.operator_actions("dashboard")}
#: Most tasks one bulk form may name.
MAX_BULK = 200
_env.globals.update(task_actions=TASK_ACTIONS, queue_actions=QUEUE_ACTIONS, worker_actions=WORKER_ACTIONS,
                    bulk_actions=BULK_ACTIONS)


class LoginRequired(Exception):
    """No valid session: the browser is sent to the login form, with the code of a notice saying why."""

    def __init__(self, notice: str = "", *, clear: bool = False):
        assert not notice or notice in LOGIN_NOTICES, notice
        super().__init__(notice)
        self.notice = notice
        self.clear = clear


def _set_notice(request: Request, response: Response, notice: str) -> None:
    """Have the login page show one of its fixed notices, once."""
    response.set_cookie(NOTICE_COOKIE, notice, httponly=True, samesite="strict", path="/login",
                        secure=_secure(request), max_age=FLASH_SECONDS)


def login_redirect(request: Request, exc: Exception) -> Response:
    """Exception handler: redirect to /login, dropping a dead session cookie."""
    assert isinstance(exc, LoginRequired)
    response = RedirectResponse("/login", status_code=303)
    if exc.notice:
        _set_notice(request, response, exc.notice)
    if exc.clear:
        response.delete_cookie(COOKIE, path="/")
    return response


def _ended(exc: access.Unauthorized) -> str:
    """The login notice for a session that failed verification."""
    text = str(exc)
    for part, notice in (("was revoked", "token-revoked"), ("has expired", "token-expired"),
                         ("session expired", "session-expired")):
        if part in text:
            return notice
    return "ended"


def _flash_mac(session_id: str, payload: str) -> str:
    key = hashlib.sha256(session_id.encode()).digest()
    return hmac.new(key, b"leaseq dashboard flash\0" + payload.encode(), hashlib.sha256).hexdigest()


def flash_value(session_id: str, messages: dict[str, str], *, now: float | None = None) -> str:
    """The flash cookie's value: the messages and when they were made, signed with the session's key.

    Long messages are cut (ending in "…") to keep the cookie within what browsers store."""
    at = int(time.time() if now is None else now)
    limit = 1000
    while True:
        cut = {k: v if len(v) <= limit else v[:limit - 1] + "…" for k, v in messages.items()}
        raw = json.dumps({"at": at, **cut}, ensure_ascii=False, separators=(",", ":")).encode()
        payload = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        if len(payload) <= FLASH_MAX_CHARS - 65 or limit <= 50:
            return f"{payload}.{_flash_mac(session_id, payload)}"
        limit //= 2


def read_flash(session_id: str, value: str, *, now: float | None = None) -> dict[str, str]:
    """The messages of a flash cookie made for this session and not yet stale, else none."""
    payload, _, mac = value.partition(".")
    if not mac or not hmac.compare_digest(mac.encode(), _flash_mac(session_id, payload).encode()):
        return {}
    try:
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        return {}
    current = time.time() if now is None else now
    if not isinstance(data, dict) or not isinstance(data.get("at"), int) or \
            not 0 <= current - data["at"] <= FLASH_SECONDS:
        return {}
    return {k: v for k, v in data.items() if k in ("msg", "err") and isinstance(v, str)}


@dataclass(frozen=True)
class Session:
    """A verified dashboard session."""

    principal: access.Principal
    csrf: str


def _refusal(principal: access.Principal) -> str | None:
    """Why ``principal`` may not use the dashboard (None: it may): a role that may not list its
    queues' tasks (:func:`leaseq.access.authorize_role` decides). A queue-limited token may: the
    pages read its queues only."""
    try:
        access.authorize_role(principal, "read_queues")
    except access.AccessDenied:
        return f"the {principal.role} role cannot use the dashboard"
    return None


def session(request: Request) -> Session:
    """Dependency: the verified session of the cookie, or a redirect to the login form."""
    session_id = request.cookies.get(COOKIE)
    if not session_id:
        raise LoginRequired()
    gate: Access = request.app.state.access
    try:
        principal = gate.verify_session(session_id, client_address(request))
    except access.Unauthorized as exc:
        raise LoginRequired(_ended(exc), clear=True) from None
    if _refusal(principal) is not None:
        raise LoginRequired("refused", clear=True)
    return Session(principal, csrf_token(session_id))


def same_origin(request: Request) -> None:
    """Refuse a form posted from anywhere but the dashboard itself.

    Browsers say where a request comes from: ``Sec-Fetch-Site`` must be
    ``same-origin`` when sent, and ``Origin`` must name this host (and HTTPS
    when the request came over HTTPS) when sent; ``Origin: null`` (a sandboxed
    frame, a ``data:`` page) is refused. Another port on the same host is
    another origin. A POST with neither header is refused: browsers send
    them, and the CSRF token alone cannot stop a login CSRF whose attacker
    plants the double-submit cookie from another port of the same host.
    """
    site = request.headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        raise access.AccessDenied(f"form posted from another site (Sec-Fetch-Site: {site})")
    origin = request.headers.get("origin")
    if origin is None:
        if site is None:
            raise access.AccessDenied("form posted without an Origin header: post it from the dashboard page")
        return
    parts = urlsplit(origin) if origin != "null" else None
    if (parts is None or parts.netloc != request.headers.get("host", "")
            or parts.scheme not in ("http", "https") or (request.url.scheme == "https" and parts.scheme != "https")):
        raise access.AccessDenied(f"form posted from another origin ({origin})")


def operator_session(request: Request, csrf: str = Form(""), s: Session = Depends(session)) -> Session:
    """Dependency for POST actions: same origin, matching CSRF token, and the action authorized."""
    same_origin(request)
    if not hmac.compare_digest(csrf.encode(), s.csrf.encode()):
        raise access.AccessDenied("CSRF check failed: reload the page and try again")
    path = request.path_params
    spec = _BY_SEGMENT.get(path.get("action", ""))
    # The route's own pattern is checked after the dependencies run: check here that the
    # action fits the route (a queue action on a task's route, a bulk route for a single action).
    target = "queue" if "name" in path else "worker" if "worker_id" in path else "task"
    if (spec is None or not spec.dashboard or spec.target != target
            or (not {"task_id", "name", "worker_id"} & set(path) and not spec.bulk)):
        raise NotFound("no such action")
    access.authorize_role(s.principal, spec.name)  # and each target in full, by access.perform
    return s


def _queue(request: Request) -> Queue:
    queue: Queue = request.app.state.queue
    return queue


def live_view(request: Request, s: Session, view: str, **params: str) -> dict[str, Any] | None:
    """What a page tells the live-update script: its view, its data's version (as the session's
    token sees it) and its task id."""
    if not request.app.state.settings.live_updates:
        return None
    query = dict(request.query_params) if view == "tasks" else {}
    query.update(params)
    return {"view": view, "version": stats.version(_queue(request), view, query, s.principal),
            "id": params.get("id")}


def render(name: str, request: Request, s: Session | None, status_code: int = 200, **context: Any) -> HTMLResponse:
    """Render a template with the shared context (session, flash messages, live-update view).

    The flash messages are the session's own (its signed cookie, shown once, then deleted) or the
    context's; never the URL's."""
    values: dict[str, Any] = {"session": s, "request": request, "msg": None, "err": None, "live": None,
                              "waiting": None}
    flash = request.cookies.get(FLASH_COOKIE) if s is not None else None
    if flash:
        values.update(read_flash(request.cookies.get(COOKIE, ""), flash))
    if s is not None:  # the counts beside the pages that list tasks waiting for a person
        waiting = {status: 0 for status in ATTENTION}
        for row in _queue(request).stats():  # per queue and status: a queue-limited token counts its own
            if row["status"] in waiting and s.principal.may_use_queue(row["queue"]):
                waiting[row["status"]] += int(row["count"])
        values["waiting"] = waiting
    values.update(context)
    html = _env.get_template(name).render(**values)
    response = HTMLResponse(html, status_code=status_code, headers=_HEADERS)
    if flash:  # shown once: a reload shows nothing
        response.delete_cookie(FLASH_COOKIE, path="/", secure=_secure(request), httponly=True, samesite="strict")
    return response


def _back(request: Request, target: str, **flash: str) -> RedirectResponse:
    """Redirect to ``target`` (on this service), the messages in the session's flash cookie, not the URL."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        target = "/"  # never redirect off the service
    response = RedirectResponse(target, status_code=303)
    if flash:
        response.set_cookie(FLASH_COOKIE, flash_value(request.cookies.get(COOKIE, ""), flash), httponly=True,
                            samesite="strict", path="/", secure=_secure(request), max_age=FLASH_SECONDS)
    return response


# -- login ----------------------------------------------------------------------------

def _secure(request: Request) -> bool:
    return request.url.scheme == "https" or request.app.state.settings.secure_cookies


def _login_page(request: Request, status_code: int = 200, err: str | None = None) -> HTMLResponse:
    # A fresh double-submit token with every form: the cookie only goes back to /login.
    token = secrets.token_urlsafe(32)
    context: dict[str, Any] = {"csrf": token, "err": err}
    notice = request.cookies.get(NOTICE_COOKIE)
    if err is None and notice in LOGIN_NOTICES:  # one of the page's own texts, named by code, shown once
        kind, text = LOGIN_NOTICES[notice]
        context[kind] = text
    response = render("login.html", request, None, status_code=status_code, **context)
    response.set_cookie(LOGIN_COOKIE, token, httponly=True, samesite="strict", path="/login",
                        secure=_secure(request), max_age=3600)
    if notice is not None:
        response.delete_cookie(NOTICE_COOKIE, path="/login", secure=_secure(request), httponly=True,
                               samesite="strict")
    return response


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> HTMLResponse:
    return _login_page(request)


@router.post("/login")
def login(request: Request, token: str = Form(""), csrf: str = Form("")) -> Response:
    same_origin(request)
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not hmac.compare_digest(csrf.encode(), expected.encode()):
        return _login_page(request, 403, "the login form expired or was not posted from this page: try again")
    gate: Access = request.app.state.access
    try:
        principal = gate.authenticate(token.strip(), client_address(request))
    except LeaseqError as exc:
        return _login_page(request, 401, str(exc))
    refused = _refusal(principal)
    if refused is not None:
        return _login_page(request, 403, refused)
    settings = request.app.state.settings
    session_id = access.create_session(gate.queue, principal, seconds=settings.session_seconds)
    response = RedirectResponse("/", status_code=303, headers={"Cache-Control": "no-store"})
    response.set_cookie(COOKIE, session_id, httponly=True, samesite="strict", path="/",
                        secure=_secure(request), max_age=int(settings.session_seconds))
    response.delete_cookie(LOGIN_COOKIE, path="/login", secure=_secure(request), httponly=True, samesite="strict")
    return response


@router.post("/logout")
def logout(request: Request, s: Session = Depends(session), csrf: str = Form("")) -> Response:
    same_origin(request)
    if not hmac.compare_digest(csrf.encode(), s.csrf.encode()):
        raise access.AccessDenied("CSRF check failed")
    access.end_session(request.app.state.access.queue, request.cookies.get(COOKIE, ""))
    response = RedirectResponse("/login", status_code=303)
    _set_notice(request, response, "logged-out")
    response.delete_cookie(COOKIE, path="/")
    response.delete_cookie(FLASH_COOKIE, path="/")
    return response


# -- pages ----------------------------------------------------------------------------

def glance(q: Queue, queues: list[dict[str, Any]], principal: access.Principal) -> dict[str, Any]:
    """The overview's last hour at a glance: per-minute throughput, failures and lost leases
    (sparklines and totals), and the queue depth over it and now; of ``principal``'s queues."""
    data = stats.chart_data(q, "1h", "queue", queues=stats.scope(principal))
    minutes = data["minutes"]
    out: dict[str, Any] = {}
    for key, unit, colour in (("completed", "completed", charts.PALETTE[0]), ("failed", "failed attempts",
                                                                               charts.PALETTE[3]),
                              ("lost", "leases lost", charts.PALETTE[1])):
        per_minute = [sum(series[i] for series in data[key].values()) for i in range(len(minutes))]
        out[key] = {"total": sum(per_minute), "rate": sum(per_minute) / 60,
                    "chart": charts.sparkline(minutes, per_minute, title=f"{unit} per minute, last hour",
                                              unit=unit, colour=colour)}
    ages = [e["oldest_queued_seconds"] for e in queues if e["oldest_queued_seconds"] is not None]
    depth = [sum(series[i] for series in data["depth"].values()) for i in range(len(minutes))]
    out["depth"] = {"queued": sum(e["counts"]["queued"] for e in queues),
                    "running": sum(e["counts"]["running"] for e in queues),
                    "oldest": max(ages) if ages else None, "most": max(depth, default=0),
                    "chart": charts.sparkline(minutes, depth, title="tasks due and waiting to start, last hour",
                                              unit="waiting", colour=charts.PALETTE[2])}
    return out


@router.get("/", response_class=HTMLResponse)
def overview(request: Request, s: Session = Depends(session)) -> HTMLResponse:
    q = _queue(request)
    queues = readable_overview(q, s.principal)  # a queue-limited token: its queues only
    limits = q.limits() if s.principal.can("read") else []  # limits span every queue
    return render("overview.html", request, s, queues=queues, limits=limits, statuses=STATUSES,
                  glance=glance(q, queues, s.principal), attention=attention_counts(queues),
                  other_endings=OTHER_ENDINGS, live=live_view(request, s, "overview"))


@router.get("/tasks", response_class=HTMLResponse)
def tasks_page(request: Request, s: Session = Depends(session)) -> Response:
    """The task list: filters, a search of keys and ids, keyset paging; a bad parameter is a 422."""
    f = stats.TaskFilter.parse(request.query_params)
    if f.search is not None and not s.principal.read_payloads:
        # idempotency keys are hidden from this token: which tasks a piece of text matches would give them away
        if f.search.strip().isdigit():
            return RedirectResponse(f"/tasks/{int(f.search)}", status_code=303)
        return render("error.html", request, s, status_code=403,
                      message="this token may not read payloads, so it searches by task id only")
    q = _queue(request)
    # a queue-limited token: its queues' tasks only (another queue named: refused, as by the API)
    page = stats.task_page(q, f, queues=access.readable_queues(s.principal, f.queue))
    bulk = [a for a in BULK_ACTIONS if s.principal.can(a.name)]
    unserved = stats.unserved_kinds(q, sorted({t.kind for t in page.tasks if t.status == "queued"}))
    return render("tasks.html", request, s, tasks=[present_task(t, s.principal) for t in page.tasks], page=page,
                  unserved=unserved,
                  f=f, statuses=STATUSES, kinds=stats.kinds(q, queues=stats.scope(s.principal)), page_sizes=stats.PAGE_SIZES, bulk=bulk,
                  here=f.url(),  # back to this very page after a bulk action, without old flash messages
                  live=live_view(request, s, "tasks"))


@router.get("/tasks/{task_id}", response_class=HTMLResponse)
def task_page(request: Request, task_id: int = Path(ge=1, le=2**63 - 1), s: Session = Depends(session)) -> HTMLResponse:
    q = _queue(request)
    try:
        access.authorize(s.principal, "read_task", task=task_id, facts=access.QueueFacts(q))
        task = q.get(task_id)
    except access.AccessDenied:  # a task outside the token's queues is refused as one that does not exist
        return render("error.html", request, s, status_code=404, message=f"task {task_id} does not exist")
    except LeaseqError as exc:
        return render("error.html", request, s, status_code=404, message=str(exc))
    view = task_timeline(task, q.events(task_id), q.effects(task_id), s.principal, q.stream_stats(task_id))
    # the digest an approval from this page is bound to: only for a reader who sees the payload
    digest = digest_of(task) if task.status == "awaiting_approval" and s.principal.read_payloads else None
    unserved = stats.unserved_kinds(q, [task.kind] if task.status == "queued" else [])
    try:  # the approval request and its decision, a fact of the task beside its lease
        approval = present_approval(q.approval(task_id), s.principal)
    except NotFound:
        approval = None
    generations = {a["generation"]: a for a in view["attempts"]}
    return render("task.html", request, s, live=live_view(request, s, "task", id=str(task_id)), digest=digest,
                  unserved=unserved, approval=approval, generations=generations, **view)


@router.get("/inbox", response_class=HTMLResponse)
def inbox(request: Request, s: Session = Depends(session)) -> HTMLResponse:
    q = _queue(request)
    items = []
    for status in INBOX_STATUSES:  # a queue-limited token: its queues' tasks only
        for task in readable_tasks(q, s.principal, status=status, limit=200):
            open_fx = [present_effect(fx, s.principal) for fx in q.effects(task.id) if fx.status == "pending"]
            items.append({"task": present_task(task, s.principal), "open_effects": open_fx})
    # the questions handlers put to a person (ctx.ask), each with a form built from its schema
    questions = [{"ask": present_ask(a, s.principal), "form": form_of(a["schema"])}
                 for a in readable_asks(q, s.principal, limit=200)]
    return render("inbox.html", request, s, items=items, questions=questions,
                  may_answer=s.principal.can("answer"), live=live_view(request, s, "inbox"))


@router.get("/approvals", response_class=HTMLResponse)
def approvals_page(request: Request, s: Session = Depends(session)) -> HTMLResponse:
    """The approvals inbox: each task awaiting approval with its payload, digest and requester."""
    items = [{"approval": present_approval(a, s.principal), "task": present_task(a.task, s.principal)}
             for a in readable_approvals(_queue(request), s.principal, limit=200) if a.task is not None]
    return render("approvals.html", request, s, items=items)


# -- actions (authorized, CSRF-checked), one form and route per entry of the action table --

def _choice(actions: list[access.Action]) -> str:
    return "^(" + "|".join(a.verb or a.name for a in actions) + ")$"


async def _act(request: Request, s: Session, action: str, target: Any, default_back: str) -> RedirectResponse:
    form = await request.form()
    back = str(form.get("back") or default_back)
    spec = access.ACTIONS[action]
    given: dict[str, Any] = {}
    try:
        for f in spec.fields:
            value = form.get(f.name)
            if f.flag or value is None or (str(value).strip() == "" and not f.required):
                continue  # not offered on the form, or left empty: the action's default
            given[f.name] = checks.parse_json_text(f.name, str(value)) if f.json else value
        await run_in_threadpool(access.perform, _queue(request), s.principal, action, target, via="dashboard", **given)
    except LeaseqError as exc:
        return _back(request, back, err=str(exc))
    return _back(request, back, msg=access.done_message(action, target, **given))


def _bulk(q: Queue, s: Session, action: str, ids: list[str], note: str) -> tuple[list[str], list[str]]:
    """Check every id first (a bad one refuses the whole form, changing nothing), then act on each."""
    if not ids:
        raise InvalidInput("ids", "tick at least one task")
    if len(ids) > MAX_BULK:
        raise InvalidInput("ids", f"at most {MAX_BULK} tasks at once (got {len(ids)})")
    targets = list(dict.fromkeys(checks.check_task_id(i) for i in ids))
    spec = access.ACTIONS[action]
    [text] = [f for f in spec.fields if not f.json and not f.flag and not f.choices]  # the one note the form offers
    checks.check_text(text.name, note)  # once for all, not once per task
    given = {text.name: note} if note.strip() else {}
    if text.required and not given:
        raise InvalidInput(text.name, "required field is missing: one note for all the ticked tasks")
    outcomes = access.perform_many(q, s.principal, action, targets, via="dashboard", **given)
    done = [str(o.target) for o in outcomes if o.error is None]
    refused = [f"task {o.target}: {o.error}" for o in outcomes if o.error is not None]
    return done, refused


@router.post("/bulk/{action}")
async def bulk_action(request: Request, action: str = Path(pattern=_choice(BULK_ACTIONS)),
                      s: Session = Depends(operator_session)) -> Response:
    """One action, with one note, on every ticked task; each authorized and audited on its own."""
    form = await request.form()
    back = str(form.get("back") or "/tasks")
    ids = [str(v) for v in form.getlist("ids")]
    note = str(form.get("note") or "")
    done, refused = await run_in_threadpool(_bulk, _queue(request), s, action, ids, note)
    flash: dict[str, str] = {}
    if done:
        flash["msg"] = f"{action}: {len(done)} of {len(done) + len(refused)} tasks done ({', '.join(done[:50])}" + \
                       (", …)" if len(done) > 50 else ")")
    if refused:
        shown = refused[:20] + ([f"and {len(refused) - 20} more"] if len(refused) > 20 else [])
        flash["err"] = f"{action} refused for {len(refused)} task(s): " + "; ".join(shown)
    return _back(request, back, **flash)


@router.post("/tasks/{task_id}/answer")
async def answer_question(request: Request, task_id: int = Path(ge=1, le=2**63 - 1), csrf: str = Form(""),
                          s: Session = Depends(session)) -> Response:
    """Answer a task's question from its form in the inbox: the form's fields become the JSON
    answer, which the queue checks against the question's schema (a bad one: the error, nothing
    changed). Authorized as ``answer`` (an operator who may read payloads), for this task."""
    same_origin(request)
    if not hmac.compare_digest(csrf.encode(), s.csrf.encode()):
        raise access.AccessDenied("CSRF check failed: reload the page and try again")
    form = {k: str(v) for k, v in (await request.form()).items()}
    back = form.get("back") or "/inbox"
    q = _queue(request)

    def answering() -> dict[str, Any]:
        access.authorize(s.principal, "answer", task=task_id, facts=access.QueueFacts(q))
        asked = open_question(q, task_id)
        if asked is None:
            raise InvalidInput("task_id", f"task {task_id} has asked no question")
        return q.answer(task_id, answer_from_form(asked["schema"], form), by=s.principal.actor, via="dashboard")

    try:
        answered = await run_in_threadpool(answering)
    except LeaseqError as exc:
        return _back(request, back, err=str(exc))
    if answered["woke"]:
        request.app.state.work_signal.wake(q.get(task_id).queue)
    return _back(request, back, msg=f"task {task_id} answered: it runs again with your answer")


@router.post("/tasks/{task_id}/signal")
async def send_signal(request: Request, task_id: int = Path(ge=1, le=2**63 - 1), csrf: str = Form(""),
                      s: Session = Depends(session)) -> Response:
    """Send a task a signal from its page: a name and a JSON payload (left empty: none), what
    ``ctx.wait_for_signal(name)`` returns. Authorized as ``signal`` (an operator, within its queues)
    for this task; a bad name or payload is refused naming the field, and nothing changes. The
    sender recorded is the session's principal."""
    same_origin(request)
    if not hmac.compare_digest(csrf.encode(), s.csrf.encode()):
        raise access.AccessDenied("CSRF check failed: reload the page and try again")
    access.authorize_role(s.principal, "signal")  # and this task's queue, below
    form = {k: str(v) for k, v in (await request.form()).items()}
    back = form.get("back") or f"/tasks/{task_id}"
    q = _queue(request)

    def sending() -> dict[str, Any]:
        access.authorize(s.principal, "signal", task=task_id, facts=access.QueueFacts(q))
        text = form.get("payload", "")
        payload = checks.parse_json_text("payload", text) if text.strip() else None
        return q.signal(task_id, form.get("name", ""), payload, by=s.principal.actor, via="dashboard")

    try:
        sent = await run_in_threadpool(sending)
    except LeaseqError as exc:
        return _back(request, back, err=str(exc))
    if sent["woke"]:
        request.app.state.work_signal.wake(q.get(task_id).queue)
    woke = "it runs again" if sent["woke"] else "kept until the task waits for it"
    return _back(request, back, msg=f"signal {sent['name']!r} sent to task {task_id}: {woke}")


@router.post("/tasks/{task_id}/{action}")
async def task_action(request: Request, task_id: int = Path(ge=1, le=2**63 - 1),
                      action: str = Path(pattern=_choice(TASK_ACTIONS)),
                      s: Session = Depends(operator_session)) -> Response:
    return await _act(request, s, action, task_id, "/tasks")


@router.post("/queues/{name}/{action}")
async def queue_action(request: Request, name: str = Path(pattern=r"^[A-Za-z0-9_.:\-]{1,100}$"),
                       action: str = Path(pattern=_choice(QUEUE_ACTIONS)),
                       s: Session = Depends(operator_session)) -> Response:
    return await _act(request, s, action, name, "/")


@router.post("/workers/{worker_id}/{action}")
async def worker_action(request: Request, worker_id: str = Path(pattern=r"^[A-Za-z0-9_.:\-]{1,200}$"),
                        action: str = Path(pattern=_choice(WORKER_ACTIONS)),
                        s: Session = Depends(operator_session)) -> Response:
    return await _act(request, s, _BY_SEGMENT[action].name, worker_id, "/workers")
