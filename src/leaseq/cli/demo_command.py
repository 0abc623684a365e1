"""``leaseq demo``: the story of a stalled worker, on a throwaway database."""

from __future__ import annotations

import sys

import click

from ..core.errors import LeaseqError
from .session import CliError, cli_state


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    group.add_command(demo)


@click.command()
@click.option("--keep", is_flag=True, help="Keep the throwaway database and print its path.")
@click.pass_context
def demo(ctx: click.Context, keep: bool) -> None:
    """Watch a stalled worker lose its lease (a few seconds).

    Worker A stalls past its lease, B recovers the task, and every write A
    tries afterwards is refused; then a side effect with no recorded response
    goes to reconciliation instead of a retry. Runs on a throwaway SQLite file unless the global --dsn is given (then in
    a queue of its own on that database, which it migrates if needed).
    """
    from ..demo import run_demo
    from .render import make_console

    state = cli_state(ctx)
    try:
        status = run_demo(state.dsn, keep=keep, console=make_console(full_rows=False))  # a story in 80 columns
    except LeaseqError as exc:
        raise CliError.from_leaseq(exc) from None
    sys.exit(status)
