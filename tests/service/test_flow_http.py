"""Singletons and debounce over HTTP (``POST /v1/tasks``) and through RemoteQueue:
the same answers as Queue, and bad parameters a 422 naming the field. Both backends."""

from __future__ import annotations

import pytest

import leaseq

from .support import error_of


def test_a_remote_singleton_skips_cancels_and_queues(svc) -> None:
    rq = svc.remote(svc.token("worker", all_queues=True))
    first = rq.enqueue("sync", {"n": 1}, singleton_key="cust-1")
    assert (first.enqueue_outcome, first.singleton_key) == ("created", "cust-1")
    again = rq.enqueue("sync", {"n": 2}, singleton_key="cust-1")
    assert (again.id, again.enqueue_outcome) == (first.id, "skipped")
    w = rq.register_worker("w")
    [c] = rq.claim(w)
    behind = rq.enqueue("sync", {"n": 3}, singleton_key="cust-1", on_conflict="queue")
    assert behind.enqueue_outcome == "created" and behind.status == "queued"
    assert rq.claim(w) == []  # it waits behind the running one
    replaced = rq.enqueue("sync", {"n": 4}, singleton_key="cust-1", on_conflict="cancel_running")
    assert replaced.enqueue_outcome == "created"
    assert svc.q.get(first.id).status == "cancelled" and svc.q.get(behind.id).status == "cancelled"
    with pytest.raises(leaseq.LeaseLost):
        rq.complete(w, c, "late")


def test_a_remote_debounce_collapses(svc) -> None:
    rq = svc.remote(svc.token("worker", all_queues=True))
    a = rq.enqueue("reindex", {"n": 1}, debounce=60, key="repo")
    b = rq.enqueue("reindex", {"n": 2}, debounce=60, key="repo", max_delay=120)
    assert (b.id, b.enqueue_outcome, b.payload, b.debounce_key) == (a.id, "collapsed", {"n": 2}, "repo")
    c = rq.enqueue("ping", debounce=60, key="p", debounce_mode="leading")
    d = rq.enqueue("ping", debounce=60, key="p", debounce_mode="leading")
    assert (d.id, d.enqueue_outcome) == (c.id, "collapsed")


@pytest.mark.parametrize("body, field", [
    ({"singleton_key": ""}, "singleton_key"),
    ({"singleton_key": "k", "on_conflict": "replace"}, "on_conflict"),
    ({"on_conflict": "queue"}, "on_conflict"),
    ({"debounce": 5}, "key"),
    ({"debounce": -5, "key": "k"}, "debounce"),
    ({"debounce": 5, "key": "k", "debounce_mode": "middle"}, "debounce_mode"),
    ({"debounce": 5, "key": "k", "max_delay": 0}, "max_delay"),
    ({"debounce": 5, "key": "k", "singleton_key": "s"}, "debounce"),
])
def test_bad_flow_parameters_are_a_422_naming_the_field(svc, body: dict, field: str) -> None:
    http = svc.http(svc.token("operator"))
    resp = http.post("/v1/tasks", json={"kind": "job", **body})
    assert resp.status_code == 422, resp.text
    assert error_of(resp)["field"] == field
    assert svc.q.list_tasks() == []
