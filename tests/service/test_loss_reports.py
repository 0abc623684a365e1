"""Loss reports: one ``lease_lost`` per lost generation, none for a generation that
ended by its holder's own hand, enforced by the ``report_loss`` query, on both
backends, in-process and over HTTP."""

from __future__ import annotations

import threading

import pytest

import leaseq

from .conftest import Service
from .support import snapshot, wait_until


def losses(q: leaseq.Queue, task_id: int) -> list[tuple[str | None, int | None]]:
    return [(e.worker_id, e.generation) for e in q.events(task_id) if e.type == "lease_lost"]


def test_one_loss_report_per_lost_generation(q: leaseq.Queue) -> None:
    a, b = q.register_worker("a"), q.register_worker("b")
    task = q.enqueue("job")
    [first] = q.claim(a, lease_seconds=0.5)
    wait_until(q, first.expires_at)
    [second] = q.claim(b)  # a's generation is lost: routed by expiry, re-claimed by b
    q.report_loss(a, first, "worker saw: heartbeat refused")
    for _ in range(3):
        with pytest.raises(leaseq.InvalidTransition, match="already reported"):
            q.report_loss(a, first, "worker saw: heartbeat refused")
    assert losses(q, task.id) == [(a.id, first.generation)]
    # b's generation is lost too (revoked): it may report that one, once
    q.revoke_worker(b)
    q.report_loss(b, second, "worker saw: revoked")
    with pytest.raises(leaseq.InvalidTransition):
        q.report_loss(b, second, "again")
    assert losses(q, task.id) == [(a.id, first.generation), (b.id, second.generation)]


@pytest.mark.parametrize("ending", ["complete", "fail", "fail_dead", "release"])
def test_no_loss_report_for_a_generation_its_holder_ended(q: leaseq.Queue, dsn: str, ending: str) -> None:
    w = q.register_worker("w")
    task = q.enqueue("job", max_attempts=1 if ending == "fail_dead" else 5)
    [claim] = q.claim(w)
    if ending == "complete":
        q.complete(w, claim, {"ok": True})
    elif ending.startswith("fail"):
        q.fail(w, claim, "boom")
    else:
        q.release(w, claim, "shutting down")
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidTransition, match="ended by its holder"):
        q.report_loss(w, claim, "worker saw: nothing, it is lying")
    assert snapshot(dsn) == before
    assert losses(q, task.id) == []


def test_racing_loss_reports_write_one(q: leaseq.Queue) -> None:
    """Threads report the same lost generation at once, many times over: the task
    row lock taken before the report_loss statement lets exactly one through."""
    w = q.register_worker("w")
    tasks = [q.enqueue("job", {"i": i}) for i in range(12)]
    claims = q.claim(w, limit=len(tasks), lease_seconds=300)
    q.revoke_worker(w)  # every lease is lost at once
    for claim in claims:
        barrier = threading.Barrier(6)
        outcomes: list[str] = []

        def report() -> None:
            barrier.wait()
            try:
                q.report_loss(w, claim, "worker saw: revoked")
                outcomes.append("written")
            except leaseq.InvalidTransition:
                outcomes.append("refused")

        threads = [threading.Thread(target=report) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["refused"] * 5 + ["written"], outcomes
        assert losses(q, claim.task_id) == [(w.id, claim.generation)]


def test_loss_reports_over_http(svc: Service) -> None:
    rq = svc.remote(svc.token("worker", all_queues=True))
    w = rq.register_worker("w")
    lost_task = rq.enqueue("job")
    done_task = rq.enqueue("job")
    claims = {c.task_id: c for c in rq.claim(w, limit=2, lease_seconds=60)}
    rq.complete(w, claims[done_task.id], None)
    svc.http(svc.token("operator")).post(f"/v1/tasks/{lost_task.id}/cancel", json={"reason": "no longer needed"})
    rq.report_loss(w, claims[lost_task.id], "worker saw: lease cancelled")
    with pytest.raises(leaseq.InvalidTransition, match="already reported"):
        rq.report_loss(w, claims[lost_task.id], "worker saw: lease cancelled")
    with pytest.raises(leaseq.InvalidTransition, match="ended by its holder"):
        rq.report_loss(w, claims[done_task.id], "worker saw: nothing")
    assert losses(svc.q, lost_task.id) == [(w.id, claims[lost_task.id].generation)]
    assert losses(svc.q, done_task.id) == []
    raw = svc.http(svc.token("worker", all_queues=True))
    resp = raw.post(f"/v1/workers/{w.id}/tasks/{lost_task.id}/loss",
                    json={"generation": claims[lost_task.id].generation, "reason": "again"})
    assert resp.status_code == 403  # another token's worker
