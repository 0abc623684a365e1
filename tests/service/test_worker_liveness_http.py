"""Over HTTP: a worker's registration records its kinds, its heartbeat and its stop;
the enqueue refuses a payload that does not fit a declared kind (422 naming the
field), takes the declared effect, and ``no_check`` skips the look-up."""

from __future__ import annotations

import leaseq
from leaseq.worker.registry import Registry

from .support import error_of


def _declarations() -> list[dict]:
    app = leaseq.App(queue=None, name="declared")

    @app.task("summarize", effect="side_effect", actions=["mail.send"])
    def summarize(ctx, doc_id: int, tags: list[str] | None = None) -> None:
        return None

    registry: Registry = app.registry
    return registry.declarations()


def test_a_remote_worker_records_its_kinds_heartbeat_and_stop(svc) -> None:
    remote = svc.remote(svc.token("worker", all_queues=True))
    w = remote.register_worker("remote", kinds=_declarations(), heartbeat_seconds=1.0, lease_seconds=3.0)
    [seen] = svc.q.workers()
    assert (seen.id, seen.kinds, seen.state) == (w.id, ["summarize"], "alive")
    assert svc.q.kind_declaration("summarize")["effect"] == "side_effect"
    remote.heartbeat_worker(w)
    remote.stop_worker(w, "deploy")
    [seen] = svc.q.workers()
    assert (seen.state, seen.stop_reason) == ("stopped", "deploy")
    # another token's worker: refused, nothing recorded
    other = svc.remote(svc.token("worker", "other", all_queues=True))
    stranger = other.register_worker("stranger", heartbeat_seconds=1.0, lease_seconds=3.0)
    third = svc.http(svc.token("worker", "third", all_queues=True))
    resp = third.post(f"/v1/workers/{stranger.id}/stopped", json={"reason": "x"})
    assert resp.status_code == 403, resp.text
    assert [x.state for x in svc.q.workers() if x.id == stranger.id] == ["alive"]


def test_a_registration_with_a_malformed_declaration_is_refused_naming_kinds(svc) -> None:
    http = svc.http(svc.token("worker", all_queues=True))
    for kinds in ([{"kind": "x"}], [{"kind": "x", "queue": "default", "effect": "nope"}],
                  [{"kind": "x", "queue": "default", "effect": "read_only", "signature": {"params": 1}}]):
        resp = http.post("/v1/workers", json={"name": "w", "kinds": kinds})
        assert resp.status_code == 422, resp.text
        assert error_of(resp)["field"] in ("kinds", "effect"), resp.text
    assert svc.q.workers() == []


def test_the_enqueue_refuses_a_payload_a_declared_kind_cannot_take(svc) -> None:
    svc.q.register_worker("w", kinds=_declarations(), heartbeat_seconds=1.0, lease_seconds=3.0)
    http = svc.http(svc.token("operator"))
    for payload, field in (([1, 2], "doc_id"), (None, "doc_id"), ({"doc": 9}, "doc"), ({"doc_id": "9"}, "doc_id")):
        resp = http.post("/v1/tasks", json={"kind": "summarize", "payload": payload})
        assert resp.status_code == 422, resp.text
        assert error_of(resp)["field"] == field, resp.text
    assert svc.q.list_tasks() == []  # nothing written
    ok = http.post("/v1/tasks", json={"kind": "summarize", "payload": {"doc_id": 1}})
    assert ok.status_code == 201 and ok.json()["effect"] == "side_effect", ok.text
    escaped = http.post("/v1/tasks", json={"kind": "summarize", "payload": {"doc": 9}, "no_check": True})
    assert escaped.status_code == 201 and escaped.json()["effect"] == "read_only", escaped.text
    unknown = http.post("/v1/tasks", json={"kind": "summarise", "payload": {"doc": 9}})
    assert unknown.status_code == 201, unknown.text


def test_metrics_show_workers_by_state_and_each_ones_stop_reason(svc) -> None:
    w = svc.q.register_worker("w", heartbeat_seconds=1.0, lease_seconds=3.0)
    svc.q.stop_worker(w, "deploy")
    svc.q.register_worker("hand")  # no heartbeat interval: unknown
    text = svc.http(svc.token("viewer")).get("/metrics").text
    assert 'leaseq_workers{state="stopped"} 1.0' in text and 'leaseq_workers{state="unknown"} 1.0' in text
    assert 'leaseq_workers{state="lost"} 0.0' in text
    assert f'leaseq_worker_info{{name="w",state="stopped",stop_reason="deploy",worker="{w.id}"}} 1.0' in text
