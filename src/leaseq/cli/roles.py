"""``leaseq roles``: PostgreSQL login roles for worker hosts, operators, viewers and verifiers (create, list, revoke)."""

from __future__ import annotations

import click
from rich.table import Table

from .render import make_console
from .service import _private_file, cli_actor
from .session import CliError, emit_json, json_option, open_queue


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    group.add_command(roles)


@click.group()
def roles() -> None:
    """PostgreSQL roles held to their authority by the database: create (DSN shown once), list, revoke."""


@roles.command("create")
@click.argument("kind", metavar="worker|operator|viewer|verifier")
@click.argument("name")
@click.option("--queue", "queues", multiple=True, metavar="QUEUE",
              help="Scope the role to this queue (repeat for several); default: every queue.")
@click.option("--password-file", metavar="FILE", default=None, type=click.Path(dir_okay=False),
              help="Read the role's password from FILE (first line) instead of generating one.")
@click.option("--output", metavar="FILE", default=None,
              help="Write the DSN to FILE, created new with mode 0600, instead of printing it.")
@click.option("--connection-limit", metavar="N", type=int, default=None,
              help="The most server connections the role may hold at once (default 50: two worker "
                   "processes' pools with room to spare; -1: no limit of its own).")
@json_option
@click.pass_context
def create(ctx: click.Context, kind: str, name: str, queues: tuple[str, ...], password_file: str | None,
           output: str | None, connection_limit: int | None, as_json: bool) -> None:
    """Create login role NAME of KIND and print its DSN once.

    A worker role holds no privilege on any table: it claims, renews, completes
    and records effects only through leaseq's functions, as the worker
    identities it registered, within its queues. A verifier role (for a
    downstream service) checks action tokens online and can do nothing else.
    """
    from .. import roles as db_roles

    password = None
    if password_file is not None:
        try:
            with open(password_file, encoding="utf-8") as f:
                password = f.readline().rstrip("\n")
        except OSError as exc:
            raise CliError("password_file", f"cannot read {password_file}: {exc.strerror}") from None
    sink = _private_file(output) if output is not None else None
    try:
        dsn = db_roles.create_role(open_queue(ctx), kind, name, queues=list(queues) or None, password=password,
                                   connection_limit=(db_roles.DEFAULT_CONNECTION_LIMIT if connection_limit is None
                                                     else connection_limit))
    except BaseException:
        if sink is not None and output is not None:
            import os

            sink.close()
            os.unlink(output)
        raise
    if as_json:
        emit_json({"role": name, "kind": kind, "queues": list(queues) or None,
                   **({"dsn_file": output} if sink is not None else {"dsn": dsn})})
        if sink is not None:
            with sink:
                sink.write(dsn + "\n")
        return
    if sink is not None:
        with sink:
            sink.write(dsn + "\n")
        click.echo(f"created {kind} role {name}; its DSN is written to {output} (mode 0600)", err=True)
        return
    click.echo(dsn)
    click.echo(f"created {kind} role {name}" + (f" for queue(s) {', '.join(sorted(queues))}" if queues else "")
               + "; the DSN holds its password and is shown only now: store it safely", err=True)


@roles.command("list")
@json_option
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Every role made by `leaseq roles create`: kind, queues, state, open sessions."""
    from .. import roles as db_roles

    rows = db_roles.list_roles(open_queue(ctx))
    if as_json:
        emit_json([{"role": r.role, "kind": r.kind, "queues": r.queues, "created_by": r.created_by,
                    "created_at": r.created_at.isoformat(),
                    "revoked_at": r.revoked_at.isoformat() if r.revoked_at else None,
                    "can_login": r.can_login, "sessions": r.sessions} for r in rows])
        return
    if not rows:
        make_console().print("no roles; create one with `leaseq roles create worker NAME`")
        return
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 1))
    for column in ("role", "kind", "queues", "state", "sessions", "created"):
        table.add_column(column, no_wrap=True)
    for r in rows:
        state = "revoked" if r.revoked_at else "active" if r.can_login else "no login"
        table.add_row(r.role, r.kind, ",".join(r.queues or []) or "any", state, str(r.sessions),
                      f"{r.created_at:%Y-%m-%d} by {r.created_by}")
    make_console().print(table)


@roles.command("revoke")
@click.argument("name")
@json_option
@click.pass_context
def revoke(ctx: click.Context, name: str, as_json: bool) -> None:
    """Revoke role NAME: no login, no privileges, its sessions ended, its workers' leases ended."""
    from .. import roles as db_roles

    out = db_roles.revoke_role(open_queue(ctx), name, by=cli_actor(), via="cli")
    if as_json:
        emit_json(out)
        return
    click.echo(f"revoked role {name}: {out['sessions_ended']} session(s) ended, "
               f"{len(out['workers_revoked'])} worker(s) revoked"
               + (f" ({', '.join(out['workers_revoked'])})" if out["workers_revoked"] else ""))
