"""``leaseq chaos``: run the fault-injection harness and check the history.

The harness is its own distribution, ``leaseq-chaos`` (import package
``leaseq_chaos``, in the repository's ``chaos/`` folder), so the runtime
package holds only what runs in production; without it the command says
what to install.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ..core.errors import LeaseqError
from .session import CliError


def register(group: click.Group) -> None:
    """Add ``chaos`` to the command group."""
    group.add_command(chaos)


@click.command()
@click.option("--duration", type=float, default=60.0, show_default=True,
              help="Seconds for the whole run: faults and new work for the first three quarters or so, "
                   "then up to a quarter (15-60 s) for the queue to settle.")
@click.option("--workers", type=int, default=8, show_default=True, help="Worker processes.")
@click.option("--tasks", type=int, default=400, show_default=True, help="Tasks enqueued over the run.")
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seeds every random choice (task mix, fault schedules, clocks): a run can be replayed.")
@click.option("--faults", default="all", show_default=True,
              help="Comma-separated: kill,stop,terminate,restart,partition,skew,drop_queue,drop_ledger,revoke,"
                   "service (or all, none). terminate, restart, partition, drop_queue and drop_ledger need "
                   "PostgreSQL; service needs --transport http or mixed.")
@click.option("--transport", type=click.Choice(["direct", "http", "mixed"]), default="direct", show_default=True,
              help="How workers reach the queue: direct (a database connection each), http (every worker "
                   "through a `leaseq serve` process the run starts, with a worker token each), or mixed "
                   "(every other worker remote).")
@click.option("--backend", type=click.Choice(["postgres", "sqlite"]), default="postgres", show_default=True,
              help="postgres starts a private throwaway server (initdb) on a free loopback port; "
                   "sqlite uses temporary files.")
@click.option("--pooler", type=click.Choice(["none", "pgbouncer"]), default="none", show_default=True,
              help="pgbouncer puts a PgBouncer of the run's own in transaction mode (4 server connections, "
                   "Debian's pgbouncer) between the workers and the server; their DSNs say ?pooler=transaction.")
@click.option("--portable", is_flag=True,
              help="Run the workers (and the service) in the portable mode (?portable=true: nothing "
                   "prepared, no advisory lock, no LISTEN; waits poll). Needs --backend postgres.")
@click.option("--concurrency", type=int, default=4, show_default=True, help="Tasks each worker runs at once.")
@click.option("--prefetch", type=int, default=0, show_default=True,
              help="Tasks each worker leases ahead of its handler slots (leaseq worker --prefetch).")
@click.option("--history", "history_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the JSON history. Default: chaos-history-<seed>.json here.")
@click.option("--pg-bin", default=None, metavar="DIR",
              help="Folder holding initdb and pg_ctl (default: $PATH, else the newest /usr/lib/postgresql/*/bin).")
@click.option("--keep-logs", is_flag=True, help="Keep the worker logs and per-process history; print where.")
@click.option("--quiet", is_flag=True, help="Only the table.")
@click.option("--recheck", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              metavar="HISTORY", help="Run nothing: check a history file written by an earlier run again.")
def chaos(duration: float, workers: int, tasks: int, seed: int, faults: str, transport: str, backend: str,
          pooler: str, portable: bool, concurrency: int, prefetch: int, history_path: Path | None, pg_bin: str | None, keep_logs: bool, quiet: bool,
          recheck: Path | None) -> None:
    """Run worker processes under injected faults, then check every invariant.

    Prints a table of counts and violations and writes the whole history
    (every call, its verdict, the final tables) as JSON. Exit status: 0 when
    no invariant was violated, 1 when one was, 2 for bad options.
    The database is private to the run: the global --dsn is not used.
    """
    try:
        from leaseq_chaos import runner
        from leaseq_chaos.config import ChaosConfig, parse_faults
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "leaseq_chaos":
            raise
        raise CliError("chaos", "this command needs the leaseq-chaos package, which is not installed; from a "
                                "checkout of the leaseq repository: python -m pip install -e ./chaos") from None

    if recheck is not None:
        try:
            config, report = runner.recheck(recheck)
        except (ValueError, KeyError, TypeError) as exc:
            raise CliError("recheck", f"{str(recheck)!r} is not a chaos history file ({exc})") from None
        _print_table(report, f"leaseq chaos --recheck: seed {config.get('seed')}, {config.get('backend')}", recheck)
        sys.exit(0 if report.ok else 1)
    try:
        config = ChaosConfig(duration=duration, workers=workers, tasks=tasks, seed=seed,
                             faults=parse_faults(faults, backend, transport), backend=backend,
                             concurrency=concurrency, prefetch=prefetch, history_path=history_path, pg_bin=pg_bin,
                             transport=transport, pooler=pooler, portable=portable)
    except LeaseqError as exc:
        raise CliError.from_leaseq(exc) from None
    say = None if quiet else (lambda line: click.echo(line, err=True))
    try:
        result = runner.run_chaos(config, progress=say, keep_logs=keep_logs)
    except LeaseqError as exc:
        raise CliError.from_leaseq(exc) from None
    _print_table(result.report, f"leaseq chaos: seed {config.seed}, {config.backend}, {result.elapsed:.0f}s",
                 result.history_path)
    sys.exit(0 if result.report.ok else 1)


def _print_table(report: Any, title: str, history_path: Path) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from .render import make_console

    console = make_console()
    table = Table(box=box.SIMPLE, title=title, title_justify="left")
    table.add_column("what")
    table.add_column("count", justify="right")
    for name, n in sorted(report.counts.items(), key=lambda kv: (kv[0].startswith("fault"), kv[0])):
        table.add_row(Text(name), str(n))
    for status, n in sorted(report.statuses.items()):
        table.add_row(Text(f"tasks ended {status}"), str(n))
    for invariant, n in report.by_invariant().items():
        table.add_row(Text(f"violations: {invariant}", style="red" if n else "green"), str(n))
    console.print(table)
    for v in report.violations[:20]:
        console.print(Text(f"VIOLATION {v['invariant']} task {v['task']}: {v['detail']}", style="red"))
    if len(report.violations) > 20:
        console.print(Text(f"... and {len(report.violations) - 20} more (see the history file)", style="red"))
    verdict = "no violations" if report.ok else f"{len(report.violations)} violation(s)"
    console.print(Text(f"{verdict}; history in {history_path}",
                       style="green" if report.ok else "bold red"))
