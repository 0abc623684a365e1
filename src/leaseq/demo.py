"""``leaseq demo``: the design note's story, played on a real queue in a few seconds.

Act 1: worker A claims a task and stalls past its lease; worker B claims it
(generation 2) and completes it; A wakes up and every write it tries is
refused with :class:`leaseq.LeaseLost`. Act 2: a side-effect task whose
worker recorded a tool-call intent and stalled before the response is routed
to ``needs_reconciliation`` instead of being retried, and an operator
reconciles it. Each act ends with the task's evidence trail.

Everything goes through :class:`leaseq.Queue`; nothing is simulated except
the stall, which is a real sleep past a real (short) lease.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from .cli.render import effects_table, make_console, status_text, timeline
from .core.errors import LeaseLost
from .core.model import Worker
from .queue import Queue, connect

#: The demo's lease, in seconds: short, so a stall can outlive it quickly.
DEMO_LEASE_SECONDS = 1.0
#: How far past the deadline (by the database's clock) the stalled worker sleeps.
STALL_MARGIN_SECONDS = 0.2


class DemoFailed(Exception):
    """The queue did something the story says it must not (the demo then exits 1)."""


class _Story:
    """Numbered narration, wrapped for an 80-column terminal."""

    def __init__(self, console: Console):
        self.console = console
        self.step = 0
        self.width = min(console.width, 80)

    def title(self, text: str) -> None:
        self.console.print()
        self.console.print(Text(text, style="bold underline"))

    def say(self, text: str) -> None:
        self.step += 1
        prefix = f"{self.step:>2}. "
        wrapped = textwrap.fill(text, width=self.width, initial_indent=prefix,
                                subsequent_indent=" " * len(prefix))
        self.console.print(Text(wrapped))

    def line(self, text: Text | str, indent: int = 6, style: str = "") -> None:
        if isinstance(text, str):
            text = Text(textwrap.fill(text, width=self.width, initial_indent=" " * indent,
                                      subsequent_indent=" " * indent), style=style)
        else:
            text = Text(" " * indent) + text
        self.console.print(text)


def _stall_until_expired(q: Queue, deadline: datetime) -> float:
    """Sleep until the database's clock is past ``deadline``; returns the seconds slept."""
    pause = max(0.0, (deadline - q.now()).total_seconds()) + STALL_MARGIN_SECONDS
    time.sleep(pause)
    return pause


def _refusals(story: _Story, attempts: list[tuple[str, Callable[[], Any]]]) -> None:
    """Run each stale call; print what was refused and why. Anything accepted is a failure."""
    for name, call in attempts:
        try:
            call()
        except LeaseLost as exc:
            # The reason reads "<call> refused: <why>"; the call is already in the first column.
            why = exc.reason.split("refused: ", 1)[-1]
            story.line(Text.assemble(("refused  ", "bold red"), (f"{name:<14} ", "bold"),
                                     Text(f"LeaseLost: {why}")))
        else:
            story.line(Text.assemble(("ACCEPTED ", "bold white on red"), name))
            raise DemoFailed(f"a stale worker's {name} was accepted")


def act_one(q: Queue, story: _Story, queue: str, a: Worker, b: Worker) -> int:
    """A stalls, B recovers, A is refused. Returns the task id."""
    story.title("Act 1: a stalled worker wakes up after another finished its task")
    task = q.enqueue("summarize", {"doc": 42}, effect="read_only", queue=queue, idempotency_key="summarize-doc-42")
    story.say(f'Task {task.id} "summarize" (effect read_only) is enqueued.')
    [claim_a] = q.claim(a, queue=queue, lease_seconds=DEMO_LEASE_SECONDS)
    story.say(f"A claims task {task.id}: generation {claim_a.generation}, a lease of "
              f"{DEMO_LEASE_SECONDS:g} s. A renews it once with a heartbeat.")
    deadline = q.heartbeat(a, claim_a)
    story.say("Then A stalls (a long GC pause, a lost connection, a laptop lid closed). It will sleep "
              "past its lease without noticing...")
    slept = _stall_until_expired(q, deadline)
    story.line(f"(A is asleep: {slept:.1f} s, past its lease)", style="dim")
    claims_b = q.claim(b, queue=queue, lease_seconds=DEMO_LEASE_SECONDS * 5)
    if not claims_b:
        raise DemoFailed("worker B could not claim the task whose lease expired")
    [claim_b] = claims_b
    story.say(f"A's lease has expired, by the database's clock. B asks for work and gets task "
              f"{task.id} with generation {claim_b.generation}. The claim routed the expired lease first: "
              f"read_only work is reclaimed, and the abandoned attempt is recorded.")
    result_b = {"summary": "three lines", "by": "worker-b"}
    q.complete(b, claim_b, result=result_b)
    story.say(f"B completes task {task.id} with its result.")
    story.say(f"A wakes up, still believing it holds generation {claim_a.generation}, and carries on:")
    _refusals(story, [
        ("heartbeat", lambda: q.heartbeat(a, claim_a)),
        ("complete", lambda: q.complete(a, claim_a, result={"summary": "stale", "by": "worker-a"})),
        ("fail", lambda: q.fail(a, claim_a, error="gave up")),
        ("begin_effect", lambda: q.begin_effect(a, claim_a, "publish.summary")),
    ])
    story.line(f"Why: every write is guarded by owner, generation and a live deadline; A holds "
               f"generation {claim_a.generation}, but the task has moved on to generation "
               f"{claim_b.generation} and is finished.", style="dim")
    final = q.get(task.id)
    if final.result != result_b or final.claim_generation != claim_b.generation:
        raise DemoFailed(f"task {task.id} does not hold B's result and generation")
    story.say(f"Task {task.id} holds B's result and generation {final.claim_generation}; nothing A "
              f"did after its lease ended was accepted.")
    story.line(Text.assemble("status ", status_text(final.status), Text(f"  result {json.dumps(final.result)}")))
    return task.id


def act_two(q: Queue, story: _Story, queue: str, a: Worker, b: Worker) -> int:
    """An ambiguous side effect goes to reconciliation, not to a retry. Returns the task id."""
    story.title("Act 2: an expired lease is not permission to retry")
    task = q.enqueue("send_welcome", {"user": 7}, effect="side_effect", queue=queue,
                     idempotency_key="welcome-user-7")
    story.say(f'Task {task.id} "send_welcome" (effect side_effect) is enqueued.')
    [claim_a] = q.claim(a, queue=queue, lease_seconds=DEMO_LEASE_SECONDS)
    fx = q.begin_effect(a, claim_a, "email.send")
    story.say(f"A claims it (generation {claim_a.generation}) and records its intent before calling the "
              f"mail provider: action email.send, idempotency key {fx.idempotency_key}.")
    story.say("A stalls before recording the provider's response. Did the email go out? "
              "The queue cannot know.")
    _stall_until_expired(q, claim_a.expires_at)
    claims_b = q.claim(b, queue=queue)
    routed = q.get(task.id)
    if claims_b or routed.status != "needs_reconciliation":
        raise DemoFailed(f"task {task.id} was {routed.status}, not routed to needs_reconciliation")
    story.say(f"A's lease has expired. B asks for work and gets nothing: the claim routed task "
              f"{task.id} to needs_reconciliation, because a retry could send the email twice.")
    story.line(Text.assemble("status ", status_text(routed.status)))
    story.say("A wakes up and tries to record the provider's response under its old generation:")
    _refusals(story, [("finish_effect", lambda: q.finish_effect(a, claim_a, fx, response={"id": "msg-1"}))])
    note = "provider log shows message msg-1 delivered; not resending"
    done = q.reconcile(task.id, "completed", note=note, result={"message_id": "msg-1"}, by="operator")
    story.say(f"An operator checks the provider's log and reconciles task {task.id}: outcome completed, "
              f"note \"{note}\". The open intent is marked reconciled.")
    story.line(Text.assemble("status ", status_text(done.status), Text(f"  result {json.dumps(done.result)}")))
    return task.id


#: What the demo's last lines suggest doing next.
NEXT_STEPS = (
    "Next: declare your own handlers with leaseq.App and @app.task, and run them with",
    "  leaseq worker yourmodule:app",
    "(the tutorial, docs/tutorial.md in the leaseq repository, walks through it).",
)


def run_demo(dsn: str | None = None, *, keep: bool = False, console: Console | None = None) -> int:
    """Play the demo; returns the exit status (0 when the queue behaved as the story says).

    ``dsn``: a database to use (its own queue name keeps the demo's tasks
    apart); by default a throwaway SQLite file in a temporary folder, removed
    afterwards unless ``keep``.
    """
    console = console or make_console()
    story = _Story(console)
    started = time.monotonic()
    folder = None
    if dsn is None:
        folder = Path(tempfile.mkdtemp(prefix="leaseq-demo-"))
        dsn = f"sqlite:///{folder / 'demo.db'}"
        queue_name = "demo"
    else:
        queue_name = f"demo-{uuid.uuid4().hex[:8]}"
    q = connect(dsn)
    try:
        q.migrate()
        console.print(Text("leaseq demo: a claim is borrowed time, not a status flag", style="bold"))
        console.print(Text(f"database {dsn}, queue {queue_name}", style="dim"))
        a = q.register_worker("worker-a")
        b = q.register_worker("worker-b")
        names = {a.id: "A", b.id: "B"}
        story.title("Two workers")
        story.say("The queue registers two workers and issues their identities (a worker never picks "
                  "its own):")
        story.line(f"A = {a.id}")
        story.line(f"B = {b.id}")
        for act in (act_one, act_two):
            task_id = act(q, story, queue_name, a, b)
            console.print()
            console.print(Text(f"Evidence trail of task {task_id}", style="bold"))
            console.print(timeline(q.events(task_id), names=names))
            effects = q.effects(task_id)
            if effects:
                console.print()
                console.print(Text(f"Effects ledger of task {task_id}", style="bold"))
                console.print(effects_table(effects))
    except DemoFailed as exc:
        console.print(Text(f"demo failed: {exc}", style="bold red"))
        return 1
    finally:
        q.close()
        if folder is not None and not keep:
            shutil.rmtree(folder, ignore_errors=True)
    console.print()
    console.print(Text(f"Done in {time.monotonic() - started:.1f} s.", style="bold"))
    if folder is not None and keep:
        # Paths are printed unwrapped, so they can be copied.
        console.print(Text("The database was kept. Look around:"))
        console.print(Text(f"  leaseq --dsn {dsn} show 1"), soft_wrap=True)
    for line in NEXT_STEPS:
        console.print(Text(line), soft_wrap=True)
    return 0
