"""Dashboard pages for looking at the fleet: workers and their leases, and charts.

Reads only (see :mod:`leaseq.service.stats`); the session rules are the
dashboard's (:func:`leaseq.service.dashboard.session`).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from ..core.errors import InvalidInput
from . import charts, stats
from .dashboard import Session, live_view, render, session

router = APIRouter(include_in_schema=False)


@router.get("/workers", response_class=HTMLResponse)
def workers_page(request: Request, s: Session = Depends(session)) -> HTMLResponse:
    """Registered workers, revoked or not, when each was last seen, and the leases each holds."""
    # a queue-limited token: the workers serving or holding leases on its queues, those kinds and leases only
    workers = stats.workers_view(request.app.state.queue, queues=stats.scope(s.principal))
    return render("workers.html", request, s, workers=workers, max_leases=stats.MAX_LEASES_SHOWN,
                  live=live_view(request, s, "workers"))


@router.get("/charts", response_class=HTMLResponse)
def charts_page(request: Request, s: Session = Depends(session)) -> HTMLResponse:
    """Throughput, failures and durations per minute over a window, by kind or by queue (SVG, no script)."""
    unknown = sorted(set(request.query_params) - {"window", "by"})
    if unknown:
        raise InvalidInput(unknown[0][:40], "unknown parameter")
    window = stats.chart_window(request.query_params.get("window"))
    by = stats.chart_grouping(request.query_params.get("by"))
    data = stats.chart_data(request.app.state.queue, window, by, queues=stats.scope(s.principal))
    per = f"per minute, by {by}"
    return render(
        "charts.html", request, s, window=window, by=by, windows=list(stats.WINDOWS), groupings=stats.GROUPINGS,
        completed=charts.stacked_bars(data["minutes"], data["completed"], title=f"completed tasks {per}",
                                      unit="completed"),
        completed_legend=charts.legend(list(data["completed"])),
        failed=charts.stacked_bars(data["minutes"], data["failed"], title=f"failed attempts {per}", unit="failed"),
        failed_legend=charts.legend(list(data["failed"])),
        lost=charts.stacked_bars(data["minutes"], data["lost"], title=f"leases expired or revoked {per}",
                                 unit="leases"),
        lost_legend=charts.legend(list(data["lost"])),
        durations=charts.duration_bars(data["durations"], title=f"claim to completion by {by}"),
        totals={k: sum(sum(v) for v in data[k].values()) for k in ("completed", "failed", "lost")})
