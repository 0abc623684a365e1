"""``leaseq mcp``: serve the queue to an MCP client over stdio, acting for one token."""

from __future__ import annotations

from pathlib import Path

import click

from .session import CliError, open_queue


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    group.add_command(mcp)


@click.command()
@click.option("--token", metavar="TOKEN", default=None,
              help="The queue-issued token the server acts for (`leaseq tokens create --role viewer|operator`). "
                   "Prefer the environment variable or --token-file: a command line is visible to other users.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Read the token from this file (as `leaseq tokens create --output` writes it).")
@click.pass_context
def mcp(ctx: click.Context, token: str | None, token_file: Path | None) -> None:
    """Serve the queue to an MCP client (an agent, an IDE) over stdio.

    Offers the read views (queue overview, tasks, a task with its evidence
    trail, the reconciliation inbox, workers) and the operator actions, each
    authorized for the token exactly as the HTTP API authorizes it and audited
    under its name. A viewer token reads; an operator token may also act.
    Configure your client to run, for example:
    `leaseq --dsn postgresql://… mcp --token-file ~/.config/leaseq/operator.token`.
    """
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise CliError("token-file", exc.strerror or str(exc)) from None
    if not token:
        raise CliError("token", "required: pass --token-file, --token or $LEASEQ_MCP_TOKEN "
                                "(a viewer or operator token from `leaseq tokens create`)")
    from .. import auth
    from ..mcp_server import build_server

    q = open_queue(ctx)
    principal = auth.verify_token(q, token)  # refused tokens end here, before the client is served
    build_server(q, principal).run("stdio")
