"""Operator actions: ``cancel``, ``reconcile``, ``unblock``, ``requeue``, ``pause``, ``resume``, ``sweep``.

Each is one call of :class:`leaseq.Queue`, which checks the transition and
records who did it in the task's evidence trail.
"""

from __future__ import annotations

import click
from rich.text import Text

from ..core.model import Task
from .render import make_console, status_text
from .session import emit_json, json_option, open_queue, parse_json_option


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for command in (cancel, reconcile, unblock, requeue, pause, resume, sweep):
        group.add_command(command)


def _report(task: Task, verb: str, as_json: bool) -> None:
    if as_json:
        emit_json(task)
    else:
        make_console().print(Text.assemble(f"task {task.id} {verb}: now ", status_text(task.status)))


@click.command()
@click.argument("task_id", metavar="TASK")
@click.option("--reason", required=True, help="Why; recorded in the evidence trail.")
@json_option
@click.pass_context
def cancel(ctx: click.Context, task_id: str, reason: str, as_json: bool) -> None:
    """Cancel a task. A running holder loses its lease at its next guarded call."""
    _report(open_queue(ctx).cancel(task_id, reason=reason), "cancelled", as_json)


@click.command()
@click.argument("task_id", metavar="TASK")
@click.option("--outcome", required=True, metavar="completed|requeue|cancel",
              help="completed: the action did happen; requeue: it did not, run again with the same keys; "
                   "cancel: give up.")
@click.option("--note", required=True, help="What you checked; recorded in the evidence trail.")
@click.option("--result", metavar="JSON", default=None, help="The task's result, with --outcome completed.")
@json_option
@click.pass_context
def reconcile(ctx: click.Context, task_id: str, outcome: str, note: str, result: str | None, as_json: bool) -> None:
    """Resolve a needs_reconciliation task.

    Check the outside world first (did the action happen?), then record the
    outcome and a note; open intents are marked reconciled.
    """
    document = parse_json_option("result", result)
    _report(open_queue(ctx).reconcile(task_id, outcome=outcome, note=note, result=document), "reconciled", as_json)


@click.command()
@click.argument("task_id", metavar="TASK")
@click.option("--note", required=True, help="What was repaired; recorded in the evidence trail.")
@json_option
@click.pass_context
def unblock(ctx: click.Context, task_id: str, note: str, as_json: bool) -> None:
    """Return a blocked task to the queue.

    Use it once the missing or revoked credential is repaired.
    """
    _report(open_queue(ctx).unblock(task_id, note=note), "unblocked", as_json)


@click.command()
@click.argument("task_id", metavar="TASK")
@click.option("--note", default="requeued by operator", show_default=True, help="Recorded in the evidence trail.")
@json_option
@click.pass_context
def requeue(ctx: click.Context, task_id: str, note: str, as_json: bool) -> None:
    """Return a dead task to the queue, with a fresh attempt budget."""
    _report(open_queue(ctx).requeue(task_id, note=note), "requeued", as_json)


@click.command()
@click.argument("queue")
@click.pass_context
def pause(ctx: click.Context, queue: str) -> None:
    """Turn QUEUE's off-switch on.

    A paused queue hands out no claims, and running tasks may start no new
    effects; actions already in flight finish and are recorded.
    """
    open_queue(ctx).pause(queue)
    click.echo(f"queue {queue} paused: no new claims or effects; actions in flight may finish")


@click.command()
@click.argument("queue")
@click.pass_context
def resume(ctx: click.Context, queue: str) -> None:
    """Turn QUEUE's off-switch off."""
    open_queue(ctx).resume(queue)
    click.echo(f"queue {queue} resumed")


@click.command()
@click.pass_context
def sweep(ctx: click.Context) -> None:
    """Route every expired lease now.

    The recovery policy decides where each goes (queued, needs_reconciliation
    or dead); every claim does this too, so this is only needed to see it now.
    """
    routed = open_queue(ctx).sweep()
    click.echo(f"routed {routed} expired lease{'' if routed == 1 else 's'}")
