"""An agent proposes a refund, a person approves it, the payments worker performs it exactly once.

Real worker processes on both backends: an agent worker records an intent
and is killed (``os._exit``) before its attempt ends; the next agent worker
reruns the task, whose intent is answered from the ledger (the same child,
no second one). An operator approves some intents and denies the others;
two executor processes then race for the approved ones. The downstream
ledger (a file each execution appends to) shows every approved refund
exactly once and no denied one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import leaseq
from leaseq.auth import AccessDenied

from .conftest import wait_for

APP = textwrap.dedent('''
    import os

    import leaseq

    app = leaseq.App()

    @app.task("agent.refund", effect="idempotent", queue="agents", actions=["intend:payments.refund"])
    def propose(ctx, order, cents):
        child = ctx.intend("payments.refund", {"order": order, "cents": cents}, key=f"refund-{order}",
                           queue="payments", approval="required")
        if order == 1 and ctx.task.attempts == 1:
            os._exit(1)  # the agent's worker dies after recording the intent, before its attempt ends
        return {"proposed": child}

    @app.task("payments.refund", effect="side_effect", queue="payments", actions=["payments.refund"])
    def refund(ctx, order, cents):
        with ctx.effect("payments.refund", key=f"refund:{order}") as fx:
            if not fx.replayed:
                with open(os.environ["REFUND_LEDGER"], "a") as ledger:
                    ledger.write(f"{order} {cents} {os.getpid()}\\n")
                fx.record({"refunded": cents})
        return fx.response
''')


def _worker(dsn: str, cwd, queue: str, log, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "leaseq.cli.main", "--dsn", dsn, "worker", "refund_app:app", "--queue", queue,
         "--poll-interval", "0.1", "--lease-seconds", "1", "--concurrency", "2", "--log-level", "warning"],
        cwd=cwd, stdout=log, stderr=log, env={**os.environ, **env})


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(timeout=30)


@pytest.mark.timeout(180)
def test_the_agent_proposes_a_person_approves_the_executor_pays_once(dsn, tmp_path):
    (tmp_path / "refund_app.py").write_text(APP)
    ledger = tmp_path / "refunds.txt"
    ledger.touch()
    q = leaseq.connect(dsn)
    q.migrate()
    try:
        agents = [q.enqueue("agent.refund", {"order": n, "cents": 100 * n}, queue="agents", effect="idempotent",
                            actions=["intend:payments.refund"], priority=10 if n == 1 else 0, lease_seconds=1)
                  for n in range(1, 7)]
        log = open(tmp_path / "workers.log", "a")
        # the first agent worker takes order 1 first, records its intent and dies
        first = _worker(dsn, tmp_path, "agents", log)
        assert first.wait(timeout=60) == 1, (tmp_path / "workers.log").read_text()
        assert q.get(agents[0].id).status == "running"  # its lease outlives the process, until it expires
        assert len(q.list_tasks(queue="payments")) >= 1
        second = _worker(dsn, tmp_path, "agents", log)
        try:
            wait_for(lambda: all(q.get(t.id).status == "completed" for t in agents), timeout=60, interval=0.1)
        finally:
            _stop([second])
        children = {t.payload["order"]: t for t in q.list_tasks(queue="payments")}
        assert sorted(children) == [1, 2, 3, 4, 5, 6]  # one intent per order, none twice
        assert all(t.status == "awaiting_approval" for t in children.values())
        for t in agents:
            order = t.payload["order"]
            assert q.get(t.id).result == {"proposed": children[order].id}
            assert q.approval(children[order].id).requested_by == f"task:{t.id}"
        recorded = [e for e in q.events(agents[0].id) if e.type == "intent_recorded"]
        assert len(recorded) == 1 and q.get(agents[0].id).attempts == 2  # the rerun replayed it
        assert ledger.read_text() == ""  # nothing runs before a person decides

        for order in (1, 2, 3, 4):
            shown = q.approval(children[order].id)
            q.approve(children[order].id, shown.digest, note="matches the order", by="alice")
        for order in (5, 6):
            q.deny(children[order].id, reason="not eligible for a refund", by="bob")

        executors = [_worker(dsn, tmp_path, "payments", log, REFUND_LEDGER=str(ledger)) for _ in range(2)]
        try:
            wait_for(lambda: all(q.get(children[o].id).status == "completed" for o in (1, 2, 3, 4)), timeout=60,
                     interval=0.1)
        finally:
            _stop(executors)
        lines = [line.split() for line in ledger.read_text().splitlines()]
        assert sorted(int(order) for order, _cents, _pid in lines) == [1, 2, 3, 4]  # each exactly once
        assert all(int(cents) == 100 * int(order) for order, cents, _pid in lines)
        for order in (5, 6):
            denied = q.get(children[order].id)
            assert denied.status == "denied" and denied.claim_generation == 0
            assert not [e for e in q.events(denied.id) if e.type == "claimed"]
        for order in (1, 2, 3, 4):
            assert q.get(children[order].id).result == {"refunded": 100 * order}
    finally:
        q.close()


def test_a_handler_never_decides_an_intent_of_its_worker_or_its_task(app: leaseq.App) -> None:
    """In-process worker: the agent's sync handler tries to approve and deny the intent it just
    recorded, then an async handler of another task, on the same worker, tries to approve it. Each is
    refused (the runtime's context names the worker and the task); a person outside any handler decides."""
    q = app.queue
    q.migrate()
    refused: dict[str, str] = {}

    @app.task("agent.propose", effect="idempotent", queue="agents", actions=["intend:payments.refund"])
    def propose(ctx: leaseq.TaskContext, order: int) -> int:
        child = ctx.intend("payments.refund", {"order": order}, key="refund", queue="payments",
                           approval="required")
        shown = q.approval(child)
        for name, decide in (("approve", lambda: q.approve(child, shown.digest, note="mine")),
                             ("deny", lambda: q.deny(child, "withdrawn"))):
            try:
                decide()
            except AccessDenied as exc:
                refused[f"its own task: {name}"] = str(exc)
        return child

    @app.task("agent.review", effect="idempotent", queue="agents")
    async def review(ctx: leaseq.TaskContext) -> int:
        [child] = (await ctx.aresults()).values()
        aq = leaseq.AsyncQueue(q)
        shown = await aq.approval(child)
        try:
            await aq.approve(child, shown.digest, note="looks fine")
        except AccessDenied as exc:
            refused["another task of its worker, async"] = str(exc)
        return int(child)

    first = propose.enqueue(order=7)
    q.enqueue("agent.review", queue="agents", effect="idempotent", after=[first.id])
    app.run_worker(until_idle=True)

    child = q.get(first.id).result
    req = q.approval(child)
    assert (req.decision, q.get(child).status) == (None, "awaiting_approval")
    assert req.requested_worker is not None and req.requested_by == f"task:{first.id}"
    assert set(refused) == {"its own task: approve", "its own task: deny", "another task of its worker, async"}
    assert all(f"requested by worker {req.requested_worker}" in message for message in refused.values())
    assert not [e for e in q.events(child) if e.type in ("approved", "denied")]
    assert q.approve(child, req.digest, by="alice").status == "queued"
