"""``leaseq stats``, ``workers`` and ``queues``: the state of the whole queue at a glance."""

from __future__ import annotations

from typing import Any

import click
from rich.text import Text

from ..queue import Queue
from .render import make_console, queues_table, stats_table, workers_table
from .session import emit_json, json_option, open_queue


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for command in (stats, workers, queues):
        group.add_command(command)


@click.command()
@json_option
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Task counts by queue and status.

    Also the age of the oldest due task and how many expired leases no claim
    has routed yet.
    """
    q = open_queue(ctx)
    rows = q.stats()
    switches = q.queues()
    if as_json:
        emit_json({"by_status": rows, "queues": switches})
        return
    console = make_console()
    if not rows:
        console.print("no tasks")
        return
    console.print(stats_table(rows, {s["name"] for s in switches if s["paused"]}))
    expired = sum(r.get("expired_leases") or 0 for r in rows)
    if expired:
        console.print(Text(f"{expired} expired lease(s) not routed yet: the next claim routes them, "
                           f"or run `leaseq sweep`", style="yellow"))


@click.command()
@json_option
@click.pass_context
def workers(ctx: click.Context, as_json: bool) -> None:
    """Registered workers: state, last heartbeat, leases held, kinds served.

    The state is judged now from the last heartbeat: alive (within its
    renewal interval), late, lost (silent for a lease length: killed or cut
    off), stopped (exited cleanly; the reason is shown), revoked, or unknown
    (registered by hand, without a heartbeat interval).
    """
    rows = open_queue(ctx).workers()
    if as_json:
        emit_json(rows)
        return
    console = make_console()
    console.print(workers_table(rows) if rows else "no workers registered")


def queue_overview(q: Queue) -> list[dict[str, Any]]:
    """Every queue that has tasks or an off-switch setting, with its counts and state."""
    overview: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return overview.setdefault(name, dict(queue=name, paused=False, changed_at=None, changed_by=None,
                                              tasks=0, queued=0, running=0, oldest_queued_seconds=None))

    for r in q.stats():
        e = entry(r["queue"])
        e["tasks"] += r["count"]
        if r["status"] in ("queued", "running"):
            e[r["status"]] += r["count"]
        if r.get("oldest_queued_seconds") is not None:
            e["oldest_queued_seconds"] = r["oldest_queued_seconds"]
    for s in q.queues():
        entry(s["name"]).update(paused=bool(s["paused"]), changed_at=s["changed_at"], changed_by=s["changed_by"])
    return [overview[name] for name in sorted(overview)]


@click.command()
@json_option
@click.pass_context
def queues(ctx: click.Context, as_json: bool) -> None:
    """Queues: off-switch state and task counts."""
    rows = queue_overview(open_queue(ctx))
    if as_json:
        emit_json(rows)
        return
    console = make_console()
    console.print(queues_table(rows) if rows else "no queues yet")
