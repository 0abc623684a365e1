"""``leaseq worker``: run an App's handlers in this process under real leases."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..app import App
from ..core.errors import LeaseqError, install_line
from ..observability import WorkerObserver
from .logs import WorkerLogging
from .session import CliError, cli_state, connect_checked


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
    if not hasattr(module, attribute):
        apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
        hint = f"; its App: {', '.join(f'{module_name}:{n}' for n in apps)}" if apps else \
            "; it defines no leaseq.App (declare one: app = leaseq.App())"
        raise CliError("app", f"module {module_name!r} has no attribute {attribute!r}{hint}")
    app = getattr(module, attribute)
    if not isinstance(app, App):
        raise CliError("app", f"{spec!r} is not a leaseq.App (it is of type {type(app).__name__})")
    try:
        app.check_runnable()
    except LeaseqError as exc:
        raise CliError.from_leaseq(exc) from None
    return app


def _remote(server: str, token_file: Path | None) -> Any:
    if token_file is None:
        raise CliError("token_file", "--server needs --token-file with a worker token")
    token = token_file.read_text().strip()
    if not token:
        raise CliError("token_file", f"{str(token_file)!r} is empty")
    from ..client import RemoteQueue

    return RemoteQueue(server, token)


def _database(app: App, dsn: str | None, *, migrate: bool) -> Callable[[], Any]:
    """A function that opens the app's queue (checked as :func:`_check_database` says), for the
    worker to call in its retrying start-up: while the database cannot be reached
    (:class:`~leaseq.BackendUnavailable`) the worker waits and tries again; any other error
    (a refused login, a database without leaseq's schema) ends the start at once."""
    if dsn is not None:
        if app._queue is not None:
            raise CliError("dsn", "the app is already connected; --dsn must be given before it connects")
        app.dsn = dsn

    def connect() -> Any:
        _check_database(app, dsn, migrate=migrate)
        return app.queue

    return connect


def register(group: click.Group) -> None:
    """Add ``worker`` to the command group."""

    @group.command("worker")
    @click.argument("app_spec", metavar="MODULE:APP")
    @click.option("--queue", "queues", multiple=True, metavar="NAME",
                  help="Queue to work (repeatable). Default: the queues the app's tasks are declared on.")
    @click.option("--concurrency", type=click.IntRange(1, 1000), default=10, show_default=True,
                  help="Tasks run at once (sync handlers in threads, async ones on the event loop).")
    @click.option("--prefetch", type=click.IntRange(0, 1000), default=0, show_default=True,
                  help="Tasks leased ahead of the handler slots, started as handlers return (their leases are "
                       "renewed meanwhile, and given back unstarted on shutdown). For remote workers whose "
                       "handlers end in waves; each one is kept from other workers until it starts.")
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
    @click.option("--until-idle", is_flag=True,
                  help="Exit (status 0) once no task is due and none is running, instead of waiting for more.")
    @click.option("--migrate", is_flag=True,
                  help="Create or upgrade the schema first. Without it, a database lacking leaseq's schema is "
                       "refused (run `leaseq migrate`); the embedded default is prepared either way.")
    @click.option("--progress", is_flag=True,
                  help="Show a progress line (counts and rate) instead of a line per finished task.")
    @click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
                  show_default=True)
    @click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
                  help="json: one object per line with time, level, message and, where known, task_id, kind, "
                       "generation, attempt, worker, duration and outcome.")
    @click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
                  help="Serve this worker's Prometheus metrics at http://ADDR:PORT/metrics (0: any free port, "
                       "named in the log). Needs the metrics extra. Default: off.")
    @click.option("--metrics-addr", default="127.0.0.1", show_default=True, metavar="ADDR",
                  help="Address the metrics endpoint binds (0.0.0.0 exposes it beyond this host).")
    @click.pass_context
    def worker(ctx: click.Context, app_spec: str, queues: tuple[str, ...], concurrency: int, prefetch: int, name: str,
               grace: float, poll_interval: float | None, lease_seconds: float | None, server: str | None,
               token_file: Path | None, until_idle: bool, migrate: bool, progress: bool, log_level: str,
               log_format: str, metrics_port: int | None, metrics_addr: str) -> None:
        """Run the handlers of MODULE:APP (e.g. myapp:app) until SIGTERM or SIGINT.

        The first signal stops claiming and lets running tasks finish within
        --grace; what is left is released through the recovery policy. A second
        signal exits at once (held leases then expire and are recovered).
        """
        logs = WorkerLogging(level=log_level, fmt=log_format, progress=progress)
        state = cli_state(ctx)
        app = load_app(app_spec)
        observer = _observer(metrics_port, metrics_addr, logs.log)  # a port in use refuses before any change
        if server is None:  # connected in the worker's start-up, which waits for an unreachable database
            transport, connect = None, _database(app, state.dsn, migrate=migrate)
        else:
            transport, connect = _remote(server, token_file), None
        try:
            stats = app.run_worker(transport=transport, connect=connect, queues=list(queues) or None,
                                   concurrency=concurrency,
                                   prefetch=prefetch, name=name, grace=grace, poll_interval=poll_interval,
                                   lease_seconds=lease_seconds, install_signals=True, until_idle=until_idle,
                                   progress=logs.progress if progress else None, observer=observer)
        except LeaseqError as exc:
            raise CliError.from_leaseq(exc) from None
        logs.stopped(stats)
        _exit_past_stuck_handlers()


def _observer(port: int | None, addr: str, log: logging.Logger) -> WorkerObserver:
    """The worker's observer, serving its metrics when ``--metrics-port`` is given."""
    if port is None:
        return WorkerObserver()
    try:
        from ..observability.metrics import WorkerMetrics
    except ImportError:
        raise CliError("metrics_port", f"needs prometheus-client: {install_line('metrics')}") from None
    metrics = WorkerMetrics()
    try:
        _server, bound = metrics.serve(port, addr)
    except OSError as exc:
        raise CliError("metrics_port", f"cannot listen on {addr}:{port}: {exc.strerror or exc}") from None
    host = f"[{addr}]" if ":" in addr else addr
    log.info("metrics at http://%s:%d/metrics", host, bound, extra={"metrics_port": bound})
    return WorkerObserver(metrics)


def _check_database(app: App, dsn: str | None, *, migrate: bool) -> None:
    """Refuse a database without leaseq's schema unless ``--migrate``, as ``leaseq ls`` does.

    The App would otherwise create the schema wherever it is pointed. The
    embedded default (no --dsn, no $LEASEQ_DSN, no DSN in the App) is
    prepared on first use, as for every other command.
    """
    if app._queue is not None:
        return  # the module connected the app at import: the library migrated it then
    if dsn is None:
        dsn = app.dsn
    embedded = dsn is None and not os.environ.get("LEASEQ_DSN")
    hint = ", or start the worker with --migrate"
    if app.dsn is not None and dsn == app.dsn:
        hint = " with --dsn set to the app's database" + hint
    connect_checked(dsn, migrate=migrate or embedded, embedded=embedded, hint=hint, unavailable=True).close()


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
