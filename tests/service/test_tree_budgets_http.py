"""Budgets that cover the tree over HTTP: a remote worker's children spend their parent's
budget through the worker API, each stops at its next ledger step (the refusal travels as
``budget_spent`` with the figures, and the worker runtime takes it as a suspension), and an
operator's approval over HTTP raises the parent's budget and resumes them, repeating nothing."""

from __future__ import annotations

import pytest

import leaseq
from leaseq.worker import WorkerRuntime
from leaseq_chaos.traces import validate_queue
from worker.conftest import RunningWorker, wait_for
from worker.tree_budget_app import BUDGET, RAISE, TOK, run_tree, tree_app

from .conftest import Service
from .support import error_of


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_remote_workers_children_spend_the_parents_budget_and_an_operator_raises_it(svc: Service,
                                                                                       is_async: bool) -> None:
    q = svc.q
    made: list[tuple[int, int]] = []
    app = tree_app(made, is_async=is_async, name="tree-budgets-http")
    producer = svc.remote(svc.token("admin"))
    ops = svc.http(svc.token("operator", "alice"))
    remote = svc.remote(svc.token("worker", all_queues=True))
    running = RunningWorker(WorkerRuntime(app, remote, concurrency=4, poll_interval=0.05, grace=20))

    def approve(task_id: int, digest: str, more: dict[str, int] | None) -> None:
        body = {"digest": digest} if more is None else {"digest": digest, "raise_budget": more}
        if more is not None:  # a key the parent's budget does not name: refused, naming the field
            bad = ops.post(f"/v1/tasks/{task_id}/approve", json={"digest": digest, "raise_budget": {"other": 1}})
            assert bad.status_code == 422 and error_of(bad)["field"] == "raise_budget"
        resp = ops.post(f"/v1/tasks/{task_id}/approve", json=body)
        assert resp.status_code == 200, resp.text

    try:
        done = run_tree(q, made, lambda: producer.enqueue("research", {"parts": 3}, budget={TOK: BUDGET}),
                        approve, wait_for)
    finally:
        running.stop()
    assert q.get(done.id).budget == {TOK: BUDGET + RAISE}
    stats = running.runtime.stats
    assert stats.suspended >= 2 and stats.failed == 0 and stats.lost == 0
    assert validate_queue(q) == []


def test_a_ledger_step_of_a_spent_tree_is_refused_over_http_with_the_figures(svc: Service) -> None:
    q = svc.q
    remote = svc.remote(svc.token("worker", all_queues=True))
    w = remote.register_worker("w")
    parent = q.enqueue("parent", budget={TOK: 100}, effect="idempotent")
    [claim] = remote.claim(w, kinds=["parent"])
    one, two = (remote.spawn(w, claim, "child", key=f"c{n}", effect="idempotent") for n in range(2))
    leases = {c.task_id: c for c in remote.claim(w, kinds=["child"], limit=2)}
    paused = remote.consume(w, leases[one.id], "c0:consume:0", TOK, 150)
    assert paused["state"] == "paused" and paused["figures"]["owner"] == parent.id
    with pytest.raises(leaseq.BudgetSpent) as stopped:
        remote.begin_effect(w, leases[two.id], "search", "c1:search")
    assert stopped.value.figures == {"key": TOK, "budget": 100, "spent": 150, "owner": parent.id}
    assert isinstance(stopped.value, leaseq.LeaseLost) and q.effects(two.id) == []
    assert q.get(two.id).status == "awaiting_approval"
    listed = svc.http(svc.token("viewer")).get("/v1/approvals").json()
    requests = listed if isinstance(listed, list) else listed["approvals"]
    assert {r["task_id"]: r["detail"] for r in requests} == {
        one.id: {"key": TOK, "budget": 100, "spent": 150, "units": 150, "owner": parent.id},
        two.id: {"key": TOK, "budget": 100, "spent": 150, "owner": parent.id}}
