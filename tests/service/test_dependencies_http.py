"""Dependencies and waiting over HTTP: enqueue with ``after``, a remote worker's
``dependency_results`` (ctx.results), and the bounded long poll behind
``RemoteQueue.wait``. Both backends."""

from __future__ import annotations

import threading
import time

import pytest

import leaseq
from leaseq import auth

from .conftest import serve
from .support import error_of


def test_a_remote_worker_reads_the_results_of_the_tasks_its_task_waited_for(svc) -> None:
    rq = svc.remote(svc.token("worker", all_queues=True))
    w = rq.register_worker("agent")
    a, b = rq.enqueue("part", 1), rq.enqueue("part", 2)
    merge = rq.enqueue("merge", after=[a.id, b.id], on_dependency_failure="block")
    assert merge.status == "waiting"
    for claim in rq.claim(w, limit=5, kinds=["part"]):
        rq.complete(w, claim, {"part": claim.task.payload})
    assert svc.q.get(merge.id).status == "queued"
    [claim] = rq.claim(w, kinds=["merge"])
    assert rq.dependency_results(merge.id) == {a.id: {"part": 1}, b.id: {"part": 2}}
    # another worker token never held the task: refused, as for reading the task itself
    stranger = svc.remote(svc.token("worker", name="stranger", all_queues=True))
    with pytest.raises(auth.AccessDenied):
        stranger.dependency_results(merge.id)
    viewer = svc.http(svc.token("viewer", read_payloads=False))
    shown = viewer.get(f"/v1/tasks/{merge.id}/dependency-results").json()
    assert shown == {"results": [{"task_id": a.id, "result": "[redacted]"}, {"task_id": b.id, "result": "[redacted]"}]}
    rq.complete(w, claim, "merged")


def test_enqueue_after_an_unknown_or_failed_task_is_a_422_naming_the_field(svc) -> None:
    http = svc.http(svc.token("operator"))
    gone = svc.q.enqueue("gone")
    svc.q.cancel(gone.id, "no")
    for after in ([999_999], [gone.id], ["x"]):
        resp = http.post("/v1/tasks", json={"kind": "child", "after": after})
        assert resp.status_code == 422, resp.text
        assert error_of(resp)["code"] == "invalid"
        assert error_of(resp)["field"].startswith("after")
    resp = http.post("/v1/tasks", json={"kind": "child", "after": [], "on_dependency_failure": "shrug"})
    assert resp.status_code == 422 and error_of(resp)["field"] == "on_dependency_failure"
    assert [t.id for t in svc.q.list_tasks()] == [gone.id]


def test_the_wait_long_poll_answers_when_the_task_ends(svc) -> None:
    q = svc.q
    w = q.register_worker("w")
    t = q.enqueue("job")
    [c] = q.claim(w)
    http = svc.http(svc.token("operator"))
    started = time.monotonic()
    resp = http.get(f"/v1/tasks/{t.id}/wait", params={"timeout": 0.3})
    assert resp.status_code == 200 and time.monotonic() - started >= 0.3
    assert resp.json()["settled"] is False and resp.json()["task"]["status"] == "running"

    rq = svc.remote(svc.token("viewer", read_payloads=True))
    timer = threading.Timer(0.5, lambda: q.complete(w, c, result="done"))
    timer.start()
    got = rq.wait(t.id, timeout=20)
    timer.join()
    assert (got.status, got.result) == ("completed", "done")
    with pytest.raises(TimeoutError, match="still queued"):
        rq.wait(q.enqueue("idle").id, timeout=0.3)
    assert http.get("/v1/tasks/999999/wait", params={"timeout": 0}).status_code == 404
    assert http.get(f"/v1/tasks/{t.id}/wait", params={"timeout": -1}).status_code == 422


def test_the_client_asks_again_when_the_service_cuts_a_wait_short(q: leaseq.Queue) -> None:
    with serve(q, wait_limit=0.2) as (url, _app):
        token, _ = auth.create_token(q, name="op", role="operator", created_by="test")
        from leaseq.client import RemoteQueue

        with RemoteQueue(url, token, timeout=10) as rq:
            w = q.register_worker("w")
            t = q.enqueue("job")
            [c] = q.claim(w)
            timer = threading.Timer(1.0, lambda: q.fail(w, c, "no key", block=True))
            timer.start()
            got = rq.wait(t.id, timeout=20)  # five or so requests of 0.2 s each
            timer.join()
            assert got.status == "blocked"
