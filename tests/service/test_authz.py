"""Authorization in one place, audited atomically, on both backends.

* Every operator action writes its audit entry in its own transaction: when
  the entry cannot be written (a trigger added to the test's schema refuses
  it), the action does not happen either, in-process, over HTTP and from the
  CLI; the CLI writes an entry as the local OS user.
* A worker token reads only the tasks its own workers hold or have held.
* A viewer without ``read_payloads`` never sees free text: payloads, results,
  errors, cancel reasons, reconcile/unblock/requeue notes, a worker's release
  and loss reasons, effect responses (JSON API and dashboard pages).
* The service's routes, the dashboard's forms and the CLI's commands for the
  operator actions come from the action table.
"""

from __future__ import annotations

import os
import re
import secrets
import sqlite3
import subprocess
import sys
from typing import Any

import httpx
import pytest

import leaseq
from leaseq import auth, authz
from leaseq.store import parse_dsn
from pg_modes import own_connection

from .conftest import Service
from .support import age_tasks, error_of, snapshot

REFUSED = "audit refused by the trigger of this test"


def refuse_audit(dsn: str) -> None:
    """Make every insert into the audit log fail, with a trigger in the test's own schema."""
    dialect, target = parse_dsn(dsn)
    if dialect == "sqlite":
        conn = sqlite3.connect(target)
        try:
            with conn:
                conn.execute(f"CREATE TRIGGER leaseq_test_refuse_audit BEFORE INSERT ON leaseq_audit "
                             f"BEGIN SELECT RAISE(ABORT, '{REFUSED}'); END")
        finally:
            conn.close()
        return
    with own_connection(target) as conn:
        conn.execute(f"CREATE FUNCTION leaseq_test_refuse_audit() RETURNS trigger LANGUAGE plpgsql AS "
                     f"$$ BEGIN RAISE EXCEPTION '{REFUSED}'; END $$")
        conn.execute("CREATE TRIGGER leaseq_test_refuse_audit BEFORE INSERT ON leaseq_audit "
                     "FOR EACH ROW EXECUTE FUNCTION leaseq_test_refuse_audit()")


def _task_in(q: leaseq.Queue, status: str) -> int:
    """A side-effect task in ``status``; ``running`` keeps its lease (with an open intent)."""
    queue = f"q-{secrets.token_hex(4)}"
    t = q.enqueue("job", {"n": 1}, effect="side_effect", queue=queue,
                  approval="required" if status == "awaiting_approval" else None)
    if status in ("queued", "awaiting_approval"):
        return t.id
    w = q.register_worker("setup")
    [c] = q.claim(w, queue=queue, lease_seconds=600)
    if status == "running":
        q.begin_effect(w, c, "email.send")
    elif status == "needs_reconciliation":
        q.begin_effect(w, c, "email.send")
        q.release(w, c, "setup")
    else:
        q.fail(w, c, "credential expired", block=status == "blocked", retry=status != "dead")
    assert q.get(t.id).status == status
    return t.id


def _target(q: leaseq.Queue, spec: authz.Action) -> Any:
    """Something the action can act on: a task in its first status (cancel: a running one), a queue, a
    worker holding a lease."""
    if spec.target == "task":
        return _task_in(q, "running" if spec.name == "cancel" else spec.statuses[0])
    if spec.target == "queue":  # a queue with a switch is known: pause and resume take it without create
        q.pause("spare", create=True, by="setup")
        if not spec.paused:
            q.resume("spare", by="setup")
        return "spare"
    w = q.register_worker("victim")
    queue = f"q-{secrets.token_hex(4)}"
    q.enqueue("job", queue=queue)
    q.claim(w, queue=queue, lease_seconds=600)
    return w.id


def _fields(q: leaseq.Queue, spec: authz.Action, target: Any) -> dict[str, Any]:
    """Valid values of the action's required fields (an approval names the task's digest)."""
    return {f.name: (f.choices[0][0] if f.choices else q.approval(target).digest if f.name == "digest"
                     else "checked") for f in spec.fields if f.required}


def test_an_action_whose_audit_entry_fails_does_not_happen(q: leaseq.Queue, dsn: str) -> None:
    operator = auth.Principal(token_id="0123456789ab", name="olga", role="operator", queues=None,
                              read_payloads=True)
    targets = {spec.name: _target(q, spec) for spec in authz.operator_actions()}
    old = _task_in(q, "queued")
    q.cancel(old, "finished long ago", by="setup")
    age_tasks(dsn, [old], 40 * 86400)
    refuse_audit(dsn)
    before = snapshot(dsn)
    for spec in authz.operator_actions():
        with pytest.raises(Exception, match=REFUSED):
            authz.perform(q, operator, spec.name, targets[spec.name], via="test",
                          **_fields(q, spec, targets[spec.name]))
        assert snapshot(dsn) == before, f"{spec.name} changed data without its audit entry"
    with pytest.raises(Exception, match=REFUSED):
        q.prune(30 * 86400, by="admin")
    assert snapshot(dsn) == before and q.get(old).status == "cancelled"


def test_audit_entries_are_written_with_the_action(q: leaseq.Queue) -> None:
    admin = auth.Principal(token_id="0123456789ab", name="ada", role="admin", queues=None, read_payloads=True)
    for spec in authz.operator_actions():
        target = _target(q, spec)
        authz.perform(q, admin, spec.name, target, via="test", **_fields(q, spec, target))
        entry = auth.audit_log(q, 1)[0]
        assert (entry["action"], entry["actor"], entry["detail"]["via"]) == \
            (spec.name, admin.actor, "test"), spec.name
        assert entry["target"] == f"{spec.target}:{target}"
    viewer = auth.Principal(token_id="0123456789ac", name="vera", role="viewer", queues=None, read_payloads=False)
    task = _task_in(q, "queued")
    with pytest.raises(auth.AccessDenied):
        authz.perform(q, viewer, "cancel", task, reason="no")
    assert q.get(task).status == "queued"
    with pytest.raises(leaseq.InvalidInput) as info:
        authz.perform(q, admin, "cancel", task, reason="r", note="not a field of cancel")
    assert info.value.field == "note"


def test_the_service_does_not_act_without_its_audit_entry(svc: Service) -> None:
    ops = svc.http(svc.token("operator", "olga"))
    ops.get("/v1/whoami").raise_for_status()  # the token's first use is recorded before the snapshot
    task = _task_in(svc.q, "running")
    refuse_audit(svc.dsn)
    before = snapshot(svc.dsn)
    resp = ops.post(f"/v1/tasks/{task}/cancel", json={"reason": "customer left"})
    assert resp.status_code == 500 and error_of(resp)["code"] == "internal"
    assert snapshot(svc.dsn) == before and svc.q.get(task).status == "running"


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LEASEQ_DSN", "LEASEQ_DEBUG")}
    return subprocess.run([sys.executable, "-m", "leaseq.cli.main", "--dsn", dsn, *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_the_cli_writes_its_audit_entry_in_the_action(q: leaseq.Queue, dsn: str) -> None:
    import getpass

    task = _task_in(q, "blocked")
    done = _cli(dsn, "unblock", str(task), "--note", "key rotated")
    assert done.returncode == 0, done.stderr
    assert f"task {task} unblocked: now queued" in done.stdout
    [entry] = auth.audit_log(q, 1)
    assert (entry["action"], entry["target"], entry["actor"]) == ("unblock", f"task:{task}",
                                                                 f"cli:{getpass.getuser()}")
    assert entry["detail"] == {"note": "key rotated", "via": "cli"}
    assert q.events(task)[-1].detail["by"] == entry["actor"]
    paused = _cli(dsn, "pause", "mail", "--create", "--json")  # no task on mail yet: --create
    assert paused.returncode == 0 and '"paused": true' in paused.stdout
    assert auth.audit_log(q, 1)[0]["action"] == "pause"
    # and with the audit log refusing, the CLI changes nothing and says so on one line
    other = _task_in(q, "queued")
    refuse_audit(dsn)
    before = snapshot(dsn)
    failed = _cli(dsn, "cancel", str(other), "--reason", "x")
    assert failed.returncode != 0 and REFUSED in failed.stderr and "Traceback" not in failed.stderr
    assert snapshot(dsn) == before


def test_worker_tokens_read_only_their_own_tasks(svc: Service) -> None:
    q = svc.q
    token_a, token_b = svc.token("worker", "a", all_queues=True), svc.token("worker", "b", all_queues=True)
    a, b = svc.http(token_a), svc.http(token_b)
    wa = a.post("/v1/workers", json={"name": "a"}).json()["id"]
    wa2 = a.post("/v1/workers", json={"name": "a2"}).json()["id"]
    wb = b.post("/v1/workers", json={"name": "b"}).json()["id"]
    mine = a.post("/v1/tasks", json={"kind": "job", "payload": {"n": 1}, "queue": "jobs"}).json()["id"]
    theirs = q.enqueue("job", {"secret": "b's payload"}, queue="jobs").id
    # enqueued by this token, but never held by its workers: not its to read
    resp = a.get(f"/v1/tasks/{mine}")
    assert resp.status_code == 403 and error_of(resp)["code"] == "forbidden"
    [claim] = a.post(f"/v1/workers/{wa}/claim", json={"queue": "jobs"}).json()["claims"]
    assert claim["task_id"] == mine
    assert a.get(f"/v1/tasks/{mine}").json()["payload"] == {"n": 1}  # held now
    a.post(f"/v1/workers/{wa}/tasks/{mine}/complete", json={"generation": 1, "result": {"ok": True}})
    assert a.get(f"/v1/tasks/{mine}").json()["result"] == {"ok": True}  # held before
    [other] = b.post(f"/v1/workers/{wb}/claim", json={"queue": "jobs"}).json()["claims"]
    assert other["task_id"] == theirs
    assert b.get(f"/v1/tasks/{theirs}").status_code == 200
    # another token's task, its payload and result: refused, as is a task that does not exist (same answer)
    for task_id in (theirs, theirs + 1000):
        resp = a.get(f"/v1/tasks/{task_id}")
        assert resp.status_code == 403 and error_of(resp)["code"] == "forbidden", resp.text
        assert "b's payload" not in resp.text
    assert b.get(f"/v1/tasks/{mine}").status_code == 403
    # the token, not the one worker, is the scope: a second worker of token A may read A's tasks
    queue = f"q-{secrets.token_hex(4)}"
    third = q.enqueue("job", queue=queue).id
    q.claim(wa2, queue=queue)
    assert a.get(f"/v1/tasks/{third}").status_code == 200
    # evidence trails and lists stay for readers
    for path in (f"/v1/tasks/{mine}/events", f"/v1/tasks/{mine}/effects", "/v1/tasks"):
        assert a.get(path).status_code == 403
    with pytest.raises(auth.AccessDenied):
        svc.remote(token_a).get(theirs)
    assert svc.remote(token_a).get(mine).status == "completed"


def _dashboard(svc: Service, token: str) -> httpx.Client:
    """A browser-like client logged in through the login form (hidden fields included)."""
    client = svc.http()
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', client.get("/login").text))
    resp = client.post("/login", data={**form, "token": token}, headers={"Origin": svc.url})
    assert resp.status_code == 303, resp.text
    return client


def test_viewers_never_see_free_text(svc: Service) -> None:
    q = svc.q
    mark = f"zz{secrets.token_hex(4)}"
    texts = {name: f"{mark}-{name}" for name in ("payload", "result", "error", "response", "cancel_reason",
                                                   "running_cancel", "reconcile_note", "unblock_note",
                                                   "requeue_note", "release_reason", "loss_reason")}
    w = q.register_worker("w")

    def leased(effect: str = "side_effect") -> leaseq.Claim:
        queue = f"q-{secrets.token_hex(4)}"
        q.enqueue("job", {"doc": texts["payload"]}, effect=effect, queue=queue)
        [c] = q.claim(w, queue=queue, lease_seconds=600)
        return c

    c = leased()
    fx = q.begin_effect(w, c, "crm.update")
    q.finish_effect(w, c, fx, {"echo": texts["response"]})
    q.complete(w, c, {"summary": texts["result"]})
    q.cancel(q.enqueue("job", queue="idle").id, texts["cancel_reason"], by="ops")
    q.cancel(leased().task_id, texts["running_cancel"], by="ops")
    c = leased()
    q.begin_effect(w, c, "email.send")
    q.report_loss(w, c, texts["loss_reason"])  # accepted while the lease is live; refused once released
    q.release(w, c, texts["release_reason"])
    q.reconcile(c.task_id, "requeue", texts["reconcile_note"], by="ops")
    c = leased()
    q.fail(w, c, texts["error"], block=True)
    q.unblock(c.task_id, texts["unblock_note"], by="ops")
    c = leased()
    q.fail(w, c, texts["error"], retry=False)
    q.requeue(c.task_id, texts["requeue_note"], by="ops")
    c = leased()
    q.fail(w, c, texts["error"], block=True)  # left blocked, for the inbox
    task_ids = [t.id for t in q.list_tasks(limit=1000)]

    def bodies(token: str) -> list[str]:
        api, page = svc.http(token), _dashboard(svc, token)
        out = [api.get(p).text for p in ("/v1/tasks?limit=1000", "/v1/queues", "/v1/workers", "/metrics")]
        for t in task_ids:
            out += [api.get(f"/v1/tasks/{t}{suffix}").text for suffix in ("", "/events", "/effects", "/timeline")]
            out.append(page.get(f"/tasks/{t}").text)
        out += [page.get(p).text for p in ("/", "/tasks?limit=1000", "/inbox")]
        return out

    seen = "\n".join(bodies(svc.token("viewer")))
    assert "[redacted]" in seen
    assert mark not in seen, sorted({m for m in re.findall(rf"{mark}-\w+", seen)})
    # the same pages show each text to a token granted read_payloads: the check above can fail
    granted = "\n".join(bodies(svc.token("viewer", read_payloads=True)))
    assert {name for name, text in texts.items() if text not in granted} == set()


def test_forms_routes_and_commands_come_from_the_table(svc: Service) -> None:
    from leaseq.cli.main import cli

    paths = httpx.get(f"{svc.url}/openapi.json").json()["paths"]
    for spec in authz.operator_actions():
        assert paths["/v1" + spec.route]["post"]["summary"] == spec.title, spec.name
        assert (spec.command in cli.commands) == spec.cli, spec.name
    # the dashboard offers each task action for its statuses, and only to roles that may take it
    by_status = {status: _task_in(svc.q, status) for status in ("queued", "needs_reconciliation", "blocked", "dead")}
    operator, viewer = _dashboard(svc, svc.token("operator")), _dashboard(svc, svc.token("viewer"))
    for status, task in by_status.items():
        offered = set(re.findall(r'<form method="post" action="/tasks/\d+/(\w+)"', operator.get(f"/tasks/{task}").text))
        expected = {a.name for a in authz.operator_actions("dashboard") if a.target == "task" and status in a.statuses}
        # the Send-signal form posts the signal's name and payload (POST /v1/tasks/{id}/signals/{name},
        # `leaseq signal`: not a table action); it is offered while the task has not ended
        assert ("signal" in offered) == (status != "dead"), status
        assert offered - {"signal"} == expected, status
        assert "<form method=\"post\" action=\"/tasks/" not in viewer.get(f"/tasks/{task}").text
    # the redrive page offers the bulk actions by filter the role may take, and no page to a role that may take none
    offered = set(re.findall(r'<option value="(redrive|cancel_where)"', operator.get("/redrive").text))
    assert offered == {a for a in ("redrive", "cancel_where") if authz.ACTIONS[a].right in auth.RIGHTS["operator"]}
    assert offered and viewer.get("/redrive").status_code == 403
    svc.q.enqueue("job", queue="mail")
    assert 'action="/queues/mail/pause"' in operator.get("/").text
    # an action posted to the route of another kind of target (a worker action on a task) has no route there
    html = operator.get("/").text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', html).group(1)
    resp = operator.post(f"/tasks/{by_status['queued']}/revoke_worker", data={"csrf": csrf},
                         headers={"Origin": svc.url})
    assert resp.status_code == 404
    assert svc.q.get(by_status["queued"]).status == "queued"
