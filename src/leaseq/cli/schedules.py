"""``leaseq schedules``: an app's schedules, their next slot and the last slot's task."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from ..queue import Queue
from ..schedules import last_task
from .render import fmt_time, make_console, status_text
from .session import cli_state, connect_checked, emit_json, json_option, open_queue
from .worker import load_app


def register(group: click.Group) -> None:
    """Add ``schedules`` to the command group."""
    group.add_command(schedules)


def _queue(ctx: click.Context, app: Any) -> Queue:
    """The app's database: ``--dsn``/``$LEASEQ_DSN`` when given, else the one the app names."""
    state = cli_state(ctx)
    if state.dsn is None and app.dsn is not None:
        queue = connect_checked(app.dsn)
        ctx.call_on_close(queue.close)
        return queue
    return open_queue(ctx)


@click.command()
@click.argument("app_spec", metavar="MODULE:APP")
@json_option
@click.pass_context
def schedules(ctx: click.Context, app_spec: str, as_json: bool) -> None:
    """List the schedules MODULE:APP declares (e.g. myapp:app): each one's next slot,
    and the task of its latest slot (looked up by the slot's key), if enqueued."""
    app = load_app(app_spec)
    q = _queue(ctx, app)
    now = q.now()
    rows = []
    for schedule in app.schedules:
        slot, task = last_task(q, schedule, now)
        rows.append({**schedule.to_dict(), "next_slot": schedule.next_slot(now), "last_slot": slot,
                     "last_key": None if slot is None else schedule.key(slot),
                     "last_task": task})
    if as_json:
        emit_json(rows)
        return
    console = make_console()
    if not rows:
        console.print(f"{app_spec} declares no schedules")
        return
    table = Table("name", "kind", "schedule", "queue", "next slot", "last slot", "task", "status")
    for schedule, row in zip(app.schedules, rows):
        task = row["last_task"]
        table.add_row(row["name"], row["kind"], schedule.spec, row["queue"], fmt_time(row["next_slot"]),
                      fmt_time(row["last_slot"]), "-" if task is None else str(task["id"]),
                      "not enqueued" if task is None else status_text(task["status"]))
    console.print(table)
