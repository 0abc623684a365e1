"""``leaseq asks`` and ``leaseq answer``: the questions handlers put to a person (``ctx.ask``), and their answers."""

from __future__ import annotations

import click

from .. import access
from ..core import answers
from .session import emit_json, json_option, open_queue, parse_json_option


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    group.add_command(asks)
    group.add_command(answer)


def _age(seconds: float) -> str:
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


@click.command()
@click.option("--queue", default=None, help="Only tasks of this queue.")
@click.option("--limit", type=int, default=100, show_default=True, help="At most this many, oldest first.")
@json_option
@click.pass_context
def asks(ctx: click.Context, queue: str | None, limit: int, as_json: bool) -> None:
    """List the open questions: task, question, what the answer must be, age.

    A handler's ctx.ask(...) waits, holding no lease, until a person answers with
    `leaseq answer TASK --json '...'`; the answer is checked against the question's
    schema first.
    """
    from rich.table import Table

    from .render import make_console

    q = open_queue(ctx)
    found = q.asks(queue=queue, limit=limit)
    if as_json:
        emit_json(found)
        return
    console = make_console()
    if not found:
        console.print("no question waits for an answer" + (f" in queue {queue}" if queue else ""))
        return
    now = q.now()
    table = Table(show_lines=True)
    for column in ("task", "question", "answer (schema)", "age", "deadline"):
        table.add_column(column, overflow="fold")
    for a in found:
        deadline = a["deadline_at"].isoformat(timespec="seconds") if a["deadline_at"] else "none"
        table.add_row(f"{a['task_id']}\n{a['kind']}", a["question"], answers.summary(a["schema"]),
                      _age((now - a["asked_at"]).total_seconds()), deadline)
    console.print(table)
    console.print(f"answer: leaseq answer {found[0]['task_id']} --json '...'", soft_wrap=True, markup=False)


@click.command()
@click.argument("task_id", metavar="TASK", type=int)
@click.option("--json", "answer_json", metavar="JSON", required=True,
              help="The answer as JSON (- reads stdin, @path a file); it must fit the question's schema.")
@click.pass_context
def answer(ctx: click.Context, task_id: int, answer_json: str) -> None:
    """Answer the question task TASK asked (ctx.ask returns the answer).

    The answer is checked against the question's schema before it is taken: one that
    does not fit is refused, naming the field, and nothing changes. An answer is taken
    once. Recorded, with you as the answerer, in the task's evidence trail and the
    audit log.
    """
    q = open_queue(ctx)
    value = parse_json_option("json", answer_json)
    done = q.answer(task_id, value, by=access.local_principal().actor, via="cli")
    click.echo(f"task {task_id} answered" + (": it is queued again" if done["woke"] else ""))
