"""``leaseq migrate``, ``enqueue``, ``ls`` and ``show``."""

from __future__ import annotations

import dataclasses

import click
from rich.text import Text

from ..core import policy
from .render import effects_table, fmt_duration, make_console, status_text, task_details, task_table, timeline
from .session import as_datetime, emit_json, json_option, open_queue, parse_json_option


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for command in (migrate, enqueue, ls, show):
        group.add_command(command)


@click.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create or upgrade the schema (idempotent)."""
    q = open_queue(ctx, need_schema=False)
    applied = q.migrate()
    version = q.schema_version()
    if applied:
        click.echo(f"applied migration(s) {', '.join(map(str, applied))}; schema version {version} ({q.dialect})")
    else:
        click.echo(f"schema is up to date at version {version} ({q.dialect})")


@click.command()
@click.argument("kind")
@click.option("--payload", metavar="JSON", default=None,
              help="The task's input, a JSON document (`-` reads stdin, `@file` a file).")
@click.option("--queue", default="default", show_default=True, help="Queue to add the task to.")
@click.option("--effect", default="read_only", show_default=True,
              help="read_only, idempotent or side_effect: decides how an expired lease is routed.")
@click.option("--key", default=None, help="Idempotency key (stable across attempts; generated if omitted). "
                                          "A second enqueue with the same key returns the existing task.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher is claimed first.")
@click.option("--delay", type=float, default=0.0, show_default=True, help="Seconds before the task is due.")
@click.option("--max-attempts", type=int, default=5, show_default=True)
@click.option("--lease-seconds", type=float, default=policy.DEFAULT_LEASE_SECONDS, show_default=True,
              help="Lease length a claim gets unless the worker asks for another.")
@json_option
@click.pass_context
def enqueue(ctx: click.Context, kind: str, payload: str | None, queue: str, effect: str, key: str | None,
            priority: int, delay: float, max_attempts: int, lease_seconds: float, as_json: bool) -> None:
    """Add a task of KIND to a queue."""
    document = parse_json_option("payload", payload)
    q = open_queue(ctx)
    task = q.enqueue(kind, document, effect=effect, queue=queue, idempotency_key=key, priority=priority,
                     delay=delay, max_attempts=max_attempts, lease_seconds=lease_seconds)
    if as_json:
        emit_json(task)
        return
    line = Text.assemble(f"task {task.id} ", status_text(task.status),
                         Text(f" in {task.queue}: {task.kind} ({task.effect}), key {task.idempotency_key}"))
    wait = (as_datetime(task.available_at) - q.now()).total_seconds()
    if wait > 0:
        line.append(f", due in {fmt_duration(wait)}")
    make_console().print(line, soft_wrap=True)  # one line, so scripts can grep it


@click.command("ls")
@click.option("--status", default=None, help="Only tasks in this status.")
@click.option("--queue", default=None, help="Only tasks of this queue.")
@click.option("--limit", type=int, default=50, show_default=True, help="At most this many, newest first.")
@json_option
@click.pass_context
def ls(ctx: click.Context, status: str | None, queue: str | None, limit: int, as_json: bool) -> None:
    """List tasks, newest first."""
    q = open_queue(ctx)
    tasks = q.list(status=status, queue=queue, limit=limit)
    if as_json:
        emit_json(tasks)
        return
    console = make_console()
    if not tasks:
        console.print("no tasks" + (" matching the filters" if status or queue else ""))
        return
    console.print(task_table(tasks, now=q.now()))


@click.command()
@click.argument("task_id", metavar="TASK")
@json_option
@click.pass_context
def show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Show a task, its evidence trail and effects.

    The evidence trail is a timeline of every transition (claims with their
    generation, lease endings and why, intents, responses, operator actions);
    the effects ledger lists each tool-call intent and its response.
    """
    q = open_queue(ctx)
    task = q.get(task_id)
    events = [dataclasses.replace(e, at=as_datetime(e.at)) for e in q.events(task.id)]
    effects = q.effects(task.id)
    if as_json:
        emit_json({"task": task, "events": events, "effects": effects})
        return
    console = make_console()
    console.print(task_details(task, now=q.now()))
    console.print()
    console.print(Text("evidence trail", style="bold"))
    console.print(timeline(events))
    if effects:
        console.print()
        console.print(Text("effects ledger", style="bold"))
        console.print(effects_table(effects))
