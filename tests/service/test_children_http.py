"""Child tasks over HTTP: a remote worker's parent spawns children and waits for them through
the worker API (the lease guard in the same code as directly), holding no lease meanwhile; a
token spawns only on its queues; operators cancel a tree with `POST /v1/tasks/{id}/cancel`
(``"tree": true`` answers the report)."""

from __future__ import annotations

from typing import Any

import pytest

import leaseq
from leaseq.core.errors import AccessDenied
from leaseq.worker import WorkerRuntime
from leaseq_chaos.traces import validate_queue
from worker.conftest import RunningWorker, wait_for


def test_a_remote_worker_fans_out_and_in(svc: Any) -> None:
    app = leaseq.App(name="children-http")

    @app.task("digest", max_attempts=1)
    async def digest(ctx: leaseq.TaskContext, urls: list[str]) -> list[Any]:
        handles = [await ctx.aspawn("fetch", {"url": u}, key=u) for u in urls]
        return await ctx.wait_for_all(handles)

    @app.task("fetch")
    def fetch(ctx: leaseq.TaskContext, url: str) -> dict[str, Any]:
        return {"url": url, "bytes": len(url)}

    q = svc.q
    parent = q.enqueue("digest", {"urls": ["a", "bb", "ccc"]})
    remote = svc.remote(svc.token("worker", all_queues=True))
    running = RunningWorker(WorkerRuntime(app, remote, concurrency=2, poll_interval=0.05, grace=20))
    try:
        wait_for(lambda: q.get(parent.id).status == "completed", timeout=30)
    finally:
        running.stop()
    assert q.get(parent.id).result == [{"url": "a", "bytes": 1}, {"url": "bb", "bytes": 2},
                                       {"url": "ccc", "bytes": 3}]
    kids = [t for t in q.list_tasks(limit=100) if t.kind == "fetch"]
    assert len(kids) == 3 and {t.parent_id for t in kids} == {parent.id}
    assert running.runtime.stats.lost == 0
    assert validate_queue(q) == []


def test_a_token_spawns_only_on_its_queues(svc: Any) -> None:
    q = svc.q
    q.enqueue("plan", {}, queue="alpha")
    remote = svc.remote(svc.token("worker", queues=["alpha"]))
    w = remote.register_worker("w")
    [claim] = remote.claim(w, queue="alpha")
    child = remote.spawn(w, claim, "step", {"n": 1}, key="here")  # its own queue, by default
    assert (child.queue, child.parent_id) == ("alpha", claim.task_id)
    with pytest.raises(AccessDenied):
        remote.spawn(w, claim, "step", {"n": 2}, key="there", queue="beta")
    assert [t.id for t in q.list_tasks(limit=100) if t.kind == "step"] == [child.id]
    bad = svc.http(svc.token("worker", queues=["alpha"]))
    answer = bad.post(f"/v1/workers/{w.id}/tasks/{claim.task_id}/children-wait",
                      json={"generation": claim.generation, "key": "k", "children": "all"})
    assert answer.status_code == 422  # not its worker, and not a list: refused either way, nothing written


def test_operators_cancel_a_tree_over_http(svc: Any) -> None:
    q = svc.q
    w = q.register_worker("w")
    root = q.enqueue("plan", {}, queue="alpha")
    [claim] = q.claim(w, queue="alpha")
    child = q.spawn(w, claim, "step", {}, key="one")
    operator = svc.http(svc.token("operator", name="ops", queues=["alpha"]))
    assert svc.http(svc.token("viewer")).post(f"/v1/tasks/{root.id}/cancel",
                                             json={"reason": "x", "tree": True}).status_code == 403
    assert operator.post(f"/v1/tasks/{root.id}/cancel", json={"reason": "x", "tree": "yes"}).status_code == 422
    answer = operator.post(f"/v1/tasks/{root.id}/cancel", json={"reason": "wrong plan", "tree": True})
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert (report["task_id"], report["status"], report["previous_status"]) == (root.id, "cancelled", "running")
    assert [(c["task_id"], c["disposition"], c["status"]) for c in report["children"]] == \
        [(child.id, "not_started", "cancelled")]
    [kept] = [e for e in q.events(root.id) if e.type == "tree_cancelled"]
    assert kept.detail["by"].startswith("ops (operator token ")
    with pytest.raises(leaseq.LeaseLost):
        q.complete(w, claim, None)  # the holder of the cancelled root is fenced off
