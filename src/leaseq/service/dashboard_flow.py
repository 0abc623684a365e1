"""Dashboard pages for flow control: redrive and bulk cancel by filter (``/redrive``), limits
with their windows and spend per day (``/limits``), and each fairness key's share of the
recent claims (``/fairness``).

The redrive page is an operator's: the filter (status, kind, queue, error text, age) is
first counted by a dry run, and only then offered as one form that requeues or cancels the
matching tasks. Both steps go through :func:`leaseq.service.redrive.act_where`, as
``POST /v1/tasks/redrive`` does: the role is checked, a queue-limited token names one of
its queues, and the Queue method audits each task and the whole. The action's form is
checked as the dashboard's other forms are (same origin, the session's CSRF token).
"""

from __future__ import annotations

import hmac
import re
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Path, Request
from fastapi.responses import HTMLResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, QueryParams

from .. import access
from ..core.errors import AccessDenied, InvalidInput, LeaseqError
from ..engine.operator import CANCEL_STATUSES, MAX_BULK, REDRIVE_STATUSES
from ..queue import Queue
from . import stats
from .dashboard import Session, _back, render, same_origin, session
from .redrive import WHERE_ACTIONS, Where, act_where

router = APIRouter(include_in_schema=False)

#: What each bulk action by filter is called on the page.
LABELS = {"redrive": "Requeue", "cancel_where": "Cancel"}
#: Task ids a dry run lists on the page (the count is of all of them).
SHOWN_IDS = 50
#: Filter fields the page carries from the count to the action.
FILTER_FIELDS = ("status", "queue", "kind", "error", "older_than", "limit")
_AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*")
_AGE_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def _queue(request: Request) -> Queue:
    queue: Queue = request.app.state.queue
    return queue


def parse_age(text: str) -> float | None:
    """An age as the form gives it (``90``, ``45s``, ``15m``, ``12h``, ``3d``, ``2w``; empty: none)."""
    if not text.strip():
        return None
    m = _AGE.fullmatch(text)
    if m is None:
        raise InvalidInput("older_than", f"must be an age such as 90, 45s, 15m, 12h or 3d (got {text!r})")
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]


def where_of(params: QueryParams | FormData) -> tuple[Where, dict[str, Any]]:
    """The filter of the page's form (query or posted), checked as far as the form goes (the
    Queue method checks the rest), and the values to show it again with."""
    unknown = sorted(set(params) - {*FILTER_FIELDS, "action", "note", "csrf", "expected"})
    if unknown:
        raise InvalidInput(unknown[0], "unknown field")
    status = [str(v) for v in params.getlist("status") if str(v)]
    text = {name: str(params.get(name) or "").strip() for name in ("queue", "kind", "error", "older_than", "limit")}
    limit_text = text["limit"] or "1000"
    if not limit_text.isdigit():
        raise InvalidInput("limit", f"must be a whole number from 1 to {MAX_BULK} (got {limit_text!r})")
    where = Where(status=status or None, queue=text["queue"] or None, kind=text["kind"] or None,
                  error=text["error"] or None, older_than=parse_age(text["older_than"]), limit=int(limit_text))
    shown = {**text, "limit": limit_text, "status": status}
    return where, shown


def _may(s: Session) -> list[str]:
    """The bulk actions by filter this session's role may take."""
    return [a for a in WHERE_ACTIONS if s.principal.can(a)]


def _page(request: Request, s: Session, *, action: str, shown: dict[str, Any], found: dict[str, Any] | None = None,
          err: str | None = None, status_code: int = 200) -> HTMLResponse:
    q = _queue(request)
    kinds = stats.kinds(q) if s.principal.can("read") else []  # the kinds of every queue: what spans them all
    context: dict[str, Any] = {}
    if err is not None:
        context["err"] = err
    return render("redrive.html", request, s, status_code=status_code, action=action, actions=_may(s),
                  labels=LABELS, shown=shown, found=found, kinds=kinds, shown_ids=SHOWN_IDS,
                  statuses={"redrive": REDRIVE_STATUSES, "cancel_where": CANCEL_STATUSES},
                  queues=sorted(s.principal.queues) if s.principal.queues is not None else None, **context)


@router.get("/redrive", response_class=HTMLResponse)
def redrive_page(request: Request, s: Session = Depends(session)) -> HTMLResponse:
    """The filter; with ``action`` given, the dry run's count and the form that acts on it."""
    if not _may(s):
        return render("error.html", request, s, status_code=403,
                      message=f"the {s.principal.role} role cannot redrive or cancel tasks by filter")
    params = request.query_params
    action = str(params.get("action") or "")
    blank = {"status": ["dead"], "queue": "", "kind": "", "error": "", "older_than": "", "limit": "1000"}
    if not action:  # the form alone, filled from the task list's filter when it came from there
        shown = {**blank, **{k: str(params.get(k) or "") for k in ("queue", "kind") if params.get(k)}}
        if params.get("status"):
            shown["status"] = [str(v) for v in params.getlist("status")]
        return _page(request, s, action=_may(s)[0], shown=shown)
    if action not in WHERE_ACTIONS:
        return _page(request, s, action=_may(s)[0], shown=blank, status_code=422,
                     err=f"action: must be one of {', '.join(WHERE_ACTIONS)} (got {action!r})")
    try:
        where, shown = where_of(params)
    except InvalidInput as exc:
        return _page(request, s, action=action, shown=blank, err=str(exc), status_code=422)
    try:
        found = act_where(_queue(request), s.principal, action, where, dry_run=True, via="dashboard")
    except LeaseqError as exc:
        return _page(request, s, action=action, shown=shown, err=str(exc), status_code=exc.http_status)
    return _page(request, s, action=action, shown=shown, found=found)


@router.post("/redrive/{action}")
async def redrive_action(request: Request, action: str = Path(pattern="^(redrive|cancel_where)$"),
                         csrf: str = Form(""), s: Session = Depends(session)) -> Response:
    """Requeue or cancel the tasks matching the filter the page counted, at most as many as it
    counted (oldest first), with one note for all; each task and the whole audited."""
    same_origin(request)
    if not hmac.compare_digest(csrf.encode(), s.csrf.encode()):
        raise AccessDenied("CSRF check failed: reload the page and try again")
    access.authorize_role(s.principal, action)  # and its queue, with the filter
    form = await request.form()
    back = "/redrive"
    try:
        where, shown = where_of(form)
        back = "/redrive?" + urlencode({"action": action, **{k: v for k, v in shown.items() if v}}, doseq=True)
        expected = str(form.get("expected") or "")
        if not expected.isdigit() or int(expected) < 1:
            raise InvalidInput("expected", "count the matching tasks first (the page's dry run)")
        note = str(form.get("note") or "")
        where = where.model_copy(update={"limit": min(where.limit, int(expected)),
                                          "note": note if note.strip() else None})
        if action == "cancel_where" and where.note is None:
            raise InvalidInput("note", "required field is missing: the reason, recorded in each task's trail")
        done = await run_in_threadpool(act_where, _queue(request), s.principal, action, where, dry_run=False,
                                       via="dashboard")
    except LeaseqError as exc:
        return _back(request, back, err=str(exc))
    moved = done["task_ids"]
    verb = "requeued" if action == "redrive" else "cancelled"
    msg = f"{action}: {len(moved)} of {done['matched']} matching tasks {verb}" + \
          (f" ({', '.join(str(i) for i in moved[:SHOWN_IDS])}{', …' if len(moved) > SHOWN_IDS else ''})"
           if moved else "")
    flash = {"msg": msg}
    if done["skipped"]:
        flash["err"] = f"{len(done['skipped'])} not {verb}: " + ", ".join(str(i) for i in done["skipped"][:SHOWN_IDS])
    return _back(request, back, **flash)



# -- limits: each window and the spend per day ----------------------------------------

#: Days of settled spend the limits page shows, today included.
SPEND_DAYS = 7


@router.get("/limits", response_class=HTMLResponse)
def limits_page(request: Request, s: Session = Depends(session)) -> HTMLResponse:
    """Every limit with its windows (each total and what it holds now) and today's spend, and the
    settled spend per limit and UTC day over the last :data:`SPEND_DAYS` days, with each day's
    split by tenant (at most :data:`~leaseq.service.stats.SPEND_TENANTS` tenants per limit and
    day, the rest summed as one: :func:`~leaseq.service.stats.spend_by_tenant`)."""
    try:
        access.authorize(s.principal, "read")  # limits span every queue
    except LeaseqError as exc:
        return render("error.html", request, s, status_code=exc.http_status, message=str(exc))
    q = _queue(request)
    today = q.now().date()
    days = [(today - timedelta(days=n)).isoformat() for n in range(SPEND_DAYS)]
    spend: dict[str, dict[str, int]] = {}  # key -> day -> units
    split: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (day, key) -> its tenants, largest first
    for row in stats.spend_by_tenant(q, SPEND_DAYS):  # newest day first
        by_day = spend.setdefault(row["key"], {})
        by_day[row["day"]] = by_day.get(row["day"], 0) + row["units"]
        split.setdefault((row["day"], row["key"]), []).append(row)
    tenants = [{"day": day, "key": key, "units": spend[key][day], "tenants": rows}
               for (day, key), rows in split.items()]
    return render("limits.html", request, s, limits=q.limits(), days=days, spend=spend, tenants=tenants,
                  shown=stats.SPEND_TENANTS, other=stats.OTHER_TENANT)


# -- fair share: each key's queued tasks, weight and share of the recent claims -------

#: The most fairness keys the fair-share page reads: the most queued, and the most claimed.
FAIR_KEYS_SHOWN = 50
#: The recent claims it counts: within this many seconds, among the most recent events.
FAIR_WINDOW = 3600.0
FAIR_RECENT_EVENTS = 50_000


def fair_share(q: Queue, principal: access.Principal) -> list[dict[str, Any]]:
    """Per queue that uses fairness keys (of those ``principal`` may read): its keys with the
    most tasks queued and the most claimed in the last :data:`FAIR_WINDOW` seconds (at most
    :data:`FAIR_KEYS_SHOWN` of each), each with its queued tasks, weight, claims and share of
    the queue's claims (``""``: the tasks without a key)."""
    with q.store.transaction() as tx:
        queued = tx.rows("dashboard_fair_queued", limit=FAIR_KEYS_SHOWN)
        claims = tx.rows("dashboard_fair_claims", window=FAIR_WINDOW, recent=FAIR_RECENT_EVENTS,
                         limit=FAIR_KEYS_SHOWN)
    queues: dict[str, dict[str, Any]] = {}

    def entry(queue: str, key: str) -> dict[str, Any]:
        found = queues.setdefault(queue, {"name": queue, "claims": 0, "keys": {}})
        keys: dict[str, dict[str, Any]] = found["keys"]
        return keys.setdefault(key, {"key": key, "queued": None, "weight": None, "claims": 0, "share": None})

    for row in queued:
        e = entry(row["queue"], row["key"])
        e["queued"], e["weight"] = int(row["queued"]), row["weight"]
    for row in claims:
        e = entry(row["queue"], row["key"])
        e["claims"] = int(row["claims"])
        e["share"] = int(row["claims"]) / int(row["queue_claims"])
        queues[row["queue"]]["claims"] = int(row["queue_claims"])
        if e["weight"] is None:
            e["weight"] = row["weight"]
    out = []
    for name in sorted(queues):
        if not principal.may_use_queue(name):
            continue
        found = queues[name]
        for e in found["keys"].values():
            e["weight"] = 1.0 if e["weight"] is None else float(e["weight"])
        found["keys"] = sorted(found["keys"].values(), key=lambda e: (-(e["queued"] or 0), -e["claims"], e["key"]))
        out.append(found)
    return out


@router.get("/fairness", response_class=HTMLResponse)
def fairness_page(request: Request, s: Session = Depends(session)) -> HTMLResponse:
    """The queues that use fairness keys, and each key's queued tasks, weight and share of the
    recent claims."""
    access.authorize(s.principal, "read_queues")
    return render("fairness.html", request, s, queues=fair_share(_queue(request), s.principal),
                  window=FAIR_WINDOW, shown=FAIR_KEYS_SHOWN)
