"""The ``leaseq`` command group and its entry point.

Commands live in sibling modules listed in :data:`COMMAND_MODULES`; each has
a ``register(group)`` function. To add a module (say ``cli/worker.py``),
add its name to that tuple: one line. See the package docstring.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from ..core.errors import LeaseqError, install_line
from .session import CliError, CliState, one_line

#: Sibling modules whose ``register(group)`` adds commands, in help order.
COMMAND_MODULES = (
    "tasks",             # migrate, enqueue, ls, show
    "operator_actions",  # cancel, reconcile, unblock, requeue, approve, deny, pause, resume, sweep
    "approvals",         # approvals
    "asks",              # asks, answer
    "overview",          # stats, workers, queues
    "demo_command",      # demo
    "worker",            # worker
    "schedules",         # schedules
    "limits",            # limits (list, set, delete)
    "service",           # serve, tokens, prune
    "roles",             # roles (create, list, revoke)
    "mcp_command",       # mcp
    "chaos",             # chaos
)


#: Top-level modules of each optional extra: a command that needs a missing one
#: says which extra to install instead of failing with an import error.
EXTRA_MODULES = {
    "server": ("fastapi", "starlette", "uvicorn", "jinja2", "multipart", "python_multipart", "prometheus_client"),
    "client": ("urllib3",),
    "mcp": ("mcp", "pydantic", "anyio"),
}


class LeaseqGroup(click.Group):
    """A click group that turns library errors into one ``error:`` line, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LeaseqError as exc:
            raise CliError.from_leaseq(exc) from None
        except ModuleNotFoundError as exc:
            raise missing_extra(exc) from None


def missing_extra(exc: ModuleNotFoundError) -> Exception:
    """The one-line error for a dependency of an optional extra that is not installed."""
    top = (exc.name or "").split(".")[0]
    for extra, modules in EXTRA_MODULES.items():
        if top in modules:
            return CliError(extra, f"this command needs the {extra} extra ({top} is not installed); "
                                   f"{install_line(extra)}")
    return exc


def add_envvars(command: click.Command, path: tuple[str, ...] = ()) -> None:
    """Give every option an environment variable, shown in ``--help``.

    ``LEASEQ_<COMMAND>_<OPTION>`` (``LEASEQ_WORKER_CONCURRENCY``,
    ``LEASEQ_TOKENS_CREATE_ROLE``), and ``LEASEQ_<OPTION>`` for the global
    ones (``LEASEQ_DSN``). A value on the command line wins over the variable.
    """
    for param in command.params:
        if not isinstance(param, click.Option) or param.name in ("help", "version"):
            continue
        if param.envvar is None:
            flag = max(param.opts, key=len).lstrip("-")
            param.envvar = "_".join(("LEASEQ", *path, flag)).upper().replace("-", "_")
        param.show_envvar = True
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            add_envvars(sub, (*path, name))


@click.group(cls=LeaseqGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--dsn", metavar="DSN", default=None, envvar="LEASEQ_DSN",
              help="Database: postgresql://… or sqlite:///file.db. Default: $LEASEQ_DSN, else "
                   "sqlite:///leaseq.db in the current folder (created on first use).")
@click.version_option(package_name="leaseq")
@click.pass_context
def cli(ctx: click.Context, dsn: str | None) -> None:
    """leaseq: a task queue where a claim is a lease with a fencing token.

    Operator commands for tasks, leases and queues. Run `leaseq demo` to see
    a stalled worker lose its lease and be refused.
    """
    ctx.obj = CliState(dsn=dsn)


def register_commands(group: click.Group) -> None:
    """Import every module of :data:`COMMAND_MODULES` and let it add its commands."""
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__package__}.{name}").register(group)


register_commands(cli)
add_envvars(cli)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. Errors print one line on stderr; set LEASEQ_DEBUG=1 for tracebacks."""
    try:
        cli.main(args=argv, prog_name="leaseq")
    except BrokenPipeError:
        # The reader went away (`leaseq ls | head`): stop quietly, as other tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except ModuleNotFoundError as exc:
        error = missing_extra(exc)
        if not isinstance(error, CliError) or os.environ.get("LEASEQ_DEBUG") == "1":
            raise
        error.show()
        sys.exit(error.exit_code)
    except Exception as exc:  # the last resort: an unexpected failure is still one line
        if os.environ.get("LEASEQ_DEBUG") == "1":
            raise
        click.echo(f"error: internal: {type(exc).__name__}: {one_line(str(exc))} "
                   f"(set LEASEQ_DEBUG=1 for a traceback)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
