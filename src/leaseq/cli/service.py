"""``leaseq serve``, ``leaseq tokens create|list|revoke`` and ``leaseq prune``.

The service and token commands act on the database the global ``--dsn``
names. ``tokens create`` prints the token once, alone on stdout, or writes
it to ``--output FILE``, created readable by its owner only (0600); only its
hash is stored. A shell redirect creates the file with the shell's umask:
use ``--output``, or ``(umask 077; leaseq tokens create ... > worker.token)``.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import click
from rich.table import Table

from .logs import service_logging
from .render import make_console
from .session import CliError, emit_json, json_option, open_queue

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, None: 1}


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    group.add_command(serve)
    group.add_command(tokens)
    group.add_command(prune)


def parse_duration(field: str, text: str | None) -> float | None:
    """``30d``, ``12h``, ``15m``, ``45s``, ``2w`` or plain seconds, as seconds."""
    if text is None:
        return None
    m = _DURATION.fullmatch(text)
    if m is None:
        raise CliError(field, f"must be a duration such as 30d, 12h, 15m or 45s (got {text!r})")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _day(value: Any, default: str) -> str:
    return value.strftime("%Y-%m-%d") if value is not None else default


def cli_actor() -> str:
    """Who is acting from this shell, for the audit log."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # pragma: no cover - no user database in some containers
        return "cli"


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--migrate", is_flag=True, help="Create or upgrade the schema before serving.")
@click.option("--rate", default=1000.0, show_default=True, type=click.FloatRange(min=0),
              help="Requests per second per token (0: no limit). Each replica limits on its own.")
@click.option("--burst", default=2000.0, show_default=True, type=click.FloatRange(min=1), help="Rate limit burst.")
@click.option("--failed-auth-rate", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Failed authentications per second allowed per token id that failed (per client address "
                   "for missing, malformed or unknown tokens); past it they get 429. Valid tokens are never "
                   "refused by it.")
@click.option("--failed-auth-burst", default=20.0, show_default=True, type=click.FloatRange(min=1),
              help="Burst of failed authentications before --failed-auth-rate applies.")
@click.option("--max-body-bytes", default=2 * 1024 * 1024, show_default=True, type=click.IntRange(min=1024),
              help="Largest request body accepted (413 above).")
@click.option("--public-metrics", is_flag=True, help="Serve /metrics without a token.")
@click.option("--secure-cookies", is_flag=True,
              help="Mark the dashboard cookie Secure even on plain HTTP (behind a TLS proxy whose "
                   "X-Forwarded-Proto is not trusted). Requests over HTTPS always get a Secure cookie.")
@click.option("--forwarded-allow-ips", metavar="IPS", default="", show_default="none",
              help="Proxies whose X-Forwarded-For/-Proto headers are believed (comma-separated addresses or "
                   "networks, '*' for any). By default none: the TCP peer is the client.")
@click.option("--trusted-host", "trusted_host", multiple=True, metavar="NAME",
              help="A host name clients reach the service by (repeat for several; '*.example.com' for a "
                   "domain's names, '*' for any). Requests naming any other Host get 400. Always trusted: "
                   "localhost, 127.0.0.1, [::1] and the --host address.")
@click.option("--docs", is_flag=True, help="Serve Swagger UI at /docs (it loads scripts from a CDN). "
                                           "/openapi.json is always served.")
@click.option("--prune-older-than", metavar="AGE", default=None,
              help="Retention the service applies: delete ended tasks (completed, cancelled, dead, denied, "
                   "expired) older than AGE, each leaving an evidence record without user data.")
@click.option("--prune-payloads-older-than", metavar="AGE", default=None,
              help="Clear the user data of ended tasks older than AGE (payload, result, errors, effect "
                   "responses, notes), keeping the rows.")
@click.option("--prune-evidence-older-than", metavar="AGE", default=None, show_default="365d, or --prune-older-than "
              "if longer", help="Delete the evidence records of tasks that ended more than AGE ago, and "
              "audit entries written more than AGE ago.")
@click.option("--prune-streams-older-than", metavar="AGE", default=None,
              help="Delete the streams (what handlers emitted) of tasks that ended more than AGE ago; without it "
                   "a stream goes with the task's other user data.")
@click.option("--prune-every", metavar="AGE", default="1h", show_default=True, help="How often retention runs.")
@click.option("--sweep-every", metavar="AGE", default="10s", show_default=True,
              help="How often expired leases are routed (needs_reconciliation, retries) without waiting for a "
                   "claim; 0 turns the sweep off.")
@click.option("--sweep-max-queues", metavar="N", default=1000, show_default=True,
              type=click.IntRange(1, 100_000),
              help="Most queues one sweep pass examines; with more, the next pass follows at once, resuming "
                   "after the last one examined.")
@click.option("--leader-lease", metavar="AGE", default="15s", show_default=True,
              help="Lease of the maintenance leadership: the sweep and retention run on one replica at a time, "
                   "and another takes over within about this long when it dies.")
@click.option("--waits-per-token", default=100, show_default=True, type=click.IntRange(min=1),
              help="Most requests one token may hold waiting at once per process (long-poll claims, task waits "
                   "and live streams together); past it, 429 with Retry-After.")
@click.option("--waits-per-process", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Most waiting requests one process holds for all tokens together.")
@click.option("--processes", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Serving processes sharing the port, under a supervisor that restarts one that dies. "
                   "Each is a replica of its own (rate limits and /metrics counters are per process).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object per line with time, level, logger, message and, where known, task_id, "
                   "kind, generation, worker and duration (the request's seconds).")
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, migrate: bool, rate: float, burst: float,
          failed_auth_rate: float, failed_auth_burst: float, max_body_bytes: int, public_metrics: bool,
          secure_cookies: bool, forwarded_allow_ips: str, trusted_host: tuple[str, ...], docs: bool, prune_older_than: str | None,
          prune_payloads_older_than: str | None, prune_evidence_older_than: str | None,
          prune_streams_older_than: str | None, prune_every: str, sweep_every: str, sweep_max_queues: int,
          leader_lease: str,
          waits_per_token: int, waits_per_process: int, processes: int, log_level: str, log_format: str) -> None:
    """Serve the queue over HTTP: worker API, operator API, dashboard and /metrics.

    Stateless apart from the database: run several replicas behind a load
    balancer, or several processes on one port (--processes); the sweep and
    retention run on one of them at a time. Create tokens first with
    `leaseq tokens create`.
    """
    import uvicorn

    from ..service import create_app
    from ..service.app import server_config, trusted_hosts
    from ..service.maintenance import MAX_LEADER_LEASE_SECONDS, MIN_LEADER_LEASE_SECONDS

    older = parse_duration("prune_older_than", prune_older_than)
    payloads = parse_duration("prune_payloads_older_than", prune_payloads_older_than)
    evidence = parse_duration("prune_evidence_older_than", prune_evidence_older_than)
    streams = parse_duration("prune_streams_older_than", prune_streams_older_than)
    every = parse_duration("prune_every", prune_every)
    if streams is not None and older is None:
        raise CliError("prune_streams_older_than", "needs --prune-older-than as well")
    if payloads is not None and older is None:
        raise CliError("prune_payloads_older_than", "needs --prune-older-than as well")
    if evidence is not None and older is None:
        raise CliError("prune_evidence_older_than", "needs --prune-older-than as well")
    if evidence is not None and older is not None and evidence < older:
        raise CliError("prune_evidence_older_than", f"must be at least --prune-older-than ({prune_older_than}): "
                                                    f"the evidence record outlives its task")
    if every is not None and every <= 0:
        raise CliError("prune_every", "must be greater than 0")
    sweep = parse_duration("sweep_every", sweep_every) or None
    lease = parse_duration("leader_lease", leader_lease)
    if lease is None or not MIN_LEADER_LEASE_SECONDS <= lease <= MAX_LEADER_LEASE_SECONDS:
        raise CliError("leader_lease", f"must be from {MIN_LEADER_LEASE_SECONDS} to {MAX_LEADER_LEASE_SECONDS:g} "
                                       f"seconds (got {leader_lease!r})")
    hosts = trusted_hosts(trusted_host)  # InvalidInput (field trusted_hosts) for a bad name
    if host not in ("", "0.0.0.0", "::"):  # the address it listens on is a name clients use
        hosts.append(f"[{host}]" if ":" in host else host.lower())
    log = service_logging(level=log_level, fmt=log_format)
    say = click.echo if log_format == "text" else (lambda text, err=True: log.info("%s", text))
    options: dict[str, Any] = dict(
        rate_per_second=rate, burst=burst, failed_auth_per_second=failed_auth_rate,
        failed_auth_burst=failed_auth_burst, max_body_bytes=max_body_bytes, public_metrics=public_metrics,
        secure_cookies=secure_cookies, forwarded_allow_ips=forwarded_allow_ips, trusted_hosts=tuple(hosts), docs=docs,
        prune_older_than=older, prune_payloads_older_than=payloads, prune_evidence_older_than=evidence,
        prune_streams_older_than=streams, prune_every=every or 3600.0,
        sweep_every=sweep, sweep_max_queues=sweep_max_queues, leader_lease_seconds=lease, waits_per_token=waits_per_token,
        waits_per_process=waits_per_process)
    if processes > 1:
        _serve_processes(ctx, processes, options, host=host, port=port, migrate=migrate, log_level=log_level,
                         log_format=log_format, say=say)
        say("leaseq service stopped", err=True)
        return
    q = open_queue(ctx, need_schema=not migrate)
    if migrate:
        q.migrate()
    app = create_app(q, **options)

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises SIGTERM after a graceful shutdown; a service that
            # stopped cleanly should simply exit 0.
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            for server in self.servers:
                for sock in server.sockets:
                    addr = sock.getsockname()
                    say(_listening(addr, q.dialect), err=True)

    # log_config=None: uvicorn's records go through the handler set up above, in the chosen format
    config = server_config(app, host=host, port=port, log_level=log_level, access_log=log_level == "debug",
                           log_config=None)
    Server(config).run()
    say("leaseq service stopped", err=True)


def _listening(addr: Any, dialect: str, processes: int = 1) -> str:
    several = f"; {processes} processes" if processes > 1 else ""
    return (f"leaseq service listening on http://{addr[0]}:{addr[1]} "
            f"({dialect}{several}; dashboard at /, API schema at /openapi.json)")


#: Names the file in which the supervisor of ``leaseq serve --processes N`` hands each serving
#: process its settings. The settings hold the DSN, password included: they go in a file only
#: the service's user can read (0600, in a 0700 directory, removed when the service stops),
#: never in the environment, which other processes of the machine may read (/proc/PID/environ
#: under the same user, crash reports, process listings of some tools).
PROCESS_SETTINGS_ENV = "LEASEQ_SERVING_PROCESS_FILE"


def _serve_processes(ctx: click.Context, processes: int, options: dict[str, Any], *, host: str, port: int,
                     migrate: bool, log_level: str, log_format: str, say: Any) -> None:
    """``leaseq serve --processes N``: bind the port once, then run N serving processes
    on it under uvicorn's supervisor, which restarts one that dies and stops them all
    on SIGTERM or SIGINT. Each process builds its own application and pool
    (:func:`process_app`): a replica, as behind a load balancer."""
    import shutil
    import tempfile

    from .session import cli_state, connect_checked

    state = cli_state(ctx)
    # The database is checked (and migrated) once, here, so a wrong DSN or a missing
    # schema is one clear error rather than N processes failing to start.
    q = connect_checked(state.dsn, need_schema=not migrate, migrate=state.embedded_default,
                        embedded=state.embedded_default)
    try:
        if migrate:
            q.migrate()
        dialect = q.dialect
    finally:
        q.close()
    private = tempfile.mkdtemp(prefix="leaseq-serve-")  # 0700
    settings_file = os.path.join(private, "settings.json")
    fd = os.open(settings_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"dsn": state.dsn, "options": options, "log_level": log_level, "log_format": log_format}, fh)
    # the serving processes inherit this environment: the file's name, and no DSN
    given = os.environ.pop("LEASEQ_DSN", None)
    os.environ[PROCESS_SETTINGS_ENV] = settings_file
    try:
        _supervise(processes, options, host=host, port=port, log_level=log_level, dialect=dialect, say=say)
    finally:
        os.environ.pop(PROCESS_SETTINGS_ENV, None)
        if given is not None:
            os.environ["LEASEQ_DSN"] = given
        shutil.rmtree(private, ignore_errors=True)


def _supervise(processes: int, options: dict[str, Any], *, host: str, port: int, log_level: str, dialect: str,
               say: Any) -> None:
    """Bind the port and run the serving processes under uvicorn's supervisor until it stops."""
    import logging

    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    from ..service.app import server_options

    config = uvicorn.Config(f"{__name__}:process_app", factory=True, host=host, port=port, workers=processes,
                            log_level=log_level, access_log=log_level == "debug", log_config=None,
                            **server_options(options["forwarded_allow_ips"]))
    quiet = logging.getLogger("uvicorn.error")
    quiet.disabled = True  # bind_socket announces itself; the line below says it once, the leaseq way
    try:
        sock = config.bind_socket()
    finally:
        quiet.disabled = False
    say(_listening(sock.getsockname(), dialect, processes), err=True)
    supervisor = Multiprocess(config, sockets=[sock])
    try:
        supervisor.run()
    finally:
        sock.close()
    if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        # uvicorn stops the group when a process fails before serving (it would fail the same way again)
        raise CliError("processes", "a serving process failed to start (its error is logged above)", exit_code=1)


def process_app() -> Any:
    """The application of one process of ``leaseq serve --processes N`` (uvicorn calls
    it in each process the supervisor starts)."""
    import atexit

    from ..queue import connect
    from ..service import create_app

    from uvicorn.config import STARTUP_FAILURE

    from ..core.errors import BackendUnavailable

    with open(os.environ[PROCESS_SETTINGS_ENV], encoding="utf-8") as fh:
        spec = json.load(fh)
    _stop_with_supervisor()
    log = service_logging(level=spec["log_level"], fmt=spec["log_format"])
    try:
        queue = connect(spec["dsn"])
        atexit.register(queue.close)
        return create_app(queue, **spec["options"])
    except BackendUnavailable:
        raise  # the database may come back: the supervisor starts the process again
    except Exception:
        # Anything else would fail the same way in every process: the supervisor stops the group.
        log.exception("a serving process could not start")
        sys.exit(STARTUP_FAILURE)


def _stop_with_supervisor() -> None:
    """On Linux, have the kernel send this process SIGTERM when its supervisor dies
    (killed, say): a serving process must not outlive it, holding the port."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    supervisor = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - no prctl here
        return
    if os.getppid() != supervisor:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


@click.group()
def tokens() -> None:
    """API tokens for the service: create (shown once), list, revoke."""


@tokens.command("create")
@click.option("--role", required=True, type=click.Choice(["worker", "viewer", "operator", "admin"]),
              help="worker: its own leases; viewer: read; operator: act on tasks; admin: tokens, retention.")
@click.option("--name", required=True, help="A label: who or what holds the token.")
@click.option("--queue", "queues", multiple=True, metavar="QUEUE",
              help="Limit the token to this queue (repeat for several): a worker claims and enqueues, a viewer "
                   "or operator reads and acts, on these queues only. A worker token needs it, or --all-queues.")
@click.option("--all-queues", is_flag=True, default=False,
              help="A worker token for every queue (worker tokens are limited to --queue otherwise).")
@click.option("--own-intents", is_flag=True, default=False,
              help="Let a worker token record intents that run without approval on queues it claims from "
                   "itself (off: such an intent needs approval='required').")
@click.option("--read-payloads/--no-read-payloads", default=None,
              help="Show payloads, results and errors (default: yes, except for viewers).")
@click.option("--expires-in", metavar="AGE", default=None, help="Lifetime, e.g. 90d (default: no expiry).")
@click.option("--output", "output", metavar="FILE", default=None,
              help="Write the token to FILE, created new and readable by you only (0600), instead of printing it.")
@json_option
@click.pass_context
def create(ctx: click.Context, role: str, name: str, queues: tuple[str, ...], all_queues: bool,
           own_intents: bool, read_payloads: bool | None, expires_in: str | None, output: str | None,
           as_json: bool) -> None:
    """Create a token and print it once (or write it to --output FILE). Only its hash is stored.

    A worker token is limited to the queues it serves: give --queue Q (one or
    more) or, to widen it to every queue, --all-queues."""
    from .. import access

    if role == "worker" and not queues and not all_queues:
        raise CliError("queue", "a worker token is limited to the queues it serves: give --queue QUEUE (repeat "
                                "for several), or --all-queues for every queue")
    if queues and all_queues:
        raise CliError("queue", "give --queue or --all-queues, not both")
    sink = _private_file(output) if output is not None else None  # before the token exists: nothing to lose
    try:
        token, record = access.create_token(open_queue(ctx), name=name, role=role, queues=list(queues) or None,
                                          all_queues=all_queues, read_payloads=read_payloads,
                                          own_intents=own_intents,
                                          expires_in=parse_duration("expires_in", expires_in), created_by=cli_actor())
    except BaseException:
        if sink is not None and output is not None:
            sink.close()
            os.unlink(output)
        raise
    if sink is not None and output is not None:
        with sink:
            sink.write(token + "\n")
        shown = {"token_file": os.path.abspath(output)}
    else:
        shown = {"token": token}
    if as_json:
        emit_json({**shown, **record})
        return
    if sink is None:
        click.echo(token)
        click.echo(f"created {role} token {record['id']} ({name}); it is shown only now: store it safely", err=True)
    else:
        click.echo(f"created {role} token {record['id']} ({name}); written to {output} (mode 0600)", err=True)


def _private_file(path: str) -> TextIO:
    """``path`` opened for writing, created new with mode 0600 whatever the umask."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        raise CliError("output", f"{path} already exists (a token file is never overwritten)") from None
    except OSError as exc:
        raise CliError("output", f"cannot create {path}: {exc.strerror}") from None
    os.fchmod(fd, 0o600)  # O_CREAT's mode is masked by the umask; the file must not be readable by others
    return os.fdopen(fd, "w", encoding="ascii")


@tokens.command("list")
@json_option
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Every token: id, name, role, scope and state (never a secret)."""
    from .. import access

    rows = access.list_tokens(open_queue(ctx))
    if as_json:
        emit_json(rows)
        return
    if not rows:
        make_console().print("no tokens; create one with `leaseq tokens create --role admin --name you`")
        return
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 1))
    for column in ("id", "name", "role", "queues", "data", "state", "expires", "used", "workers"):
        table.add_column(column, no_wrap=column != "name", overflow="fold")
    for r in rows:
        state = "revoked" if r["revoked_at"] else "expired" if r["expired"] else "active"
        table.add_row(r["id"], r["name"], r["role"], ",".join(r["queues"] or []) or "any",
                      "shown" if r["read_payloads"] else "hidden", state, _day(r["expires_at"], "never"),
                      _day(r["last_used_at"], "never"), str(r["workers"]))
    make_console().print(table)


@tokens.command("revoke")
@click.argument("token_id", required=False)
@click.option("--worker", "worker_id", metavar="WORKER_ID", default=None,
              help="Revoke the token that registered this worker (and so all of that token's workers).")
@json_option
@click.pass_context
def revoke(ctx: click.Context, token_id: str | None, worker_id: str | None, as_json: bool) -> None:
    """Revoke a token and every worker it registered (their leases stop renewing).

    Name the token by its id, or with --worker by a worker it registered:
    revoking only a worker leaves its token free to register a new one.
    """
    from .. import access

    if (token_id is None) == (worker_id is None):
        raise CliError("token_id", "name a token id or --worker WORKER_ID (one of them)")
    if worker_id is not None:
        token_id, workers = access.revoke_worker_token(open_queue(ctx), worker_id, by=cli_actor())
    else:
        workers = access.revoke_token(open_queue(ctx), token_id, by=cli_actor())  # type: ignore[arg-type]
    if as_json:
        emit_json({"token_id": token_id, "revoked": True, "revoked_workers": workers})
        return
    click.echo(f"revoked token {token_id}" + (f" and {len(workers)} worker(s): {', '.join(workers)}"
                                               if workers else ""))


@click.command()
@click.option("--older-than", required=True, metavar="AGE",
              help="Delete ended tasks (completed, cancelled, dead, denied, expired) untouched for AGE (e.g. 30d), "
                   "each leaving an evidence record without user data.")
@click.option("--payloads-older-than", metavar="AGE", default=None,
              help="Also clear the user data of ended tasks older than AGE (payload, result, errors, effect "
                   "responses, notes), keeping the rows.")
@click.option("--evidence-older-than", metavar="AGE", default=None, show_default="365d, or --older-than if longer",
              help="Delete the evidence records of tasks that ended more than AGE ago, and audit entries "
                   "written more than AGE ago.")
@click.option("--streams-older-than", metavar="AGE", default=None,
              help="Delete the streams (what handlers emitted) of tasks that ended more than AGE ago; without it "
                   "a stream goes with the task's other user data.")
@json_option
@click.pass_context
def prune(ctx: click.Context, older_than: str, payloads_older_than: str | None, evidence_older_than: str | None,
          streams_older_than: str | None, as_json: bool) -> None:
    """Apply retention now. Blocked and needs_reconciliation tasks are kept for a person."""
    q = open_queue(ctx)
    older = parse_duration("older_than", older_than)
    payloads = parse_duration("payloads_older_than", payloads_older_than)
    evidence = parse_duration("evidence_older_than", evidence_older_than)
    streams = parse_duration("streams_older_than", streams_older_than)
    # audited by Queue.prune, each batch in its own transaction
    counts = q.prune(older, payloads_older_than_seconds=payloads,  # type: ignore[arg-type]
                     evidence_older_than_seconds=evidence, streams_older_than_seconds=streams, by=cli_actor(),
                     via="cli")
    if as_json:
        emit_json(counts)
        return
    click.echo(f"pruned {counts['tasks']} task(s), {counts['events']} event(s), {counts['effects']} effect(s); "
               f"cleared {counts['payloads']} task(s)' user data; kept {counts['evidence']} and pruned "
               f"{counts['evidence_pruned']} evidence entries and {counts['audit_pruned']} audit entries"
               + (f"; deleted {counts['streams']} task(s)' streams" if streams is not None else "")
               + (f"; forgot {counts['spend_pruned']} day(s) of limit spend, {counts['flow_keys_pruned']} "
                  f"singleton or debounce key(s) and {counts['fairness_pruned']} fair-share key row(s)"
                  if counts["spend_pruned"] or counts["flow_keys_pruned"] or counts["fairness_pruned"] else ""))
