"""Operator actions: ``cancel``, ``reconcile``, ``unblock``, ``requeue``, ``pause``, ``resume``,
``revoke-worker`` (built from the action table, :data:`leaseq.access.ACTIONS`), ``signal`` and ``sweep``.

Each goes through :func:`leaseq.access.perform` as the local OS user
(``cli:<user>``): the Queue method checks the transition, records who did it
in the task's evidence trail, and writes the audit entry in the same
transaction. The service's routes and dashboard forms come from the same table.
"""

from __future__ import annotations

from typing import Any

import click
from rich.text import Text

from .. import access
from ..core.model import Task
from .render import cancel_tree_table, make_console, status_text
from ..engine.common import default_actor
from .session import emit_json, json_option, open_queue, parse_json_option

_METAVARS = {"task": "TASK", "queue": "QUEUE", "worker": "WORKER"}


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for spec in access.operator_actions("cli"):
        group.add_command(action_command(spec))
    group.add_command(signal)
    group.add_command(sweep)
    group.add_command(redrive)
    group.add_command(cancel_where)


def action_command(spec: access.Action) -> click.Command:
    """The CLI command of one operator action: an argument for its target, an option per field."""
    params: list[click.Parameter] = [click.Argument(["target"], metavar=_METAVARS[spec.target or ""])]
    for f in spec.fields:
        if f.flag:  # left out: False, the action's default
            params.append(click.Option([f"--{f.name.replace('_', '-')}", f.name], is_flag=True, help=f.help))
            continue
        metavar = "|".join(v for v, _ in f.choices) if f.choices else "JSON" if f.json else None
        # Choices are checked by the Queue (one error line naming the field), not by click.
        # (no default given to click: a left-out option arrives as None, and the action's default applies)
        params.append(click.Option([f"--{f.name.replace('_', '-')}", f.name], required=f.required, metavar=metavar,
                                   help=f.help + (f"  [default: {f.default}]" if f.default else "")))

    def callback(target: str, as_json: bool, **fields: Any) -> None:
        ctx = click.get_current_context()
        given = {name: value for name, value in fields.items() if value is not None}
        for f in spec.fields:
            if f.json and f.name in given:
                given[f.name] = parse_json_option(f.name, given[f.name])
        result = access.perform(open_queue(ctx), access.local_principal(), spec.name, target, via="cli", **given)
        if as_json:
            emit_json(result if result is not None else {"target": target})
        elif spec.name == "cancel" and isinstance(result, dict):  # --tree: the cancel tree's report
            console = make_console()
            console.print(Text.assemble(access.done_message(spec.name, target, **given) + ": now ",
                                        status_text(result["status"])))
            console.print(cancel_tree_table(result))
        elif isinstance(result, Task):
            make_console().print(Text.assemble(access.done_message(spec.name, target, **given) + ": now ",
                                               status_text(result.status)))
        else:
            click.echo(access.done_message(spec.name, target, **given))

    command = click.Command(spec.command, params=params, callback=callback, short_help=spec.title,
                            help=f"{spec.title}.\n\n{spec.help}" if spec.help else f"{spec.title}.")
    return json_option(command)


@click.command()
@click.argument("task_id", metavar="TASK", type=int)
@click.argument("name")
@click.option("--payload", metavar="JSON", default=None,
              help="The signal's payload as JSON (- reads stdin, @path a file); default null.")
@json_option
@click.pass_context
def signal(ctx: click.Context, task_id: int, name: str, payload: str | None, as_json: bool) -> None:
    """Send the signal NAME to a task: its handler's ctx.wait_for_signal(NAME) returns the payload.

    Kept until an attempt waits for it; a task waiting for NAME is claimable at once. Recorded,
    with you as its sender, in the task's evidence trail and the audit log.
    """
    q = open_queue(ctx)
    sent = q.signal(task_id, name, parse_json_option("payload", payload), by=access.local_principal().actor,
                    via="cli")
    if as_json:
        emit_json(sent)
        return
    click.echo(f"signal {name} sent to task {task_id}" + (": it is queued again" if sent["woke"] else ""))


@click.command()
@click.option("--max-queues", metavar="N", default=1000, show_default=True, type=click.IntRange(1, 100_000),
              help="Most queues one pass examines (and sweeps).")
@click.option("--max-passes", metavar="N", default=100, show_default=True, type=click.IntRange(1, 1_000_000),
              help="Most passes: each resumes after the last queue the one before examined, until the last "
                   "queue is reached.")
@click.pass_context
def sweep(ctx: click.Context, max_queues: int, max_passes: int) -> None:
    """Route every expired lease now, in every queue.

    The recovery policy decides where each goes (queued, needs_reconciliation
    or dead). A claim routes its own queue's expired leases, so this is needed
    for a queue no worker claims from (as `leaseq serve` does every
    --sweep-every), or to see it now. Sleepers whose time has come are woken,
    tasks past their deadline expired and old action tokens deleted too.

    Each pass examines at most --max-queues queues, in name order, each in a
    bounded number of transactions; passes follow one another until the last
    queue is reached, or --max-passes have run (the output then says where
    sweeping stopped).
    """
    q = open_queue(ctx)
    routed = passes = 0
    while passes < max_passes:
        routed += q.sweep(max_queues=max_queues)
        passes += 1
        if q.sweep_resumes_after is None:
            break
    click.echo(f"routed {routed} expired lease{'' if routed == 1 else 's'}"
               + ("" if passes == 1 else f" in {passes} passes"))
    if q.sweep_resumes_after is not None:
        click.echo(f"stopped after {passes} passes: queues after {q.sweep_resumes_after!r} are not swept yet "
                   f"(run again, or raise --max-passes or --max-queues)")


def _filter_options(command: Any) -> Any:
    for option in reversed([
        click.option("--status", "statuses", metavar="STATUS", multiple=True,
                     help="Only tasks in this status; repeat for more."),
        click.option("--queue", default=None, help="Only tasks on this queue."),
        click.option("--kind", default=None, help="Only tasks of this kind."),
        click.option("--error", default=None, metavar="TEXT",
                     help="Only tasks whose last error holds this text (case aside)."),
        click.option("--older-than", "older_than", default=None, metavar="AGE",
                     help="Only tasks unchanged for this long (30d, 12h, 15m, 45s)."),
        click.option("--limit", type=int, default=1000, show_default=True,
                     help="At most this many tasks, oldest first (run again for more)."),
        click.option("--dry-run", "dry_run", is_flag=True, default=False,
                     help="Count and list the tasks; change nothing."),
    ]):
        command = option(command)
    return command


def _report(result: dict[str, Any], verb: str, as_json: bool) -> None:
    if as_json:
        emit_json(result)
        return
    ids = ", ".join(str(i) for i in result["task_ids"][:20]) + (", ..." if len(result["task_ids"]) > 20 else "")
    n = len(result["task_ids"])
    if result["dry_run"]:
        click.echo(f"would {verb} {result['matched']} task(s){': ' + ids if ids else ''} (dry run: nothing changed)")
    else:
        click.echo(f"{verb} {n} task(s){': ' + ids if ids else ''}"
                   + (f"; {len(result['skipped'])} skipped" if result["skipped"] else ""))
    if result["more"]:
        click.echo("the limit was reached: more tasks may match (run it again)")


@click.command()
@_filter_options
@click.option("--note", default="redriven", show_default=True, help="Recorded in each task's evidence trail.")
@json_option
@click.pass_context
def redrive(ctx: click.Context, statuses: tuple[str, ...], queue: str | None, kind: str | None,
            error: str | None, older_than: str | None, limit: int, dry_run: bool, note: str,
            as_json: bool) -> None:
    """Requeue dead letters: every dead (or, with --status blocked, blocked) task matching the filter.

    Each is returned to the queue as `leaseq requeue` (dead: a fresh attempt
    budget) or `leaseq unblock` (blocked) would, in one transaction, each
    audited and the whole audited as one redrive. --dry-run counts first.
    """
    from .service import parse_duration

    result = open_queue(ctx).redrive(status=list(statuses) or "dead", queue=queue, kind=kind, error=error,
                                     older_than=parse_duration("older_than", older_than), limit=limit,
                                     dry_run=dry_run, note=note, by=f"cli:{default_actor()}", via="cli")
    _report(result, "requeued" if not dry_run else "requeue", as_json)


@click.command("cancel-where")
@_filter_options
@click.option("--reason", default="cancelled", show_default=True, help="Recorded in each task's evidence trail.")
@json_option
@click.pass_context
def cancel_where(ctx: click.Context, statuses: tuple[str, ...], queue: str | None, kind: str | None,
                 error: str | None, older_than: str | None, limit: int, dry_run: bool, reason: str,
                 as_json: bool) -> None:
    """Cancel every task matching the filter (--status is required).

    Each is cancelled as `leaseq cancel` would (a running holder loses its
    lease), in one transaction, each audited and the whole audited as one
    cancel_where. --dry-run counts first.
    """
    from .service import parse_duration

    result = open_queue(ctx).cancel_where(status=list(statuses), queue=queue, kind=kind, error=error,
                                          older_than=parse_duration("older_than", older_than), limit=limit,
                                          dry_run=dry_run, reason=reason, by=f"cli:{default_actor()}", via="cli")
    _report(result, "cancelled" if not dry_run else "cancel", as_json)
