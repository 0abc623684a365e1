"""``leaseq migrate``, ``enqueue``, ``ls``, ``show``, ``wait`` and ``stream``."""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any

import click
from rich.text import Text

from ..core import checks
from ..core.errors import InvalidInput
from ..engine.budgets import parse_budget
from ..engine.common import default_actor
from ..queue import Queue
from ..signature import check_enqueue
from ..store.base import load_migrations, load_queries, parse_dsn
from .render import effects_table, fmt_duration, make_console, status_text, task_details, task_table, timeline
from .session import (CliError, as_datetime, cli_state, emit_json, json_option, jsonable, open_queue,
                      parse_json_option)


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for command in (migrate, enqueue, ls, show, wait, stream):
        group.add_command(command)


@click.command()
@click.option("--sql", "print_sql", is_flag=True,
              help="Print the SQL of the migrations not yet applied, without applying them (nothing changes).")
@click.pass_context
def migrate(ctx: click.Context, print_sql: bool) -> None:
    """Create or upgrade the schema (idempotent)."""
    if print_sql:
        _print_pending_sql(ctx)
        return
    q = open_queue(ctx, need_schema=False)
    applied = q.migrate()
    version = q.schema_version()
    if applied:
        click.echo(f"applied migration(s) {', '.join(map(str, applied))}; schema version {version} ({q.dialect})")
    else:
        click.echo(f"schema is up to date at version {version} ({q.dialect})")


def _print_pending_sql(ctx: click.Context) -> None:
    """``migrate --sql``: the scripts ``leaseq migrate`` would run, read-only.

    The database is only read (its schema version); a SQLite file that does
    not exist is not created: every migration is then pending.
    """
    state = cli_state(ctx)
    dialect, target = parse_dsn(state.dsn)
    current = 0
    if dialect == "postgres" or os.path.exists(target):
        current = open_queue(ctx, need_schema=False).schema_version()
    pending = [m for m in load_migrations(dialect) if m.version > current]
    if not pending:
        click.echo(f"-- schema is up to date at version {current} ({dialect}); nothing to apply")
        return
    click.echo(f"-- leaseq: {len(pending)} migration(s) not applied yet ({dialect}, schema version {current}).\n"
               f"-- Printed only: nothing was changed. `leaseq migrate` runs them in one transaction and\n"
               f"-- records each version in leaseq_migrations.")
    if current == 0:
        click.echo(f"\n-- the version table\n{load_queries(dialect)['migrations_create'].rstrip()}")
    for m in pending:
        click.echo(f"\n-- migration {m.version:04d}_{m.name}\n{m.sql.strip()}")


def _parse_at(text: str) -> datetime:
    """An ISO 8601 time; one without an offset is local time."""
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise CliError("at", f"not an ISO 8601 time such as 2030-01-31T09:00:00+00:00 (got {text!r})") from None
    return at if at.tzinfo is not None else at.astimezone()


def _parse_deadline(text: str) -> datetime | timedelta:
    """``--deadline``: a duration from now (by the database's clock), else an ISO 8601 time."""
    from .service import parse_duration

    try:
        return timedelta(seconds=parse_duration("deadline", text.strip()) or 0.0)
    except CliError:
        pass
    try:
        return _parse_at(text)
    except CliError:
        raise CliError("deadline", "must be an ISO 8601 time such as 2030-01-31T09:00:00+00:00 or a duration "
                                   f"such as 10m or 2h (got {text!r})") from None


@click.command()
@click.argument("kind")
@click.option("--payload", metavar="JSON", default=None,
              help="The task's input, a JSON document (`-` reads stdin, `@file` a file).")
@click.option("--queue", default="default", show_default=True, help="Queue to add the task to.")
@click.option("--effect", default=None,
              help="read_only, idempotent or side_effect: decides how an expired lease is routed. Default: "
                   "what the kind's worker declared, else read_only.")
@click.option("--no-check", "no_check", is_flag=True, default=False,
              help="Do not look the kind up among the registered workers' declarations (a kind served by "
                   "workers elsewhere): no warning, no payload check, effect read_only unless given.")
@click.option("--key", default=None, help="Idempotency key (stable across attempts; generated if omitted). "
                                          "Enqueueing the same key again in the queue returns the existing task; "
                                          "with a different kind, payload or option it is an error.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher is claimed first.")
@click.option("--delay", type=float, default=0.0, show_default=True, help="Seconds before the task is due.")
@click.option("--at", "at_text", metavar="TIME", default=None,
              help="When the task is due, an ISO 8601 time (2030-01-31T09:00:00+00:00; without an offset, "
                   "local time). Must be in the future by the database's clock. Not with --delay.")
@click.option("--max-attempts", type=int, default=5, show_default=True)
@click.option("--lease-seconds", type=float, default=checks.DEFAULT_LEASE_SECONDS, show_default=True,
              help="Lease length a claim gets unless the worker asks for another.")
@click.option("--timeout", type=float, default=None,
              help="Seconds one attempt may run; a worker stops an attempt that runs longer and gives its lease "
                   "up (reason timeout).")
@click.option("--deadline", "deadline_text", metavar="TIME|AGE", default=None,
              help="The latest time the task may start: an ISO 8601 time, or a duration from now (10m, 2h). "
                   "Not started by then, it ends expired.")
@click.option("--approval-required", "approval", flag_value="required", default=None,
              help="The task waits in awaiting_approval until an operator approves it (leaseq approve) "
                   "or denies it.")
@click.option("--approval-deadline", type=float, default=None, metavar="SECONDS",
              help="With --approval-required: deny it if nobody decided within this many seconds.")
@click.option("--after", "after_text", metavar="IDS", multiple=True,
              help="Task ids (comma-separated, or the option repeated) this task waits for: it stays waiting "
                   "until every one has completed.")
@click.option("--on-dependency-failure", type=click.Choice(["cancel", "block"]), default="cancel",
              show_default=True, help="What this task does if one it waits for ends without success.")
@click.option("--limit", "limit_keys", metavar="KEY", multiple=True,
              help="A limit the task counts against (see `leaseq limits`); repeat for more.")
@click.option("--units", type=int, default=1, show_default=True,
              help="The task's weight in limits that count units.")
@click.option("--budget", "budget_items", metavar="KEY=UNITS", multiple=True,
              help="What the task may consume of KEY over all its attempts (ctx.consume), as tokens=200000; "
                   "repeat for more keys. Past it, the task pauses for an approval (leaseq approve "
                   "--raise-budget).")
@click.option("--action", "action_names", metavar="NAME", multiple=True,
              help="An action the task may begin (ctx.effect); repeat for more. None given: any action of an "
                   "idempotent or side_effect task.")
@click.option("--resource", "resource_keys", metavar="KEY", multiple=True,
              help="A resource the task's effects may name (an action token is bound to it); repeat for more. "
                   "None given: its effects name none.")
@click.option("--singleton", "singleton_key", metavar="KEY", default=None,
              help="A singleton key: at most one unfinished task per key in the queue (see --on-conflict).")
@click.option("--on-conflict", type=click.Choice(["skip", "cancel_running", "queue"]), default="skip",
              show_default=True, help="With --singleton, when a task holds the key: skip (return it, add nothing), "
                                      "cancel_running (cancel it, add this one) or queue (add this one behind a "
                                      "running one; at most one waits).")
@click.option("--debounce", type=float, default=None, metavar="SECONDS",
              help="Collapse enqueues with the same --debounce-key inside this window into one task.")
@click.option("--debounce-key", default=None, metavar="KEY", help="The key debounced enqueues collapse by.")
@click.option("--debounce-mode", type=click.Choice(["trailing", "leading"]), default="trailing", show_default=True,
              help="trailing: runs --debounce seconds after the last enqueue, with the last payload; leading: "
                   "the first runs at once, the rest of the window is dropped.")
@click.option("--max-delay", type=float, default=None, metavar="SECONDS",
              help="With trailing --debounce: run no later than this many seconds after the first enqueue.")
@click.option("--fairness-key", default=None, metavar="KEY",
              help="The tenant (or any group) the task is served for: within one priority, claims serve the keys "
                   "with tasks queued in weighted round robin.")
@click.option("--fairness-weight", type=float, default=1.0, show_default=True, metavar="WEIGHT",
              help="With --fairness-key: the key's share against other keys' (2: twice as many tasks as a key "
                   "of weight 1).")
@json_option
@click.pass_context
def enqueue(ctx: click.Context, kind: str, payload: str | None, queue: str, effect: str | None, no_check: bool,
            key: str | None, singleton_key: str | None, on_conflict: str, debounce: float | None,
            debounce_key: str | None, debounce_mode: str, max_delay: float | None,
            priority: int, delay: float, at_text: str | None, max_attempts: int, lease_seconds: float,
            timeout: float | None, deadline_text: str | None, approval: str | None,
            approval_deadline: float | None, after_text: tuple[str, ...], on_dependency_failure: str,
            limit_keys: tuple[str, ...], units: int, budget_items: tuple[str, ...], action_names: tuple[str, ...],
            resource_keys: tuple[str, ...], fairness_key: str | None, fairness_weight: float,
            as_json: bool) -> None:
    """Add a task of KIND to a queue.

    With --key, a task already holding that key in the queue is returned
    ("existing task N returned") and nothing is added; if it was enqueued
    with a different kind, payload or option (effect, priority,
    --fairness-key, --fairness-weight, --max-attempts, --lease-seconds, --timeout, --deadline, approval,
    --after, --limit, --units, --action, --resource; not --delay or --at), that is an error
    naming what differs and the task (exit 2).

    The kind is looked up among what registered workers declared: a kind no
    worker has served, or a queue other than the one its newest worker
    declared it on, is enqueued with a warning; a payload that does not fit
    the declared handler's signature is refused, naming the argument (exit
    2), and nothing is written; the effect defaults to the declared one.
    --no-check skips the look-up.

    With --singleton, a task holding the key is returned ("skipped") unless
    --on-conflict says otherwise; with --debounce and --debounce-key,
    repeated enqueues collapse into one task ("collapsed into task N").
    """
    document = parse_json_option("payload", payload)
    budget = parse_budget(budget_items)
    deadline = _parse_deadline(deadline_text) if deadline_text is not None else None
    at = _parse_at(at_text) if at_text is not None else None
    if at is not None and ctx.get_parameter_source("delay") is not click.core.ParameterSource.DEFAULT:
        raise CliError("at", "give --at or --delay, not both")
    q = open_queue(ctx)
    unserved, declared_queue = False, None
    if no_check:
        effect = effect or "read_only"
    else:
        declaration = q.kind_declaration(kind)
        unserved = declaration is None
        declared_queue = None if declaration is None else declaration["queue"]
        effect = check_enqueue(declaration, document, effect)
    if at is not None:
        delay = _delay_until(q, at)
    before = q.now() if key is not None else None
    try:
        task = q.enqueue(kind, document, effect=effect, queue=queue, idempotency_key=key, priority=priority,
                         delay=delay, max_attempts=max_attempts, lease_seconds=lease_seconds, timeout=timeout,
                         deadline=deadline, approval=approval, approval_deadline=approval_deadline,
                         by=f"cli:{default_actor()}", after=_parse_after(after_text),
                         on_dependency_failure=on_dependency_failure, limits=list(limit_keys) or None, units=units,
                         actions=list(action_names) or None, resources=list(resource_keys) or None,
                         singleton_key=singleton_key, on_conflict=on_conflict, debounce=debounce,
                         key=debounce_key, debounce_mode=debounce_mode, max_delay=max_delay, budget=budget,
                         fairness_key=fairness_key, fairness_weight=fairness_weight)
    except InvalidInput as exc:
        if at is not None and exc.field == "delay":
            raise CliError("at", f"{at.isoformat()} is too far ahead: the delay {exc.problem}") from None
        if exc.field == "key":  # the debounce key: --key is the idempotency key here
            raise CliError("debounce_key", exc.problem) from None
        raise
    if unserved:  # said once the task is written: a refused enqueue says only why
        click.echo(f"warning: no registered worker serves kind {kind!r}: the task waits until one does "
                   f"(--no-check for a kind served by workers that registered elsewhere)", err=True)
    elif declared_queue is not None and declared_queue != task.queue:  # a mistyped --queue, most likely
        click.echo(f"warning: kind {kind!r} is declared on queue {declared_queue!r}, not {task.queue!r}: the task "
                   f"waits for a worker that claims from {task.queue!r} (leaseq worker --queue {task.queue})",
                   err=True)
    # A key that names a task enqueued with other options was refused above
    # (IdempotencyKeyConflict, rendered as one line naming `key`): the rule is the engine's.
    existing = before is not None and as_datetime(task.created_at) < before
    if as_json:
        emit_json(task)
        return
    if existing:
        line = Text.assemble(f"existing task {task.id} returned (key {task.idempotency_key} is taken in "
                             f"{task.queue}; nothing added): now ", status_text(task.status))
        make_console().print(line, soft_wrap=True)
        return
    if _told_flow_outcome(q, task):
        return
    line = Text.assemble(f"task {task.id} ", status_text(task.status),
                         Text(f" in {task.queue}: {task.kind} ({task.effect}), key {task.idempotency_key}"))
    wait = (as_datetime(task.available_at) - q.now()).total_seconds()
    if wait > 0:
        line.append(f", due in {fmt_duration(wait)}")
    make_console().print(line, soft_wrap=True)  # one line, so scripts can grep it


def _parse_after(texts: tuple[str, ...]) -> list[int] | None:
    """The task ids of ``--after`` (comma-separated, repeatable); None when not given."""
    ids = []
    for part in (p.strip() for text in texts for p in text.split(",")):
        if not part.isdigit() or int(part) < 1:
            raise CliError("after", f"must be task ids, comma-separated (got {part!r})")
        ids.append(int(part))
    return ids or None


def _delay_until(q: Queue, at: datetime) -> float:
    """Seconds from the database's now until ``at``; a time not in the future is an error naming ``at``."""
    now = q.now()
    delay = (at - now).total_seconds()
    if delay <= 0:
        raise CliError("at", f"{at.isoformat()} is not in the future (database time "
                             f"{now.astimezone(timezone.utc).isoformat(timespec='seconds')}); "
                             f"omit --at to make the task due now")
    return delay


@click.command("ls")
@click.option("--status", default=None, help="Only tasks in this status.")
@click.option("--queue", default=None, help="Only tasks of this queue.")
@click.option("--limit", type=int, default=50, show_default=True, help="At most this many, newest first.")
@json_option
@click.pass_context
def ls(ctx: click.Context, status: str | None, queue: str | None, limit: int, as_json: bool) -> None:
    """List tasks, newest first."""
    q = open_queue(ctx)
    tasks = q.list_tasks(status=status, queue=queue, limit=limit)
    if as_json:
        emit_json(tasks)
        return
    console = make_console()
    if not tasks:
        console.print("no tasks" + (" matching the filters" if status or queue else ""))
        return
    console.print(task_table(tasks, now=q.now()))


@click.command()
@click.argument("task_id", metavar="TASK")
@json_option
@click.pass_context
def show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Show a task, its evidence trail and effects.

    The evidence trail is a timeline of every transition (claims with their
    generation, lease endings and why, intents, responses, operator actions);
    the effects ledger lists each tool-call intent and its response.
    """
    q = open_queue(ctx)
    task = q.get(checks.check_task_id(task_id))  # the argument is text: "abc" names the field
    events = [dataclasses.replace(e, at=as_datetime(e.at)) for e in q.events(task.id)]
    effects = q.effects(task.id)
    streamed = q.stream_stats(task.id)
    if as_json:
        emit_json({"task": task, "events": events, "effects": effects, "stream": streamed})
        return
    console = make_console()
    console.print(task_details(task, now=q.now()))
    console.print()
    console.print(Text("evidence trail", style="bold"))
    console.print(timeline(events))
    if effects:
        console.print()
        console.print(Text("effects ledger", style="bold"))
        console.print(effects_table(effects))
    if streamed["attempts"]:
        console.print()
        console.print(Text("stream", style="bold"))
        console.print(stream_summary(streamed), soft_wrap=True)


def stream_summary(streamed: dict[str, Any]) -> str:
    """What ``leaseq show`` says of a task's stream: its size, and each attempt's part of it."""
    attempts = streamed["attempts"]
    lines = [f"{streamed['items']} item(s), {streamed['durable']} durable, in {len(attempts)} attempt(s); "
             f"last cursor {streamed['last_seq']} (leaseq stream {streamed['task_id']})"]
    for a in attempts:
        lines.append(f"  generation {a['generation']}: {a['items']} item(s) ({a['durable']} durable), "
                     f"cursors {a['first_seq']}-{a['last_seq']}")
    return "\n".join(lines)


@click.command()
@click.argument("task_id", metavar="TASK")
@click.option("--timeout", type=float, default=None,
              help="Seconds to wait at most (default: no limit). When the time runs out: exit status 3.")
@json_option
@click.pass_context
def wait(ctx: click.Context, task_id: str, timeout: float | None, as_json: bool) -> None:
    """Wait until TASK has ended or is parked for a person, then print it.

    Returns once the task is completed, dead, cancelled,
    needs_reconciliation, blocked, denied or expired (exit status 0,
    whichever it is: the line or the JSON says which). On PostgreSQL the
    wait is woken by a notification; on SQLite it looks every 50 ms.
    """
    q = open_queue(ctx)
    try:
        task = q.wait(checks.check_task_id(task_id), timeout=timeout)
    except TimeoutError as exc:
        raise CliError("timeout", str(exc), exit_code=3) from None
    if as_json:
        emit_json(task)
        return
    if _told_flow_outcome(q, task):
        return
    line = Text.assemble(f"task {task.id} ", status_text(task.status), Text(f" ({task.kind})"))
    if task.last_error and task.status != "completed":
        line.append(f": {task.last_error}")
    make_console().print(line, soft_wrap=True)


@click.command()
@click.argument("task_id", metavar="TASK")
@click.option("--after", default="0", show_default=True, metavar="CURSOR",
              help="Print the entries after this cursor (an entry's number, as printed): resume where you stopped.")
@click.option("--follow/--no-follow", default=True, show_default=True,
              help="Wait for new entries until the task has ended or is parked for a person (like tail -f); "
                   "--no-follow prints what is there and exits.")
@click.option("--timeout", type=float, default=None,
              help="Stop following after this many seconds (default: no limit).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per entry, one per line.")
@click.pass_context
def stream(ctx: click.Context, task_id: str, after: str, follow: bool, timeout: float | None, as_json: bool) -> None:
    """Print TASK's stream: what its handler emits (ctx.emit), entry by entry.

    Each line is an entry: its cursor (#N), the attempt (generation) that wrote it,
    and the item as JSON. Every attempt begins with a reset entry: the items the
    earlier attempts emitted are void then, except durable ones (emitted with
    durable=True), which stand. Follows by default until the task has ended or is
    parked for a person; the last line (on stderr) says how it stands.
    """
    q = open_queue(ctx)
    tid = checks.check_task_id(task_id)
    try:
        cursor = int(after.strip())
    except ValueError:
        raise CliError("after", f"must be a cursor, an integer 0 or more (got {after!r})") from None
    last = None
    for entry in q.stream(tid, after=cursor, follow=follow, timeout=timeout):
        last = entry.seq
        if as_json:
            click.echo(json.dumps(jsonable(entry), ensure_ascii=False))
        elif entry.reset:
            click.echo(f"#{entry.seq} generation {entry.generation} reset: attempt {entry.generation} begins "
                       "(the items of earlier attempts are void unless durable)")
        else:
            durable = " durable" if entry.durable else ""
            click.echo(f"#{entry.seq} generation {entry.generation}{durable} item "
                       f"{json.dumps(entry.item, ensure_ascii=False)}")
    where = "" if last is None else f"; resume with --after {last}"
    click.echo(f"task {tid} is {q.get(tid).status}{where}", err=True)


def _told_flow_outcome(q: Any, task: Any) -> bool:
    """Print what a singleton or debounced enqueue did instead of adding a task; False when it added one."""
    if task.enqueue_outcome == "skipped":
        line = Text.assemble(f"existing task {task.id} returned (singleton key {task.singleton_key} is held in "
                             f"{task.queue}; nothing added): now ", status_text(task.status))
    elif task.enqueue_outcome == "collapsed":
        line = Text.assemble(f"collapsed into task {task.id} (debounce key {task.debounce_key} in {task.queue}): ",
                             status_text(task.status))
        wait = (as_datetime(task.available_at) - q.now()).total_seconds()
        if wait > 0:
            line.append(f", due in {fmt_duration(wait)}")
    else:
        return False
    make_console().print(line, soft_wrap=True)
    return True
