"""Budgets that cover the tree under the worker runtime, on both backends: a parent's budget
spent by the children it spawned pauses them mid-run (each at its next ledger step: a consume
or a tool call, as the handler stops in a durable wait), and approvals, one raising the
parent's budget, resume them from their ledgers with nothing repeated. Sync and async
handlers alike."""

from __future__ import annotations

import pytest

import leaseq
from leaseq.worker import WorkerRuntime
from leaseq_chaos.traces import validate_queue

from .conftest import RunningWorker, wait_for
from .tree_budget_app import TOK, run_tree, tree_app


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_budget_spent_by_the_children_pauses_them_mid_run_and_approvals_resume_them(
        app: leaseq.App, is_async: bool) -> None:
    q = app.queue
    made: list[tuple[int, int]] = []
    tree = tree_app(made, is_async=is_async)
    running = RunningWorker(WorkerRuntime(tree, q, concurrency=4, poll_interval=0.05))
    try:
        def approve(task_id: int, digest: str, more: dict[str, int] | None) -> None:
            q.approve(task_id, digest, raise_budget=more, by="ops")

        run_tree(q, made, lambda: q.enqueue("research", {"parts": 3}, budget={TOK: 500}), approve, wait_for)
    finally:
        running.stop()
    stats = running.runtime.stats
    assert stats.suspended >= 2 and stats.failed == 0 and stats.lost == 0  # the parent's wait, the pauses
    assert validate_queue(q) == []
