"""``leaseq mcp``: serve the queue to an MCP client over stdio, acting for one token."""

from __future__ import annotations

from pathlib import Path

import click

from .session import CliError, open_queue


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    group.add_command(mcp)


@click.command()
@click.option("--token", metavar="TOKEN", default=None, envvar="LEASEQ_MCP_TOKEN", show_envvar=True,
              help="The queue-issued token the server acts for (`leaseq tokens create --role viewer|operator`), "
                   "best from $LEASEQ_MCP_TOKEN or --token-file: on the command line it is visible to every "
                   "user of the machine (ps), and a warning says so.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Read the token from this file (as `leaseq tokens create --output` writes it).")
@click.pass_context
def mcp(ctx: click.Context, token: str | None, token_file: Path | None) -> None:
    """Serve the queue to an MCP client (an agent, an IDE) over stdio.

    Offers the read views (queue overview, tasks, a task with its evidence
    trail, the reconciliation inbox, workers) and the operator actions, each
    authorized for the token exactly as the HTTP API authorizes it and audited
    under its name. A viewer token reads; an operator token may also act. The
    token is verified again at every call: once it is revoked or expired, the
    call is refused and the server stops.
    Configure your client to run, for example:
    `leaseq --dsn postgresql://… mcp --token-file ~/.config/leaseq/operator.token`.
    """
    if token is not None and ctx.get_parameter_source("token") == click.core.ParameterSource.COMMANDLINE:
        click.echo("warning: --token puts the token on the command line, where every user of this machine "
                   "can read it (ps); use --token-file or $LEASEQ_MCP_TOKEN", err=True)
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise CliError("token-file", exc.strerror or str(exc)) from None
    if not token:
        raise CliError("token", "required: pass --token-file, --token or $LEASEQ_MCP_TOKEN "
                                "(a viewer or operator token from `leaseq tokens create`)")
    from ..mcp_server import run_stdio

    q = open_queue(ctx)
    run_stdio(q, token)  # a token refused at the start ends here, before the client is served
