"""``leaseq worker``: run an App's handlers in this process under real leases."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from ..app import App
from ..core.errors import LeaseqError
from ..worker.runtime import WorkerStats
from .session import CliError, CliState


def load_app(spec: str) -> App:
    """Import ``module:attribute`` (the current folder is importable) and return the App."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CliError("app", f"{spec!r} is not of the form module:attribute (e.g. myapp:app)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError("app", f"cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise CliError("app", f"{spec!r} is not a leaseq.App (got {type(app).__name__})")
    try:
        app.check_runnable()
    except LeaseqError as exc:
        raise CliError.from_leaseq(exc) from None
    return app


def _transport(app: App, dsn: str | None, server: str | None, token_file: Path | None) -> Any:
    if server:
        if token_file is None:
            raise CliError("token_file", "--server needs --token-file with a worker token")
        token = token_file.read_text().strip()
        if not token:
            raise CliError("token_file", f"{str(token_file)!r} is empty")
        from ..client import RemoteQueue

        return RemoteQueue(server, token)
    if dsn is not None:
        if app._queue is not None:
            raise CliError("dsn", "the app is already connected; --dsn must be given before it connects")
        app.dsn = dsn
    return app.queue


class ProgressLine:
    """One line, rewritten in place on a terminal, logged every few seconds otherwise."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._ticks = 0

    def __call__(self, stats: WorkerStats) -> None:
        self._ticks += 1
        line = (f"claimed {stats.claimed}  completed {stats.completed}  failed {stats.failed}  "
                f"lost {stats.lost}  released {stats.released}  {stats.rate:.1f}/s")
        if self._tty:
            sys.stderr.write("\r\x1b[2K" + line)
            sys.stderr.flush()
        elif self._ticks % 10 == 0:
            logging.getLogger("leaseq.worker").info("progress: %s", line)


def register(group: click.Group) -> None:
    """Add ``worker`` to the command group."""

    @group.command("worker")
    @click.argument("app_spec", metavar="MODULE:APP")
    @click.option("--queue", "queues", multiple=True, metavar="NAME",
                  help="Queue to work (repeatable). Default: the queues the app's tasks are declared on.")
    @click.option("--concurrency", type=click.IntRange(1, 1000), default=10, show_default=True,
                  help="Tasks run at once (sync handlers in threads, async ones on the event loop).")
    @click.option("--name", default="worker", show_default=True,
                  help="A label; the queue issues the worker's identity.")
    @click.option("--grace", type=click.FloatRange(0), default=30.0, show_default=True,
                  help="Seconds running tasks get to finish after SIGTERM/SIGINT before their leases are released.")
    @click.option("--poll-interval", type=click.FloatRange(0.01), default=None,
                  help="Seconds between claims when idle (default 2 on PostgreSQL, which also wakes on NOTIFY; 0.2 on SQLite).")
    @click.option("--lease-seconds", type=click.FloatRange(0.05), default=None,
                  help="Lease length for this worker's claims (default: each task's own).")
    @click.option("--server", metavar="URL", default=None,
                  help="Work through a `leaseq serve` instance over HTTP instead of a database connection.")
    @click.option("--token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                  help="File holding the worker token for --server.")
    @click.option("--progress", is_flag=True, help="Show a progress line (counts and rate).")
    @click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
                  show_default=True)
    @click.pass_context
    def worker(ctx: click.Context, app_spec: str, queues: tuple[str, ...], concurrency: int, name: str,
               grace: float, poll_interval: float | None, lease_seconds: float | None, server: str | None,
               token_file: Path | None, progress: bool, log_level: str) -> None:
        """Run the handlers of MODULE:APP (e.g. myapp:app) until SIGTERM or SIGINT.

        The first signal stops claiming and lets running tasks finish within
        --grace; what is left is released through the recovery policy. A second
        signal exits at once (held leases then expire and are recovered).
        """
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        state: CliState = ctx.find_object(CliState)
        app = load_app(app_spec)
        transport = _transport(app, state.dsn, server, token_file)
        try:
            stats = app.run_worker(transport=transport, queues=list(queues) or None, concurrency=concurrency,
                                   name=name, grace=grace, poll_interval=poll_interval,
                                   lease_seconds=lease_seconds, install_signals=True,
                                   progress=ProgressLine() if progress else None)
        except LeaseqError as exc:
            raise CliError.from_leaseq(exc) from None
        if progress and sys.stderr.isatty():
            sys.stderr.write("\n")
        click.echo(f"worker stopped: completed {stats.completed}, failed {stats.failed}, lost {stats.lost}, "
                   f"released {stats.released}", err=True)
        _exit_past_stuck_handlers()


def _exit_past_stuck_handlers() -> None:
    """A sync handler that ignores its lost lease cannot be interrupted; its
    lease is already released, so do not let its thread keep the process alive."""
    time.sleep(0.05)
    stuck = [t for t in threading.enumerate()
             if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if stuck:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(0)
