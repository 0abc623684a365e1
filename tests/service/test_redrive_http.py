"""Redrive and bulk cancel over HTTP and through RemoteQueue: an operator token acts, a
queue-limited one only on its queues (naming one), others are refused; bad filters are a
422 naming the field. Both backends."""

from __future__ import annotations

import pytest

import leaseq
from leaseq import auth

from .support import error_of


def _dead(q: leaseq.Queue, w: leaseq.Worker, error: str, queue: str = "default") -> int:
    t = q.enqueue("mail", queue=queue, max_attempts=1)
    [c] = q.claim(w, queue=queue)
    q.fail(w, c, error, retry=False)
    return t.id


def test_an_operator_redrives_and_cancels_by_filter(svc) -> None:
    q = svc.q
    w = q.register_worker("w")
    dead = [_dead(q, w, "HTTP 429") for _ in range(2)]
    rq = svc.remote(svc.token("operator"))
    counted = rq.redrive(error="429", dry_run=True)
    assert (counted["matched"], counted["task_ids"]) == (2, dead)
    assert {q.get(i).status for i in dead} == {"dead"}
    done = rq.redrive(error="429", note="provider back")
    assert done["task_ids"] == dead and {q.get(i).status for i in dead} == {"queued"}
    gone = rq.cancel_where(status="queued", kind="mail", reason="not needed")
    assert gone["task_ids"] == dead and {q.get(i).status for i in dead} == {"cancelled"}
    actions = [e["action"] for e in auth.audit_log(q)]
    assert "redrive" in actions and "cancel_where" in actions


def test_a_queue_limited_operator_names_its_queue_and_others_are_refused(svc) -> None:
    q = svc.q
    w = q.register_worker("w")
    mine, theirs = _dead(q, w, "x", queue="mine"), _dead(q, w, "x", queue="theirs")
    http = svc.http(svc.token("operator", queues=["mine"]))
    assert http.post("/v1/tasks/redrive", json={}).status_code == 403
    assert http.post("/v1/tasks/redrive", json={"queue": "theirs"}).status_code == 403
    resp = http.post("/v1/tasks/redrive", json={"queue": "mine"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["task_ids"] == [mine] and q.get(theirs).status == "dead"
    viewer = svc.http(svc.token("viewer"))
    assert viewer.post("/v1/tasks/cancel-where", json={"status": "dead"}).status_code == 403
    assert q.get(theirs).status == "dead"


@pytest.mark.parametrize("route, body, field", [
    ("redrive", {"status": "queued"}, "status"),
    ("redrive", {"limit": 0}, "limit"),
    ("redrive", {"older_than": -1}, "older_than"),
    ("redrive", {"queue": "bad queue"}, "queue"),
    ("cancel-where", {}, "status"),
    ("cancel-where", {"status": ["queued", "completed"]}, "status"),
])
def test_bad_filters_are_a_422_naming_the_field(svc, route: str, body: dict, field: str) -> None:
    http = svc.http(svc.token("operator"))
    resp = http.post(f"/v1/tasks/{route}", json=body)
    assert resp.status_code == 422, resp.text
    assert error_of(resp)["field"] == field
