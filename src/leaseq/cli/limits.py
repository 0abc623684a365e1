"""``leaseq limits``: the limits shared by every worker, with their usage; set and delete them."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from ..core.errors import NotFound
from .render import make_console
from .session import CliError, emit_json, json_option, open_queue


def register(group: click.Group) -> None:
    """Add ``limits`` (and its ``set`` and ``delete``) to the command group."""
    group.add_command(limits)


def _show(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        emit_json(rows)
        return
    console = make_console()
    if not rows:
        console.print("no limits (set one with `leaseq limits set KEY --max-running N`)")
        return
    table = Table("key", "counts", "running", "max running", "leases", "per second", "burst", "tokens")
    for r in rows:
        table.add_row(r["key"], r["counts"], str(r["running"]), _num(r["max_running"]), str(r["leases"]),
                      _num(r["per_second"]), _num(r["burst"]), _num(r["tokens"]))
    console.print(table)


def _num(value: float | int | None) -> str:
    return "-" if value is None else f"{value:g}"


@click.group(invoke_without_command=True)
@json_option
@click.pass_context
def limits(ctx: click.Context, as_json: bool) -> None:
    """List the limits shared by every worker, with their usage: what live
    leases hold (leases, or units for a limit that counts units) and the
    tokens in each rate bucket, by the database's clock."""
    if ctx.invoked_subcommand is None:
        _show(open_queue(ctx).limits(), as_json)


@limits.command("set")
@click.argument("key")
@click.option("--max-running", type=int, default=None, help="At most this many live leases (or units) at once.")
@click.option("--per-second", type=float, default=None, help="Rate: tokens added to the bucket per second.")
@click.option("--per-minute", type=float, default=None, help="Rate per minute (instead of --per-second).")
@click.option("--burst", type=float, default=None,
              help="Tokens the bucket holds at most (default: one second's worth, at least 1).")
@click.option("--counts", type=click.Choice(["tasks", "units"]), default="tasks", show_default=True,
              help="What a lease costs: 1, or its task's units (a token budget).")
@json_option
@click.pass_context
def set_limit(ctx: click.Context, key: str, max_running: int | None, per_second: float | None,
              per_minute: float | None, burst: float | None, counts: str, as_json: bool) -> None:
    """Create or change the limit KEY (audited). Tasks name it with
    `--limit KEY` (`leaseq enqueue`) or `limits=[KEY]` (`@app.task`)."""
    if per_minute is not None:
        if per_second is not None:
            raise click.UsageError("give --per-second or --per-minute, not both")
        per_second = per_minute / 60.0
    row = open_queue(ctx).set_limit(key, max_running=max_running, per_second=per_second, burst=burst,
                                    counts=counts, via="cli")
    if as_json:
        emit_json(row)
        return
    click.echo(f"limit {key} set")
    _show([row], False)


@limits.command("delete")
@click.argument("key")
@click.pass_context
def delete_limit(ctx: click.Context, key: str) -> None:
    """Remove the limit KEY (audited): tasks naming it are no longer limited by it."""
    try:
        open_queue(ctx).delete_limit(key, via="cli")
    except NotFound as exc:
        raise CliError("key", str(exc), exit_code=exc.cli_exit_code) from None
    click.echo(f"limit {key} deleted")
