"""Queue scope for every role, worker tokens scoped by default, and the intent/executor split.

* A viewer or operator token limited to queues lists, reads and acts on the
  tasks of its queues only: a task on another queue is refused exactly as a
  task that does not exist; what spans every queue (workers, limits,
  metrics, revoking a worker, setting a limit) is refused with a clear
  error. Every refusal changes nothing. (Its dashboard: test_dashboard_scope.)
* A worker token names its queues, or opts in to every queue explicitly
  (``all_queues=True``, ``--all-queues``).
* A token may record an intent that runs without approval only on a queue
  it may not claim from itself, unless created with ``own_intents``.

Each rule over raw HTTP against a real server, on both backends.
"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

import leaseq
from leaseq import auth, authz
from leaseq.cli.main import cli
from leaseq.core.errors import InvalidInput

from .conftest import Service
from .support import error_of, snapshot


def _refused(resp: Any) -> str:
    assert resp.status_code == 403, (resp.status_code, resp.text)
    err = error_of(resp)
    assert err["code"] == "forbidden", err
    return str(err["message"])


def _two_queues(q: leaseq.Queue) -> tuple[leaseq.Task, leaseq.Task, leaseq.Task, leaseq.Task]:
    """A task and a gated task on queue "mine", and the same on queue "theirs"."""
    mine = q.enqueue("job", {"n": 1}, queue="mine")
    mine_gated = q.enqueue("job", {"n": 2}, queue="mine", approval="required")
    theirs = q.enqueue("job", {"n": 3}, queue="theirs")
    theirs_gated = q.enqueue("job", {"n": 4}, queue="theirs", approval="required")
    return mine, mine_gated, theirs, theirs_gated


def test_a_scoped_viewer_reads_only_its_queues(svc: Service) -> None:
    mine, mine_gated, theirs, theirs_gated = _two_queues(svc.q)
    viewer = svc.http(svc.token("viewer", "vic", queues=["mine"]))
    listed = viewer.get("/v1/tasks")
    assert listed.status_code == 200 and {t["id"] for t in listed.json()["tasks"]} == {mine.id, mine_gated.id}
    assert {t["id"] for t in viewer.get("/v1/tasks", params={"queue": "mine"}).json()["tasks"]} == \
        {mine.id, mine_gated.id}
    assert "may not use queue 'theirs'" in _refused(viewer.get("/v1/tasks", params={"queue": "theirs"}))
    assert [a["task_id"] for a in viewer.get("/v1/approvals").json()["approvals"]] == [mine_gated.id]
    _refused(viewer.get("/v1/approvals", params={"queue": "theirs"}))
    assert [row["name"] for row in viewer.get("/v1/queues").json()["queues"]] == ["mine"]
    # a task of another queue is refused exactly as one that does not exist
    missing = max(theirs.id, theirs_gated.id) + 1000
    for suffix in ("", "/events", "/effects", "/timeline", "/approval", "/wait?timeout=0",
                   "/dependency-results"):
        other = _refused(viewer.get(f"/v1/tasks/{theirs_gated.id}{suffix}"))
        nothing = _refused(viewer.get(f"/v1/tasks/{missing}{suffix}"))
        assert other.replace(str(theirs_gated.id), "N") == nothing.replace(str(missing), "N"), suffix
        assert viewer.get(f"/v1/tasks/{mine_gated.id}{suffix}").status_code == 200, suffix
    # what spans every queue is refused, with the reason
    for path in ("/v1/workers", "/v1/limits", "/metrics"):
        assert "limited to queues mine" in _refused(viewer.get(path)), path
    # an unlimited viewer still reads everything
    everyone = svc.http(svc.token("viewer", "val"))
    assert {t["id"] for t in everyone.get("/v1/tasks").json()["tasks"]} == \
        {mine.id, mine_gated.id, theirs.id, theirs_gated.id}
    assert everyone.get(f"/v1/tasks/{theirs.id}/events").status_code == 200
    assert everyone.get("/v1/workers").status_code == 200


def test_a_scoped_operator_acts_only_on_its_queues(svc: Service) -> None:
    mine, mine_gated, theirs, theirs_gated = _two_queues(svc.q)
    worker = svc.q.register_worker("w")
    svc.q.set_limit("api", max_running=2)
    operator = svc.http(svc.token("operator", "olga", queues=["mine"]))
    digest = svc.q.approval(theirs_gated.id).digest
    assert operator.get("/v1/tasks").status_code == 200  # its first use is recorded on the token
    before = snapshot(svc.dsn)
    for path, body in ((f"/v1/tasks/{theirs.id}/cancel", {"reason": "no"}),
                       (f"/v1/tasks/{theirs_gated.id}/approve", {"digest": digest}),
                       (f"/v1/tasks/{theirs_gated.id}/deny", {"reason": "no"}),
                       (f"/v1/tasks/{theirs.id}/requeue", {}),
                       (f"/v1/tasks/{theirs.id}/unblock", {"note": "fixed"}),
                       (f"/v1/tasks/{theirs.id}/reconcile", {"outcome": "cancel", "note": "checked"}),
                       ("/v1/queues/theirs/pause", None), ("/v1/queues/theirs/resume", None)):
        message = _refused(operator.post(path, json=body))
        assert "limited to queues mine" in message, (path, message)
    for path, message in ((f"/v1/workers/{worker.id}/revoke", "revoke workers"),
                          ("/v1/limits/api", "set limits")):
        call = operator.put(path, json={"max_running": 9}) if "limits" in path else operator.post(path)
        refusal = _refused(call)
        assert "limited to queues mine" in refusal and message in refusal and "every queue" in refusal
    assert "limited to queues mine" in _refused(operator.delete("/v1/limits/api"))
    refused_enqueue = operator.post("/v1/tasks", json={"kind": "job", "queue": "theirs"})
    assert "may not use queue 'theirs'" in _refused(refused_enqueue)
    assert snapshot(svc.dsn) == before  # nothing cancelled, decided, paused, revoked or audited
    # the same token acts on its own queue
    mine_digest = svc.q.approval(mine_gated.id).digest
    assert operator.post(f"/v1/tasks/{mine.id}/cancel", json={"reason": "done"}).status_code == 200
    approved = operator.post(f"/v1/tasks/{mine_gated.id}/approve", json={"digest": mine_digest})
    assert approved.status_code == 200 and approved.json()["status"] == "queued", approved.text
    assert operator.post("/v1/queues/mine/pause").status_code == 200
    assert operator.post("/v1/tasks", json={"kind": "job", "queue": "mine"}).status_code == 201
    assert svc.q.get(theirs.id).status == "queued" and svc.q.get(theirs_gated.id).status == "awaiting_approval"


def test_every_surface_decides_the_queue_in_authz(q: leaseq.Queue) -> None:
    """The MCP server and the CLI act through authz.perform: the same refusals."""
    _, _, theirs, _ = _two_queues(q)
    _, record = auth.create_token(q, name="olga", role="operator", queues=["mine"], created_by="test")
    principal = auth.Principal(token_id=record["id"], name="olga", role="operator", queues=frozenset({"mine"}),
                               read_payloads=True)
    with pytest.raises(auth.AccessDenied, match="limited to queues mine"):
        authz.perform(q, principal, "cancel", theirs.id, via="mcp", reason="no")
    [outcome] = authz.perform_many(q, principal, "cancel", [theirs.id], via="cli", reason="no")
    assert isinstance(outcome.error, auth.AccessDenied) and "limited to queues mine" in str(outcome.error)
    with pytest.raises(auth.AccessDenied, match="every queue"):
        authz.perform(q, principal, "revoke_worker", q.register_worker("w").id, via="mcp")
    with pytest.raises(auth.AccessDenied, match="every queue"):
        authz.authorize(principal, "read")  # the MCP server's overview, workers and inboxes
    assert q.get(theirs.id).status == "queued"


def test_worker_tokens_name_their_queues(q: leaseq.Queue, dsn: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        auth.create_token(q, name="w", role="worker", created_by="test")
    assert refused.value.field == "queues" and "all_queues" in str(refused.value)
    with pytest.raises(InvalidInput, match="not both"):
        auth.create_token(q, name="w", role="worker", queues=["a"], all_queues=True)
    with pytest.raises(InvalidInput) as admin:
        auth.create_token(q, name="root", role="admin", queues=["a"])
    assert admin.value.field == "queues"
    assert auth.list_tokens(q) == []
    result = CliRunner().invoke(cli, ["--dsn", dsn, "tokens", "create", "--role", "worker", "--name", "w"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == ("error: queue: a worker token is limited to the queues it serves: give "
                                     "--queue QUEUE (repeat for several), or --all-queues for every queue")
    assert auth.list_tokens(q) == []
    wide = CliRunner().invoke(cli, ["--dsn", dsn, "tokens", "create", "--role", "worker", "--name", "any",
                                    "--all-queues", "--json"])
    narrow = CliRunner().invoke(cli, ["--dsn", dsn, "tokens", "create", "--role", "viewer", "--name", "v",
                                      "--queue", "b", "--queue", "a"])
    assert wide.exit_code == 0 and narrow.exit_code == 0, (wide.output, narrow.output)
    assert {t["name"]: t["queues"] for t in auth.list_tokens(q)} == {"any": None, "v": ["a", "b"]}


def test_the_token_api_scopes_worker_tokens_by_default(svc: Service) -> None:
    admin = svc.http(svc.token("admin", "root"))
    before = len(auth.list_tokens(svc.q))
    refused = admin.post("/v1/tokens", json={"name": "w", "role": "worker"})
    assert refused.status_code == 422 and error_of(refused)["field"] == "queues"
    assert len(auth.list_tokens(svc.q)) == before
    wide = admin.post("/v1/tokens", json={"name": "w", "role": "worker", "all_queues": True})
    viewer = admin.post("/v1/tokens", json={"name": "v", "role": "viewer", "queues": ["a"]})
    assert wide.status_code == viewer.status_code == 201
    assert (wide.json()["queues"], viewer.json()["queues"]) == (None, ["a"])


def _agent(svc: Service, **options: Any) -> tuple[str, leaseq.Worker, leaseq.Claim]:
    token = svc.token("worker", "agent", **options)
    agent = svc.remote(token)
    svc.q.enqueue("agent.run", {"ticket": 1}, effect="idempotent", queue="agents",
                  actions=["intend:agent.note", "intend:payments.refund"])
    w = agent.register_worker("agent")
    [c] = agent.claim(w, queue="agents")
    return token, w, c


def _intent(svc: Service, token: str, w: leaseq.Worker, c: leaseq.Claim, queue: str, key: str,
            **extra: Any) -> Any:
    return svc.http(token).post(f"/v1/workers/{w.id}/tasks/{c.task_id}/intents",
                                json={"generation": c.generation, "kind": "agent.note", "payload": {},
                                      "key": key, "queue": queue, **extra})


def test_a_token_does_not_execute_its_own_intents(svc: Service) -> None:
    token, w, c = _agent(svc, queues=["agents"])
    before = snapshot(svc.dsn)
    message = _refused(_intent(svc, token, w, c, "agents", "inside"))
    assert "claim from queue 'agents' itself" in message and "approval='required'" in message
    assert "approval" in _refused(_intent(svc, token, w, c, "payments", "outside"))
    assert snapshot(svc.dsn) == before
    gated = _intent(svc, token, w, c, "agents", "gated", approval="required")
    assert gated.status_code == 200 and gated.json()["status"] == "awaiting_approval", gated.text


def test_a_token_for_every_queue_is_split_too(svc: Service) -> None:
    token, w, c = _agent(svc, all_queues=True)
    before = snapshot(svc.dsn)
    for queue in ("agents", "payments"):
        assert "intent/executor split" in _refused(_intent(svc, token, w, c, queue, f"k-{queue}"))
    assert snapshot(svc.dsn) == before
    gated = _intent(svc, token, w, c, "payments", "gated", approval="required")
    assert gated.status_code == 200 and gated.json()["status"] == "awaiting_approval", gated.text


def test_own_intents_is_an_explicit_opt_in(svc: Service) -> None:
    token, w, c = _agent(svc, queues=["agents"], own_intents=True)
    inside = _intent(svc, token, w, c, "agents", "inside")
    assert inside.status_code == 200 and inside.json()["status"] == "queued", inside.text
    # the opt-in does not widen the token's queues
    assert "approval" in _refused(_intent(svc, token, w, c, "payments", "outside"))
    with pytest.raises(InvalidInput) as viewer:
        auth.create_token(svc.q, name="v", role="viewer", own_intents=True)
    assert viewer.value.field == "own_intents"
    listed = {t["name"]: t["own_intents"] for t in auth.list_tokens(svc.q)}
    assert listed["agent"] is True
