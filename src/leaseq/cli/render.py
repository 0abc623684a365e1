"""rich renderings of tasks, evidence trails, effects, stats and workers.

Everything that came from a user or a database (kinds, payloads, errors,
notes) goes into :class:`rich.text.Text` objects, never through console
markup, so a payload like ``[red]`` prints as written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from ..core.model import Effect, Event, Task
from .session import as_datetime

STATUS_STYLES = {
    "queued": "cyan",
    "running": "yellow",
    "completed": "green",
    "cancelled": "dim",
    "dead": "red",
    "needs_reconciliation": "magenta",
    "blocked": "red",
}

#: Which detail fields of each event type the timeline shows (``--json`` shows all).
_EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "enqueued": ("kind", "effect", "queue", "priority"),
    "claimed": ("attempt", "lease_seconds"),
    "lease_expired": ("reason", "routed_to", "open_intents", "heartbeats", "longest_heartbeat_gap"),
    "lease_released": ("reason", "routed_to", "open_intents", "heartbeats"),
    "lease_revoked": ("reason",),
    "effect_intent": ("action", "idempotency_key"),
    "effect_response": ("action",),
    "completed": ("attempt", "heartbeats", "longest_heartbeat_gap"),
    "failed": ("error", "next_status", "retry_at", "error_streak"),
    "retry_requested": ("reason", "after", "retry_at", "snoozes"),
    "diverged": ("idempotency_key", "recorded", "requested", "code_version"),
    "deadline_passed": ("deadline_at", "previous_status"),
    "cancelled": ("by", "reason", "previous_status", "revoked_lease_of", "open_intents"),
    "child_spawned": ("child_task_id", "kind", "queue"),
    "children_awaited": ("children", "outcome", "waited_seconds", "child_task_id", "status"),
    "tree_cancelled": ("by",),
    "reconciled": ("by", "outcome", "note", "settled_intents"),
    "unblocked": ("by", "note"),
    "requeued": ("by", "note", "previous_attempts"),
}

#: Longest JSON document shown in full by the human views.
MAX_SHOWN_JSON = 2000

#: The width tables get when stdout is not a terminal: wide enough that no row
#: wraps, so ``leaseq ls | grep needs_reconciliation`` sees whole words. Rich
#: sizes a table by its content, so narrow tables stay narrow.
PIPE_WIDTH = 100_000


def make_console(*, full_rows: bool = True, **options: Any) -> Console:
    """A console that never interprets markup or highlights numbers in user data.

    With ``full_rows`` (the default), output that is not a terminal (a pipe,
    a file) is never wrapped or folded: each table row stays on one line.
    On a terminal, tables fit its width as usual.
    """
    console = Console(highlight=False, **options)
    if full_rows and "width" not in options and not console.is_terminal:
        console = Console(highlight=False, width=PIPE_WIDTH, **options)
    return console


def status_text(status: str) -> Text:
    """A status, coloured."""
    status = str(getattr(status, "value", status))
    return Text(status, style=STATUS_STYLES.get(status, ""))


def fmt_time(value: Any) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM:SS.mmm`` UTC, or ``-``."""
    value = as_datetime(value)
    if not isinstance(value, datetime):
        return "-"
    return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}"


def fmt_duration(seconds: float | None) -> str:
    """A duration for people: ``0.42s``, ``12.0s``, ``3m05s``, ``2h03m``, ``4d03h``."""
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else ""
    s = abs(float(seconds))
    if s < 10:
        return f"{sign}{s:.2f}s"
    if s < 60:
        return f"{sign}{s:.1f}s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{sign}{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{sign}{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def fmt_json(value: Any, *, limit: int = MAX_SHOWN_JSON) -> str:
    """A JSON document on one line, cut at ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > limit:
        return f"{text[:limit]}… ({len(text)} characters; use --json for all)"
    return text


def _since(now: datetime | None, then: Any) -> float | None:
    then = as_datetime(then)
    if now is None or not isinstance(then, datetime):
        return None
    return (now - then).total_seconds()


def _table(*columns: tuple[str, JustifyMethod]) -> Table:
    """A listing table with these (name, justification) columns, long values folded."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")
    return table


def task_table(tasks: Iterable[Task], *, now: datetime | None = None) -> Table:
    """The ``leaseq ls`` table."""
    table = _table(("id", "right"), ("queue", "left"), ("kind", "left"), ("status", "left"),
                   ("effect", "left"), ("gen", "right"), ("tries", "right"), ("age", "right"))
    for t in tasks:
        table.add_row(str(t.id), Text(t.queue), Text(t.kind), status_text(t.status), Text(str(t.effect)),
                      str(t.claim_generation), f"{t.attempts}/{t.max_attempts}",
                      fmt_duration(_since(now, t.created_at)))
    return table


def task_details(task: Task, *, now: datetime | None = None) -> Table:
    """The task part of ``leaseq show``: one field per line."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(f"task {task.id}", Text.assemble(Text(task.kind, style="bold"), "  ", status_text(task.status)))
    grid.add_row("queue", Text(f"{task.queue}   effect {task.effect}   priority {task.priority}"))
    grid.add_row("idempotency key", Text(task.idempotency_key))
    grid.add_row("generation", Text(f"{task.claim_generation}   attempts {task.attempts}/{task.max_attempts}"
                                    f"   default lease {task.lease_seconds:g}s"))
    if task.code_version is not None:  # App(version=...): the code it started under
        grid.add_row("code version", Text(task.code_version))
    if task.lease_owner:
        left = _since(as_datetime(task.lease_expires_at), now) if now else None
        expiry = fmt_time(task.lease_expires_at)
        if left is not None:
            expiry += (f" (in {fmt_duration(left)})" if left >= 0 else
                       f" (expired {fmt_duration(-left)} ago; the next claim or `leaseq sweep` routes it)")
        grid.add_row("lease", Text(f"held by {task.lease_owner} until {expiry}"))
        beats = f"{task.heartbeat_count}"
        if task.heartbeat_count:
            beats += (f", last {fmt_time(task.last_heartbeat_at)}, longest gap "
                      f"{fmt_duration(task.longest_heartbeat_gap)}")
        grid.add_row("heartbeats", Text(beats))
    grid.add_row("created", Text(fmt_time(task.created_at)))
    grid.add_row("available", Text(fmt_time(task.available_at)))
    budgets = [f"timeout {fmt_duration(task.timeout_seconds)}" if task.timeout_seconds is not None else "",
               f"deadline {fmt_time(task.deadline_at)}" if task.deadline_at is not None else "",
               f"retries on request {task.snoozes}" if task.snoozes else ""]
    if any(budgets):
        grid.add_row("budgets", Text("   ".join(b for b in budgets if b)))
    spent, budget = task.spent or {}, task.budget or {}
    if spent or budget:  # usage settled after the call (ctx.consume), of the task's budget
        grid.add_row("spent", Text("   ".join(
            f"{key} {spent.get(key, 0)}" + (f" of {budget[key]}" if key in budget else "")
            for key in sorted(set(spent) | set(budget)))))
    if task.open_effects:
        grid.add_row("open intents", Text(str(task.open_effects), style="magenta"))
    grid.add_row("payload", Text(fmt_json(task.payload)))
    if task.result is not None:
        grid.add_row("result", Text(fmt_json(task.result)))
    if task.last_error:
        grid.add_row("last error", Text(task.last_error, style="red"))
    return grid


def event_summary(event: Event, *, names: Mapping[str, str] | None = None) -> Text:
    """One event's worker and its most telling detail fields, as one line of text."""
    detail = event.detail or {}
    keys = _EVENT_FIELDS.get(event.type, tuple(detail))
    parts = []
    for key in keys:
        value = detail.get(key)
        if value is None or value == [] or (key in ("open_intents", "longest_heartbeat_gap") and not value):
            continue
        if isinstance(value, (int, float)) and key.endswith(("seconds", "gap")):
            value = f"{value:g}s"
        elif isinstance(value, list) and all(isinstance(v, str) and v and "," not in v for v in value):
            value = ",".join(value)  # keys and names: no JSON quotes, so a narrow column breaks no word
        elif not isinstance(value, str):
            value = json.dumps(value, ensure_ascii=False)
        parts.append(f"{key}={value}")
    text = Text()
    if event.worker_id:
        text.append((names or {}).get(event.worker_id, event.worker_id), style="bold")
        if parts:
            text.append("  ")
    text.append("  ".join(parts))
    return text


def timeline(events: Iterable[Event], *, names: Mapping[str, str] | None = None) -> Table:
    """A task's evidence trail: time since the first event, generation, event, who and what."""
    events = list(events)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("gen", justify="right", no_wrap=True)
    table.add_column("event", no_wrap=True)
    table.add_column("worker / detail", overflow="fold")
    start = as_datetime(events[0].at) if events else None
    for e in events:
        since = _since(as_datetime(e.at), start)
        style = STATUS_STYLES.get(e.type, "red" if e.type.startswith("lease_") else "")
        table.add_row(f"+{fmt_duration(since)}", "" if e.generation is None else str(e.generation),
                      Text(e.type, style=style), event_summary(e, names=names))
    return table


def effects_table(effects: Iterable[Effect]) -> Table:
    """A task's action ledger: each tool-call intent, under which generation, and its response."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("id", "gen", "action", "status", "key / response"):
        table.add_column(name, overflow="fold", justify="right" if name in ("id", "gen") else "left")
    for fx in effects:
        style = {"pending": "magenta", "done": "green", "reconciled": "cyan"}.get(fx.status, "")
        detail = Text(fx.idempotency_key)
        if fx.response is not None:
            detail.append("\n" + fmt_json(fx.response, limit=300))
        table.add_row(str(fx.id), str(fx.generation), Text(fx.action), Text(fx.status, style=style), detail)
    return table


_DISPOSITION_STYLE = {"completed": "green", "unknown": "magenta", "not_started": "cyan"}


def cancel_tree_table(report: Mapping[str, Any]) -> Table:
    """``leaseq cancel --tree``: each child, intent and open effect of a cancelled task with its
    disposition (completed, unknown, not_started), and each durable wait that ended with it."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("task", "parent", "what", "kind / action", "was", "now", "disposition"):
        table.add_column(name, overflow="fold", justify="right" if name in ("task", "parent") else "left")

    def disposition(value: str | None) -> Text:
        return Text(value or "", style=_DISPOSITION_STYLE.get(value or "", ""))

    table.add_row(str(report["task_id"]), "", "task", "", status_text(report["previous_status"]),
                  status_text(report["status"]), "")
    for c in report.get("children", []):
        table.add_row(str(c["task_id"]), str(c["parent_id"]), Text("  " * (c.get("depth", 1) - 1) + "child"),
                      Text(c["kind"]), status_text(c["previous_status"]), status_text(c["status"]),
                      disposition(c["disposition"]))
    for i in report.get("intents", []):
        table.add_row(str(i["task_id"]), str(i["parent_task_id"]), "intent", Text(i["kind"]),
                      status_text(i["previous_status"]), status_text(i["status"]), disposition(i["disposition"]))
    for e in report.get("effects", []):
        table.add_row(str(e["task_id"]), "", f"effect {e['effect_id']}", Text(f"{e['action']} ({e['effect']})"),
                      Text("pending", style="magenta"), "", disposition(e["disposition"]))
    for w in report.get("waits", []):
        what = w["waiting_for"]
        if w.get("children"):
            what += " " + ", ".join(str(c) for c in w["children"])
        elif w.get("signal"):
            what += " " + str(w["signal"])
        table.add_row(str(w["task_id"]), "", "wait", Text(what), status_text("waiting"), status_text("cancelled"),
                      "")
    return table


def stats_table(rows: Iterable[Mapping[str, Any]], paused: set[str]) -> Table:
    """``leaseq stats``: counts by queue and status, oldest queued age, unrouted expired leases."""
    table = _table(("queue", "left"), ("status", "left"), ("count", "right"),
                   ("oldest queued", "right"), ("expired leases", "right"))
    for r in rows:
        queue = Text(r["queue"])
        if r["queue"] in paused:
            queue.append(" (paused)", style="red")
        oldest = r.get("oldest_queued_seconds")
        table.add_row(queue, status_text(r["status"]), str(r["count"]),
                      fmt_duration(oldest) if oldest is not None else "",
                      str(r["expired_leases"]) if r.get("expired_leases") else "")
    return table


_WORKER_STYLE = {"alive": "green", "late": "yellow", "lost": "red", "stopped": "dim", "revoked": "red",
                 "unknown": "dim"}


def workers_table(workers: Iterable[Any]) -> Table:
    """``leaseq workers``: identities issued by the queue, their state and the leases each holds."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("id", "name", "state", "last heartbeat", "registered", "leases", "kinds", "stop reason"):
        table.add_column(name, overflow="fold", justify="right" if name == "leases" else "left")
    for w in workers:
        state = Text(w.state or "", style=_WORKER_STYLE.get(w.state or "", ""))
        when = w.revoked_at if w.state == "revoked" else w.stopped_at if w.state == "stopped" else None
        if when is not None:
            state.append(f" {fmt_time(when)}", style="dim")
        table.add_row(Text(w.id), Text(w.name), state,
                      fmt_time(w.last_heartbeat_at) if w.last_heartbeat_at else "", fmt_time(w.registered_at),
                      str(w.leases), Text(", ".join(w.kinds or [])), Text(w.stop_reason or ""))
    return table


def queues_table(rows: Iterable[Mapping[str, Any]]) -> Table:
    """``leaseq queues``: each queue's off-switch and its task counts."""
    table = _table(("queue", "left"), ("state", "left"), ("tasks", "right"), ("queued", "right"),
                   ("running", "right"), ("oldest queued", "right"))
    for r in rows:
        state = Text("paused", style="red") if r["paused"] else Text("running", style="green")
        if r.get("changed_by"):
            state.append(f" by {r['changed_by']}", style="dim")
        table.add_row(Text(r["queue"]), state, str(r["tasks"]), str(r["queued"]), str(r["running"]),
                      fmt_duration(r["oldest_queued_seconds"]) if r["oldest_queued_seconds"] is not None else "")
    return table
