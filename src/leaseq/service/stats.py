"""The dashboard's reads: task pages (search, keyset paging), workers and their leases,
chart series, and the versions that live updates compare.

Each read runs named queries of ``sql/<dialect>/queries.sql`` (the
``dashboard_*`` blocks) in one read transaction; nothing here writes. A read
given ``queues`` (a queue-limited token's queues, :func:`scope`) reads the rows
of those queues only, in its query: what a page shows, counts and charts for
such a token is its queues' alone. Input
from the query string is checked here and refused with an
:class:`~leaseq.core.errors.InvalidInput` naming the parameter, so a bad
cursor or page size is a 422, never a 500 and never a silently different page.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from .. import access
from ..access import Principal
from ..core import checks
from ..core.errors import InvalidInput
from ..core.model import Task, worker_from_row
from ..queue import Queue

#: Page sizes the task list offers; the largest is the limit.
PAGE_SIZES = (25, 50, 100, 200)
MAX_PAGE = PAGE_SIZES[-1]
MAX_SEARCH = 255  # an idempotency key is at most 255 characters
#: Chart windows: label -> seconds.
WINDOWS = {"15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 24 * 3600}
GROUPINGS = ("kind", "queue")
#: The worker page reads each worker's last event from this many of the newest events.
RECENT_EVENTS = 50_000
MAX_LEASES_SHOWN = 1000
_CURSOR = re.compile(r"[0-9]{1,19}")


_TASK_FIELDS = frozenset(Task.__dataclass_fields__)


def _task(row: dict[str, Any]) -> Task:
    return Task(**{k: v for k, v in row.items() if k in _TASK_FIELDS})


def scope(principal: Principal) -> list[str] | None:
    """The queues ``principal`` reads (a queue-limited token's), or None for every queue
    (:func:`leaseq.access.readable_queues`: a principal that may not list tasks is refused)."""
    return access.readable_queues(principal, None)


def _read(q: Queue, query: str, **params: Any) -> list[dict[str, Any]]:
    with q.store.transaction() as tx:
        return tx.rows(query, **params)


def _cursor(field: str, value: str) -> int:
    # Digits only: "1e3", "-5", " 7" or "0x10" are refused rather than read some other way.
    if not _CURSOR.fullmatch(value) or not 0 < int(value) <= 2**63 - 1:
        raise InvalidInput(field, f"must be a task id, a positive integer (got {value[:40]!r})")
    return int(value)


@dataclass(frozen=True)
class TaskFilter:
    """The task list's query string, checked: filters, a search text, a cursor and a page size."""

    status: str | None = None
    kind: str | None = None
    queue: str | None = None
    search: str | None = None
    before: int | None = None
    after: int | None = None
    limit: int = 50

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> TaskFilter:
        """Read and check the query string; raises :class:`InvalidInput` naming the parameter."""
        unknown = sorted(set(params) - {"status", "kind", "queue", "q", "before", "after", "limit", "msg", "err"})
        if unknown:
            raise InvalidInput(unknown[0][:40], "unknown parameter")
        status = params.get("status") or None
        kind = params.get("kind") or None
        queue = params.get("queue") or None
        search = params.get("q") or None
        if status is not None:
            checks.check_status(status)
        if kind is not None:
            checks.check_kind(kind)
        if queue is not None:
            checks.check_name("queue", queue)
        if search is not None:
            if len(search) > MAX_SEARCH:
                raise InvalidInput("q", f"must be at most {MAX_SEARCH} characters")
            checks.check_storable("q", search)
        before = _cursor("before", params["before"]) if params.get("before") else None
        after = _cursor("after", params["after"]) if params.get("after") else None
        if before is not None and after is not None:
            raise InvalidInput("after", "give before or after, not both")
        raw = params.get("limit") or "50"
        if not raw.isascii() or not raw.isdigit() or len(raw) > 6:
            raise InvalidInput("limit", f"must be a whole number from 1 to {MAX_PAGE} (got {raw[:40]!r})")
        limit = checks.check_int("limit", int(raw), minimum=1, maximum=MAX_PAGE)
        return cls(status, kind, queue, search, before, after, limit)

    def url(self, **changes: Any) -> str:
        """This list's stable URL, with ``changes`` applied (None drops a parameter)."""
        values = {"status": self.status, "kind": self.kind, "queue": self.queue, "q": self.search,
                  "before": self.before, "after": self.after, "limit": self.limit if self.limit != 50 else None}
        values.update(changes)
        query = urlencode({k: v for k, v in values.items() if v is not None})
        return "/tasks" + (f"?{query}" if query else "")


@dataclass(frozen=True)
class TaskPage:
    """One page of tasks, newest first, and the cursors around it."""

    tasks: list[Any]
    #: the URL of the next (older) page, None on the last page
    older: str | None
    #: the URL of the previous (newer) page, None on the first page
    newer: str | None


def task_page(q: Queue, f: TaskFilter, *, queues: list[str] | None = None) -> TaskPage:
    """The page of tasks ``f`` names (of ``queues`` only, when given). Keyset paging on the id: a
    page's URL keeps naming the same tasks (and never skips or repeats one) however many arrive meanwhile."""
    common = {"status": f.status, "kind": f.kind, "queue": f.queue, "queues": queues, "search": f.search,
              "limit": f.limit + 1}
    if f.after is not None:
        rows = _read(q, "dashboard_tasks_newer", after=f.after, **common)
        more_newer = len(rows) > f.limit
        rows = list(reversed(rows[:f.limit]))
        more_older = True  # the cursor came from an older page, so there is one
    else:
        rows = _read(q, "dashboard_tasks_older", before=f.before, **common)
        more_older = len(rows) > f.limit
        rows = rows[:f.limit]
        more_newer = f.before is not None
    tasks = [_task(r) for r in rows]
    older = f.url(before=tasks[-1].id, after=None) if tasks and more_older else None
    newer = None
    if more_newer:
        newer = f.url(after=tasks[0].id, before=None) if tasks else f.url(before=None, after=None)
    return TaskPage(tasks, older, newer)


def kinds(q: Queue, *, queues: list[str] | None = None) -> list[str]:
    """Task kinds in the queue (of ``queues`` only, when given; up to 200), for the filter's choices."""
    return [r["kind"] for r in _read(q, "dashboard_kinds", queues=queues)]


def workers_view(q: Queue, *, queues: list[str] | None = None) -> list[dict[str, Any]]:
    """Every registered worker, revoked or not, with when it was last seen and its live leases.

    Given ``queues``: only the workers that declared a kind on one of them or hold a
    lease there, with those kinds and those leases only.

    "Last seen" is the latest of its registration, its newest event among the
    most recent :data:`RECENT_EVENTS` (claims, completions, failures...) and
    the last renewal of a lease it holds: an idle worker writes nothing, so a
    worker idle for long shows when it last did something.
    """
    with q.store.transaction() as tx:
        workers = tx.rows("dashboard_workers", queues=queues)
        leases = tx.rows("dashboard_worker_leases", queues=queues, limit=MAX_LEASES_SHOWN)
        last = {r["worker_id"]: r["last_event_at"] for r in tx.rows("dashboard_worker_last_events",
                                                                      recent=RECENT_EVENTS)}
    by_owner: dict[str, list[dict[str, Any]]] = {}
    for lease in leases:
        by_owner.setdefault(lease["lease_owner"], []).append(dict(lease, expired=bool(lease["expired"])))
    out = []
    for w in workers:
        held = by_owner.get(w["id"], [])
        seen = [t for t in [w["registered_at"], w["last_heartbeat_at"], last.get(w["id"])]
                + [x["last_heartbeat_at"] or x["claimed_at"] for x in held] if t is not None]
        out.append(dict(w, state=worker_from_row(w).state, last_seen_at=max(seen), live_leases=held))
    # the running ones first, then stopped, then revoked; the most recently seen first in each
    out.sort(key=lambda w: ({"stopped": 1, "revoked": 2}.get(w["state"], 0), -w["last_seen_at"].timestamp()))
    return out


#: The most tenants a limit's spend of one day is split into where a page or a scrape lists them
#: (``/metrics``' ``leaseq_limit_spend``, the limits page): the tenants that settled the most;
#: the rest are summed under :data:`OTHER_TENANT`. A tenant is a fairness key, which anyone who
#: may enqueue chooses: unbounded, every key would be a series of every scrape.
SPEND_TENANTS = 50
#: The tenant under which the rest of a day's spend is summed (a tenant of this very name too).
OTHER_TENANT = "(other)"


def spend_by_tenant(q: Queue, days: int) -> list[dict[str, Any]]:
    """The spend settled per limit key, UTC day (``YYYY-MM-DD``) and tenant over the last ``days``
    days (``key``, ``day``, ``tenant``, ``units``; ``""``: tasks without a fairness key), newest
    day first, each day's largest first: at most :data:`SPEND_TENANTS` tenants per key and day,
    and the rest summed under :data:`OTHER_TENANT` (the rule is the query's, ``limit_spend_top``).
    :meth:`leaseq.Queue.limit_spend` (``leaseq limits spend``) gives every tenant."""
    rows = _read(q, "limit_spend_top", days=days, top=SPEND_TENANTS, other=OTHER_TENANT)
    return [{"key": r["key"], "day": str(r["day"])[:10], "tenant": r["tenant"], "units": int(r["units"])}
            for r in rows]


def unserved_kinds(q: Queue, kinds: list[str]) -> set[str]:
    """Which of ``kinds`` no registered worker has declared it serves (flagged "no worker serves this kind")."""
    if not kinds:
        return set()
    return set(kinds) - {r["kind"] for r in _read(q, "served_kinds")}


def chart_window(value: str | None) -> str:
    """A chart window label (``15m``, ``1h``, ``6h``, ``24h``); raises :class:`InvalidInput` naming ``window``."""
    value = value or "1h"
    if value not in WINDOWS:
        raise InvalidInput("window", f"must be one of {', '.join(WINDOWS)} (got {value[:40]!r})")
    return value


def chart_grouping(value: str | None) -> str:
    """``kind`` or ``queue``; raises :class:`InvalidInput` naming ``by``."""
    value = value or "kind"
    if value not in GROUPINGS:
        raise InvalidInput("by", f"must be one of {', '.join(GROUPINGS)} (got {value[:40]!r})")
    return value


def chart_data(q: Queue, window: str, by: str, *, queues: list[str] | None = None) -> dict[str, Any]:
    """Per-minute series over ``window``, grouped ``by`` kind or queue (of ``queues`` only, when given).

    ``minutes``: the minute starts (epoch seconds), oldest first;
    ``completed`` and ``failed``: ``{group: [count per minute]}`` (failed
    counts failed attempts); ``lost``: leases that expired or were revoked;
    ``depth``: the tasks due and waiting to start at each minute's end;
    ``durations``: per group, the final attempt's claim-to-completion time
    (count, mean and longest, in seconds).
    """
    seconds = WINDOWS[window]
    with q.store.transaction() as tx:
        now = tx.rows("db_now")[0]["now"]
        done = tx.rows("dashboard_completed_by_minute", window=float(seconds), queues=queues)
        bad = tx.rows("dashboard_failures_by_minute", window=float(seconds), queues=queues)
        waiting = tx.rows("dashboard_depth_by_minute", window=float(seconds), queues=queues)
    end = int(now.timestamp()) // 60 * 60
    minutes = list(range(end - seconds + 60, end + 60, 60))
    index = {m: i for i, m in enumerate(minutes)}
    series: dict[str, dict[str, list[int]]] = {"completed": {}, "failed": {}, "lost": {}, "depth": {}}
    durations: dict[str, dict[str, float]] = {}

    def add(kind: str, group: str, minute: float, n: int) -> None:
        i = index.get(int(minute))
        if i is not None:
            series[kind].setdefault(group, [0] * len(minutes))[i] += int(n)

    for r in done:
        add("completed", r[by], r["minute"], r["completed"])
        d = durations.setdefault(r[by], {"count": 0, "sum": 0.0, "max": 0.0})
        d["count"] += int(r["completed"])
        d["sum"] += float(r["seconds_sum"] or 0.0)
        d["max"] = max(d["max"], float(r["seconds_max"] or 0.0))
    for r in bad:
        add("failed" if r["type"] == "failed" else "lost", r[by], r["minute"], r["count"])
    for r in waiting:
        add("depth", r[by], r["minute"], r["depth"])
    stats = {g: {"count": d["count"], "mean": d["sum"] / d["count"] if d["count"] else 0.0, "max": d["max"]}
             for g, d in sorted(durations.items())}
    return {"minutes": minutes, "window": window, "by": by, **{k: dict(sorted(v.items())) for k, v in series.items()},
            "durations": stats}


def version(q: Queue, view: str, params: Mapping[str, str], principal: Principal) -> str:
    """A fingerprint of what ``view`` shows ``principal`` (a queue-limited token: its queues' only);
    live updates send an event when it changes.

    Ages and other clock-driven text are left out, so an idle page stays quiet.
    """
    from .asks import readable_asks
    from .views import readable_overview, readable_tasks

    queues = scope(principal)
    if view == "overview":
        data: Any = [{k: v for k, v in e.items() if k != "oldest_queued_seconds"}
                     for e in readable_overview(q, principal)]
        # limits' usage, not their tokens: a refilling bucket is clock-driven text; limits span
        # every queue, so a queue-limited token is shown none
        limits = q.limits() if principal.can("read") else []
        data.append([(r["key"], r["running"], r["max_running"], r["per_second"], r["burst"]) for r in limits])
    elif view == "tasks":
        f = TaskFilter.parse(params)
        page = task_page(q, f, queues=access.readable_queues(principal, f.queue))
        data = [(t.id, t.status, t.claim_generation, t.attempts, str(t.updated_at)) for t in page.tasks]
        data.append((page.older, page.newer))
    elif view == "task":
        task_id = checks.check_task_id(params.get("id", ""))
        data = _read(q, "dashboard_task_version", task_id=task_id, queues=queues)  # another queue's: as none
    elif view == "workers":
        data = [(w["id"], w["state"], str(w["revoked_at"]), [(x["id"], x["claim_generation"], str(x["lease_expires_at"]))
                                                 for x in w["live_leases"]]) for w in workers_view(q, queues=queues)]
    elif view == "inbox":
        data = [(t.id, t.status, str(t.updated_at)) for status in ("needs_reconciliation", "blocked")
                for t in readable_tasks(q, principal, status=status, limit=200)]
        data.append([(a["task_id"], a["key"]) for a in readable_asks(q, principal, limit=200)])  # the open questions
    else:
        raise InvalidInput("view", "must be one of overview, tasks, task, workers, inbox")
    return hashlib.sha256(json.dumps(data, default=str, sort_keys=True).encode()).hexdigest()[:16]

