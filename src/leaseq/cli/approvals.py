"""``leaseq approvals``: the tasks that wait for a person's approval, with their digests.

``leaseq approve TASK --digest ...`` and ``leaseq deny TASK --reason ...``
come from the action table (:mod:`leaseq.cli.operator_actions`); an approval
names the digest this command shows, and the queue refuses any other.
"""

from __future__ import annotations

import json

import click
from rich.table import Table
from rich.text import Text

from .render import make_console
from .session import as_datetime, emit_json, json_option, open_queue


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    group.add_command(approvals)


@click.command()
@click.option("--queue", default=None, help="Only tasks of this queue.")
@click.option("--limit", type=int, default=100, show_default=True, help="At most this many, oldest first.")
@json_option
@click.pass_context
def approvals(ctx: click.Context, queue: str | None, limit: int, as_json: bool) -> None:
    """List the tasks awaiting approval: payload, digest, who asked, deadline.

    Approve one with `leaseq approve TASK --digest DIGEST [--note ...]` (the
    digest shown here: the approval is bound to exactly this kind, payload
    and queue), or deny it with `leaseq deny TASK --reason ...`.
    """
    q = open_queue(ctx)
    found = q.approvals(queue=queue, limit=limit)
    if as_json:
        emit_json(found)
        return
    console = make_console()
    if not found:
        console.print("nothing awaits approval" + (f" in queue {queue}" if queue else ""))
        return
    table = Table(show_lines=True)
    for column in ("task", "kind / queue", "requested by", "deadline", "payload and digest"):
        table.add_column(column, overflow="fold")
    for a in found:
        task = a.task
        assert task is not None
        deadline = as_datetime(a.deadline_at).isoformat(timespec="seconds") if a.deadline_at else "none"
        requested = a.requested_by
        if a.reason == "budget" and a.detail:  # a budget spent: the figures, and how to raise it
            whose = "" if a.detail.get("owner") is None else f" (task {a.detail['owner']}'s tree)"
            requested += (f"\nbudget of {a.detail.get('key')}{whose} spent: {a.detail.get('spent')} of "
                          f"{a.detail.get('budget')} (--raise-budget)")
        table.add_row(str(a.task_id), f"{task.kind}\n{task.queue}", requested, deadline,
                      Text.assemble(json.dumps(task.payload, ensure_ascii=False, sort_keys=True), "\n",
                                    (a.digest, "bold")))
    console.print(table)
    first = found[0]
    console.print(Text(f"approve: leaseq approve {first.task_id} --digest {first.digest} --note '...'"),
                  soft_wrap=True)
