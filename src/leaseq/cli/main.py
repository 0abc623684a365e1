"""The ``leaseq`` command group and its entry point.

Commands live in sibling modules listed in :data:`COMMAND_MODULES`; each has
a ``register(group)`` function. To add a module (say ``cli/worker.py``),
add its name and its commands to that table: one line. See the package docstring.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import click

from ..core.errors import LeaseqError, install_line
from .session import CliError, CliState, one_line

#: Sibling modules whose ``register(group)`` adds commands, in help order, with the commands each adds.
#: A module is imported when one of its commands is run (or ``--help`` lists them all): ``leaseq ls``
#: does not pay for the worker, the service or the chaos kit.
COMMAND_MODULES = {
    "tasks": ("migrate", "enqueue", "ls", "show", "wait", "stream"),
    "operator_actions": ("cancel", "reconcile", "unblock", "requeue", "approve", "deny", "pause", "resume",
                         "revoke-worker", "signal", "sweep", "redrive", "cancel-where"),
    "approvals": ("approvals",),
    "asks": ("asks", "answer"),
    "overview": ("stats", "workers", "queues"),
    "demo_command": ("demo",),
    "worker": ("worker",),
    "schedules": ("schedules",),
    "limits": ("limits",),
    "service": ("serve", "tokens", "prune"),
    "roles": ("roles",),
    "mcp_command": ("mcp",),
    "chaos": ("chaos",),
}


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


class LazyCommands(dict[str, click.Command]):
    """A group's commands, each module of :data:`COMMAND_MODULES` imported on the first look-up of one of its
    commands; listing them all (``--help``, ``cli.commands.items()``) imports every module.

    Each command loaded gets its environment variables (:func:`add_envvars`) as it arrives.
    """

    def __init__(self, modules: dict[str, tuple[str, ...]]):
        super().__init__()
        self._module_of = {name: module for module, names in modules.items() for name in names}
        self._pending = list(modules)

    def _load(self, module: str) -> None:
        if module not in self._pending:
            return
        self._pending.remove(module)
        staging = click.Group()
        importlib.import_module(f"{__package__}.{module}").register(staging)
        for name, command in staging.commands.items():
            if self._module_of.get(name) != module:
                raise RuntimeError(f"cli.{module} added the command {name!r}: list it in COMMAND_MODULES")
            add_envvars(command, (name,))
            dict.__setitem__(self, name, command)

    def _load_all(self) -> None:
        for module in list(self._pending):
            self._load(module)

    def _load_for(self, name: object) -> None:
        module = self._module_of.get(name) if isinstance(name, str) else None
        if module is not None:
            self._load(module)

    def __getitem__(self, name: str) -> click.Command:
        self._load_for(name)
        return super().__getitem__(name)

    def get(self, name: str, default: Any = None) -> Any:
        self._load_for(name)
        return super().get(name, default)

    def __contains__(self, name: object) -> bool:
        self._load_for(name)
        return super().__contains__(name)

    def __iter__(self) -> Iterator[str]:
        self._load_all()
        return iter(self._ordered())

    def __len__(self) -> int:
        self._load_all()
        return super().__len__()

    def keys(self) -> Any:
        self._load_all()
        return self._ordered().keys()

    def values(self) -> Any:
        self._load_all()
        return self._ordered().values()

    def items(self) -> Any:
        self._load_all()
        return self._ordered().items()

    def _ordered(self) -> dict[str, click.Command]:
        """Every command, in the order of :data:`COMMAND_MODULES` (help order), whatever order they loaded in."""
        loaded = dict(super().items())
        return {name: loaded[name] for name in self._module_of if name in loaded}


def register_commands(group: click.Group) -> None:
    """Give the group its commands: each module of :data:`COMMAND_MODULES` imported when first needed."""
    group.commands = LazyCommands(COMMAND_MODULES)


add_envvars(cli)
register_commands(cli)


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
