"""``leaseq limits``: the limits shared by every worker, with their usage and spend; set and delete them."""

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
    table = Table("key", "counts", "running", "max running", "leases", "per second", "burst", "tokens",
                  "minute", "hour", "day", "spent today")
    for r in rows:
        table.add_row(r["key"], r["counts"], str(r["running"]), _num(r["max_running"]), str(r["leases"]),
                      _num(r["per_second"]), _num(r["burst"]), _num(r["tokens"]),
                      _window(r["minute_used"], r["per_minute"]), _window(r["hour_used"], r["per_hour"]),
                      _window(r["day_used"], r["per_day"]), str(r["spent_today"]))
    console.print(table)


def _window(used: int, total: int | None) -> str:
    """A window's count of its total ("-": no such window)."""
    return "-" if total is None else f"{used}/{total}"


def _num(value: float | int | None) -> str:
    return "-" if value is None else f"{value:g}"


@click.group(invoke_without_command=True)
@json_option
@click.pass_context
def limits(ctx: click.Context, as_json: bool) -> None:
    """List the limits shared by every worker, with their usage: what live
    leases hold (leases, or units for a limit that counts units), the
    tokens in each rate bucket, what each window holds of its total, and
    the usage settled today (ctx.consume), by the database's clock."""
    if ctx.invoked_subcommand is None:
        _show(open_queue(ctx).limits(), as_json)


@limits.command("set")
@click.argument("key")
@click.option("--max-running", type=int, default=None, help="At most this many live leases (or units) at once.")
@click.option("--per-second", type=float, default=None, help="Rate: tokens added to the bucket per second.")
@click.option("--per-minute", type=float, default=None,
              help="Rate per minute (a bucket, instead of --per-second); a total over each minute is "
                   "--total-per-minute.")
@click.option("--burst", type=float, default=None,
              help="Tokens the bucket holds at most (default: one second's worth, at least 1).")
@click.option("--counts", type=click.Choice(["tasks", "units"]), default="tasks", show_default=True,
              help="What a lease costs: 1, or its task's units (a token budget).")
@click.option("--total-per-minute", type=int, default=None, metavar="UNITS",
              help="A total over each minute of the database's clock (a fixed window, not a rate): no claim "
                   "hands out a task once the minute's total is spent; usage settled after the call counts.")
@click.option("--total-per-hour", type=int, default=None, metavar="UNITS", help="A total over each hour.")
@click.option("--total-per-day", type=int, default=None, metavar="UNITS",
              help="A total over each day (UTC).")
@json_option
@click.pass_context
def set_limit(ctx: click.Context, key: str, max_running: int | None, per_second: float | None,
              per_minute: float | None, burst: float | None, counts: str, total_per_minute: int | None,
              total_per_hour: int | None, total_per_day: int | None, as_json: bool) -> None:
    """Create or change the limit KEY (audited). Tasks name it with
    `--limit KEY` (`leaseq enqueue`) or `limits=[KEY]` (`@app.task`)."""
    if per_minute is not None:
        if per_second is not None:
            raise click.UsageError("give --per-second or --per-minute, not both")
        per_second = per_minute / 60.0
    row = open_queue(ctx).set_limit(key, max_running=max_running, per_second=per_second, burst=burst,
                                    counts=counts, per_minute=total_per_minute, per_hour=total_per_hour,
                                    per_day=total_per_day, via="cli")
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


@limits.command("spend")
@click.argument("key", required=False)
@click.option("--days", type=int, default=7, show_default=True, help="How many days back, today included.")
@json_option
@click.pass_context
def spend(ctx: click.Context, key: str | None, days: int, as_json: bool) -> None:
    """The usage settled after the call (ctx.consume) per key and day (UTC),
    newest first: every key, or KEY's, and each day's by tenant (the
    fairness key of the tasks that consumed it; "-": tasks without one)."""
    rows = open_queue(ctx).limit_spend(key, days=days)
    if as_json:
        emit_json(rows)
        return
    console = make_console()
    if not rows:
        console.print("no usage settled" + (f" for {key}" if key else "") + f" in the last {days} days")
        return
    table = Table("day", "key", "units", "by tenant")
    for r in rows:
        table.add_row(r["day"], r["key"], str(r["units"]), _tenants(r["tenants"]))
    console.print(table)


def _tenants(spend: dict[str, int]) -> str:
    """A day's spend by tenant, the largest first ("-": the tasks without a fairness key)."""
    return ", ".join(f"{tenant or '-'} {units}" for tenant, units in sorted(spend.items(), key=lambda kv: -kv[1]))
