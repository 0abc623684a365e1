"""Fair share over HTTP (``POST /v1/tasks``) and through RemoteQueue: the same fairness key
and weight as Queue, claims served in weighted round robin, and bad parameters a 422
naming the field. Both backends."""

from __future__ import annotations

import pytest

from .support import error_of


def test_a_remote_enqueue_carries_the_fairness_key_and_remote_claims_take_turns(svc) -> None:
    rq = svc.remote(svc.token("worker", all_queues=True))
    deep = [rq.enqueue("job", {"n": n}, fairness_key="deep", fairness_weight=2) for n in range(8)]
    late = rq.enqueue("job", {"n": 99}, fairness_key="late")
    assert (deep[0].fairness_key, deep[0].fairness_weight) == ("deep", 2.0)
    assert (late.fairness_key, late.fairness_weight) == ("late", 1.0)
    w = rq.register_worker("w")
    [first] = rq.claim(w)
    assert first.task.fairness_key in ("deep", "late")
    order = [first.task.fairness_key] + [c.task.fairness_key for c in rq.claim(w, limit=8)]
    assert order.count("late") == 1 and order.index("late") <= 2  # not behind the deep key's backlog
    assert svc.q.get(late.id).fairness_key == "late"


@pytest.mark.parametrize("body, field", [
    ({"fairness_weight": 2}, "fairness_weight"),
    ({"fairness_key": "t", "fairness_weight": 0}, "fairness_weight"),
    ({"fairness_key": "t", "fairness_weight": 5000}, "fairness_weight"),
    ({"fairness_key": ""}, "fairness_key"),
    ({"fairness_key": "t", "fairness_weight": "heavy"}, "fairness_weight"),
])
def test_bad_fairness_parameters_are_a_422_naming_the_field(svc, body: dict, field: str) -> None:
    http = svc.http(svc.token("operator"))
    resp = http.post("/v1/tasks", json={"kind": "job", **body})
    assert resp.status_code == 422, resp.text
    assert error_of(resp)["field"] == field
    assert svc.q.list_tasks() == []
