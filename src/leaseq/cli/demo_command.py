"""``leaseq demo``: the story of a stalled worker, on a throwaway database."""

from __future__ import annotations

import sys

import click

from ..core.errors import LeaseqError
from .session import CliError, CliState


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    group.add_command(demo)


@click.command()
@click.option("--keep", is_flag=True, help="Keep the throwaway database and print its path.")
@click.pass_context
def demo(ctx: click.Context, keep: bool) -> None:
    """Watch a stalled worker lose its lease and be refused (a few seconds).

    Runs on a throwaway SQLite file unless the global --dsn is given (then in
    a queue of its own on that database).
    """
    from ..demo import run_demo

    state = ctx.find_object(CliState)
    try:
        status = run_demo(state.dsn, keep=keep)
    except LeaseqError as exc:
        raise CliError.from_leaseq(exc) from None
    sys.exit(status)
