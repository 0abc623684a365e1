"""Operator and admin actions over HTTP, with the actor's identity; retention."""

from __future__ import annotations

import leaseq
from leaseq import auth
from leaseq.access import tokens

from .conftest import Service, serve
from .support import age_tasks, error_of

DAY = 86400.0


def _finished(q: leaseq.Queue, status: str, queue: str = "default") -> int:
    """A task of ``queue`` that ended in ``status``, with an effect and events."""
    w = q.register_worker("w")
    t = q.enqueue("job", {"doc": status}, effect="side_effect", queue=queue)
    [c] = q.claim(w, queue=queue)
    fx = q.begin_effect(w, c, "email.send")
    if status == "needs_reconciliation":
        q.release(w, c, "stopped")
        return t.id
    q.finish_effect(w, c, fx, {"id": 1})
    if status == "completed":
        q.complete(w, c, {"answer": 42})
    elif status == "cancelled":
        q.cancel(t.id, "no longer wanted", by="test")
    else:
        q.fail(w, c, "key revoked", block=status == "blocked", retry=status != "dead")
    assert q.get(t.id).status == status
    return t.id


def test_reconcile_over_http_records_who_and_why(svc: Service) -> None:
    task_id = _finished(svc.q, "needs_reconciliation")
    ops = svc.http(svc.token("operator", "alice"))
    resp = ops.post(f"/v1/tasks/{task_id}/reconcile",
                    json={"outcome": "completed", "note": "mail log shows it was sent", "result": {"sent": True}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "completed" and resp.json()["result"] == {"sent": True}
    [event] = [e for e in svc.q.events(task_id) if e.type == "reconciled"]
    assert event.detail["by"].startswith("alice (operator token ")
    assert event.detail["note"] == "mail log shows it was sent"
    [entry] = [e for e in auth.audit_log(svc.q) if e["action"] == "reconcile"]
    assert entry["target"] == f"task:{task_id}" and entry["actor"] == event.detail["by"]
    again = ops.post(f"/v1/tasks/{task_id}/reconcile", json={"outcome": "requeue", "note": "again"})
    assert again.status_code == 409 and error_of(again)["code"] == "invalid_transition"


def test_pause_records_the_actor(svc: Service) -> None:
    ops = svc.http(svc.token("operator", "bob"))
    assert ops.post("/v1/queues/mail/pause", json={"create": True}).json() == {"queue": "mail", "paused": True}
    [row] = svc.q.queues()
    assert row["paused"] and row["changed_by"].startswith("bob (operator token ")
    overview = ops.get("/v1/queues").json()["queues"]
    assert [(q["name"], q["paused"]) for q in overview] == [("mail", True)]


def test_pausing_an_unknown_queue_is_refused_unless_created(svc: Service) -> None:
    """A mistyped queue name is refused (422, field queue, naming the known queues) and switches
    nothing; "create": true switches a queue before its first task."""
    ops = svc.http(svc.token("operator", "bob"))
    svc.q.enqueue("job", queue="default")
    svc.q.pause("mail", create=True, by="setup")
    for verb in ("pause", "resume"):
        refused = ops.post(f"/v1/queues/defualt/{verb}")
        assert refused.status_code == 422, refused.text
        error = error_of(refused)
        assert (error["code"], error["field"]) == ("invalid", "queue")
        assert "'defualt' is not a known queue" in error["message"]
        assert "known queues: default, mail" in error["message"] and '"create": true' in error["message"]
    for body in ({"create": "yes"}, {"create": 1}, {"create": None}):  # a JSON boolean, or left out
        assert ops.post("/v1/queues/defualt/pause", json=body).status_code == 422, body
    assert [r["name"] for r in svc.q.queues()] == ["mail"]
    assert ops.post("/v1/queues/default/pause").json() == {"queue": "default", "paused": True}  # it had a task
    assert ops.post("/v1/queues/mail/resume").json() == {"queue": "mail", "paused": False}  # it has a switch
    created = ops.post("/v1/queues/fresh/pause", json={"create": True})
    assert created.json() == {"queue": "fresh", "paused": True}
    assert [(r["name"], bool(r["paused"])) for r in svc.q.queues()] == [("default", True), ("fresh", True),
                                                                        ("mail", False)]


def test_timeline_groups_the_evidence_by_generation(svc: Service) -> None:
    q = svc.q
    a, b = q.register_worker("a"), q.register_worker("b")
    t = q.enqueue("job", {"k": 1}, effect="idempotent")
    [c1] = q.claim(a, lease_seconds=5)
    q.heartbeat(a, c1)
    q.release(a, c1, "draining")
    [c2] = q.claim(b)
    fx = q.begin_effect(b, c2, "crm.update")
    q.finish_effect(b, c2, fx, {"ok": True})
    q.complete(b, c2, {"done": 1})
    view = svc.http(svc.token("viewer")).get(f"/v1/tasks/{t.id}/timeline").json()
    first, second = view["attempts"]
    assert (first["generation"], first["worker_id"], first["heartbeats"]["heartbeats"]) == (1, a.id, 1)
    # the worker's free-text reason is hidden from a viewer like a payload...
    assert first["ended"] == "released by the holder: [redacted]" and first["routed_to"] == "queued"
    granted = svc.http(svc.token("viewer", read_payloads=True)).get(f"/v1/tasks/{t.id}/timeline").json()
    assert granted["attempts"][0]["ended"] == "released by the holder: draining"  # ...unless granted
    assert (second["generation"], second["worker_id"], second["ended"]) == (2, b.id, "completed by the holder")
    assert [(f["action"], f["status"], f["response"]) for f in second["effects"]] == \
        [("crm.update", "done", "[redacted]")]
    assert view["task"]["result"] == "[redacted]"
    assert [e["type"] for e in view["other_events"]] == ["enqueued"]


def test_prune_keeps_what_incident_review_needs(q: leaseq.Queue, dsn: str) -> None:
    ids = {s: _finished(q, s, queue=f"q-{s}") for s in
           ("completed", "cancelled", "dead", "blocked", "needs_reconciliation")}
    recent = _finished(q, "completed", queue="q-recent")
    payload_only = _finished(q, "completed", queue="q-payload")
    queued = q.enqueue("job", {"waiting": True}, queue="q-queued").id
    age_tasks(dsn, [*ids.values(), queued], 40 * DAY)
    age_tasks(dsn, [payload_only], 10 * DAY)
    events_before = {i: len(q.events(i)) for i in (*ids.values(), recent, payload_only, queued)}

    counts = q.prune(30 * DAY, payloads_older_than_seconds=7 * DAY, batch=1)
    ended = (ids["completed"], ids["cancelled"], ids["dead"])
    assert counts["tasks"] == 3 and counts["effects"] == 3 and counts["payloads"] == 1
    # each trail's "enqueued" entry is the task row itself, pruned with it rather than counted as an event
    assert counts["events"] == sum(events_before[i] for i in ended) - 3
    assert counts["evidence"] == sum(events_before[i] for i in ended)  # the evidence record keeps each entry
    for gone in ended:
        try:
            q.get(gone)
        except leaseq.NotFound:
            assert q.evidence_record(gone)[0]["type"] == "enqueued"  # what incident review needs stays
            continue
        raise AssertionError(f"task {gone} was not pruned")
    for kept in (ids["blocked"], ids["needs_reconciliation"], queued, recent, payload_only):
        assert len(q.events(kept)) == events_before[kept]
    blanked = q.get(payload_only)
    assert blanked.payload is None and blanked.result is None and len(q.effects(payload_only)) == 1
    assert q.get(recent).result == {"answer": 42} and q.get(ids["blocked"]).payload == {"doc": "blocked"}
    assert q.prune(30 * DAY, payloads_older_than_seconds=7 * DAY) == {
        "tasks": 0, "events": 0, "effects": 0, "payloads": 0, "evidence": 0, "evidence_pruned": 0, "audit_pruned": 0,
        "streams": 0, "spend_pruned": 0, "flow_keys_pruned": 0, "fairness_pruned": 0}


def test_prune_refuses_bad_input(q: leaseq.Queue) -> None:
    for bad in (-1, "30d", float("nan"), None):
        try:
            q.prune(bad)  # type: ignore[arg-type]
        except leaseq.InvalidInput as exc:
            assert exc.field == "older_than_seconds"
        else:
            raise AssertionError(f"prune({bad!r}) was accepted")


def test_the_service_applies_retention_on_its_own_schedule(q: leaseq.Queue, dsn: str) -> None:
    old = _finished(q, "completed")
    age_tasks(dsn, [old], 40 * DAY)
    with serve(q, prune_older_than=30 * DAY, prune_every=3600) as (url, app):
        assert app.state.maintenance.signals.wait("prune", timeout=10)
    try:
        q.get(old)
        raise AssertionError("retention did not prune the old task")
    except leaseq.NotFound:
        pass
    [entry] = [e for e in auth.audit_log(q) if e["action"] == "prune"]
    assert entry["actor"] == "service retention" and entry["detail"]["tasks"] == 1
    assert entry["detail"]["evidence_older_than_seconds"] == 365 * DAY  # the default
    assert [e["type"] for e in q.evidence_record(old)][:2] == ["enqueued", "claimed"]


def test_the_service_applies_the_evidence_retention_it_is_given(q: leaseq.Queue, dsn: str) -> None:
    old = _finished(q, "dead")
    age_tasks(dsn, [old], 40 * DAY)
    with serve(q, prune_older_than=30 * DAY, prune_payloads_older_than=DAY, prune_evidence_older_than=35 * DAY,
               prune_every=3600) as (url, app):
        assert app.state.maintenance.signals.wait("prune", timeout=10)
    try:
        q.get(old)
        raise AssertionError("retention did not prune the old dead task")
    except leaseq.NotFound:
        pass
    assert q.evidence_record(old) == []  # it ended 40 days ago: past the evidence retention too


def test_admin_prunes_and_manages_tokens_over_http(svc: Service) -> None:
    admin = svc.http(svc.token("admin", "root"))
    old = _finished(svc.q, "completed")
    age_tasks(svc.dsn, [old], 2 * DAY)
    resp = admin.post("/v1/prune", json={"older_than_seconds": DAY, "evidence_older_than_seconds": 0.5 * DAY})
    assert resp.status_code == 422 and error_of(resp)["field"] == "evidence_older_than_seconds"
    resp = admin.post("/v1/prune", json={"older_than_seconds": DAY, "evidence_older_than_seconds": 30 * DAY})
    assert resp.status_code == 200 and resp.json()["tasks"] == 1 and resp.json()["evidence_pruned"] == 0
    assert svc.q.evidence_record(old)
    created = admin.post("/v1/tokens", json={"name": "ci", "role": "worker", "queues": ["builds"],
                                             "expires_in": 3600}).json()
    assert created["token"].startswith(f"lq_{created['id']}_") and created["queues"] == ["builds"]
    listed = {t["id"]: t for t in admin.get("/v1/tokens").json()["tokens"]}
    assert listed[created["id"]]["role"] == "worker"
    assert all("secret_hash" not in t and "token" not in t for t in listed.values())
    tokens = len(auth.list_tokens(svc.q))
    for body in ({"name": "x", "role": "admin", "queues": ["a"]}, {"name": "x", "role": "worker"}):
        bad = admin.post("/v1/tokens", json=body)
        assert bad.status_code == 422 and error_of(bad)["field"] == "queues", bad.text
    assert len(auth.list_tokens(svc.q)) == tokens
    assert admin.delete(f"/v1/tokens/{created['id']}").json()["revoked"] is True
    assert admin.delete("/v1/tokens/000000000000").status_code == 404


def test_the_operator_api_checks_its_token_on_the_event_loop(svc: Service, monkeypatch) -> None:
    """Every operator request begins with the token check; on PostgreSQL it is awaited on the
    server's event loop (one statement), not run on a thread of its own before the route's."""
    import threading

    from .test_worker_batch import _spy_transactions

    task = svc.q.enqueue("job", {"n": 1})
    ops = svc.http(svc.token("operator", "alice"))
    blocking, asyncio_side = _spy_transactions(svc.q.store, monkeypatch)
    loop_threads: set[str] = set()
    real_verify = tokens.averify_token

    async def watched(q: leaseq.Queue, token: str | None) -> auth.Principal:
        loop_threads.add(threading.current_thread().name)
        return await real_verify(q, token)

    monkeypatch.setattr(tokens, "averify_token", watched)
    for _ in range(3):
        resp = ops.get(f"/v1/tasks/{task.id}")
        assert resp.status_code == 200 and resp.json()["id"] == task.id
    assert len(loop_threads) == 1 and "AnyIO" not in next(iter(loop_threads))  # the server's own loop thread
    if svc.q.native_async:
        # the lookup, then the record of use (due at a new token's first request); then the lookups alone
        assert len(asyncio_side) == 4 and set(asyncio_side) == loop_threads
        assert len(blocking) == 3  # each request's read of the task, in the route's thread
    else:  # SQLite: the check runs in a thread, as every SQLite transaction
        assert len(blocking) == 3 + 4
    assert ops.get(f"/v1/tasks/{task.id}", headers={"Authorization": "Bearer lq_000000000000_x"}).status_code == 401


def test_an_enqueue_over_http_never_leaves_the_event_loop_on_postgresql(svc: Service, monkeypatch) -> None:
    """POST /v1/tasks, a producer's hot call: its token check and its insert are both awaited
    on the server's loop with the asyncio driver (SQLite runs them in threads)."""
    from .test_worker_batch import _spy_transactions

    ops = svc.http(svc.token("operator", "producer"))
    assert ops.post("/v1/tasks", json={"kind": "warm"}).status_code == 201  # the record of use, done
    blocking, asyncio_side = _spy_transactions(svc.q.store, monkeypatch)
    resp = ops.post("/v1/tasks", json={"kind": "job", "payload": {"n": 1}, "priority": 2})
    assert resp.status_code == 201, resp.text
    if svc.q.native_async:
        # the token lookup, the kind's declared signature (payload check), the insert
        assert blocking == [] and len(asyncio_side) == 3
        assert len(set(asyncio_side)) == 1 and "AnyIO" not in asyncio_side[0]
    else:
        assert asyncio_side == [] and len(blocking) == 3
    assert svc.q.get(resp.json()["id"]).payload == {"n": 1}
    refused = ops.post("/v1/tasks", json={"kind": "job", "priority": "high"})
    assert refused.status_code == 422 and "priority" in refused.text


def test_an_enqueue_over_http_that_reuses_a_key_for_another_task_is_refused(svc: Service) -> None:
    """POST /v1/tasks with a key already used for another task: 422 ``idempotency_key_conflict``
    naming the fields and the task, and nothing written; the same enqueue is the same task (201)."""
    from snapshots import snapshot

    ops = svc.http(svc.token("operator", "producer"))
    first = ops.post("/v1/tasks", json={"kind": "summarize", "payload": {"doc_id": 2}, "idempotency_key": "doc-2"})
    assert first.status_code == 201, first.text
    again = ops.post("/v1/tasks", json={"kind": "summarize", "payload": {"doc_id": 2}, "idempotency_key": "doc-2",
                                        "delay": 30})
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
    tasks = lambda: {k: v for k, v in snapshot(svc.dsn).items() if k not in ("leaseq_tokens", "leaseq_leader")}  # noqa: E731
    before = tasks()
    resp = ops.post("/v1/tasks", json={"kind": "send_welcome", "payload": {"user_id": 99}, "effect": "side_effect",
                                       "idempotency_key": "doc-2"})
    assert resp.status_code == 422, resp.text
    error = error_of(resp)
    assert (error["code"], error["task_id"], error["idempotency_key"], error["queue"]) == (
        "idempotency_key_conflict", first.json()["id"], "doc-2", "default")
    assert error["fields"] == ["kind", "payload", "effect"]
    assert error["differences"]["kind"] == "its kind is 'summarize', not 'send_welcome'"
    gated = ops.post("/v1/tasks", json={"kind": "summarize", "payload": {"doc_id": 2}, "idempotency_key": "doc-2",
                                        "approval": "required"})
    assert gated.status_code == 422 and error_of(gated)["fields"] == ["approval"]
    assert tasks() == before
