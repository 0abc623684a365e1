"""``leaseq tokens``, ``leaseq prune`` and a real ``leaseq serve`` process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import httpx
import pytest
from click.testing import CliRunner

import leaseq
from leaseq import auth
from leaseq.cli.main import cli

from .support import age_tasks


def run(dsn: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--dsn", dsn, *args])
    return result.exit_code, result.stdout, result.stderr


def test_tokens_create_list_revoke(q: leaseq.Queue, dsn: str) -> None:
    code, out, err = run(dsn, "tokens", "create", "--role", "worker", "--name", "builder", "--queue", "ci",
                         "--expires-in", "90d")
    assert code == 0, err
    token = out.strip()
    assert re.fullmatch(r"lq_[0-9a-f]{12}_[0-9a-f]{64}", token) and "shown only now" in err
    principal = auth.verify_token(q, token)
    assert (principal.role, principal.queues) == ("worker", frozenset({"ci"}))
    w = q.register_worker("builder", token_id=principal.token_id)

    code, out, _ = run(dsn, "tokens", "list", "--json")
    [row] = json.loads(out)
    assert row["id"] == principal.token_id and row["workers"] == 1 and "secret_hash" not in row
    assert token not in out and auth.hash_token(token) not in out
    code, out, _ = run(dsn, "tokens", "list")
    assert principal.token_id in out and "active" in out

    code, out, _ = run(dsn, "tokens", "revoke", principal.token_id)
    assert code == 0 and w.id in out
    assert q.renew_leases(w, []) == {} and q.workers()[0].revoked_at is not None
    [entry, created] = auth.audit_log(q)[:2]
    assert entry["action"] == "token_revoked" and entry["actor"].startswith("cli")
    assert created["action"] == "token_created"


def test_tokens_bad_input_is_one_line_and_changes_nothing(q: leaseq.Queue, dsn: str) -> None:
    for args, field in [(["create", "--role", "admin", "--name", "v", "--queue", "a"], "queues"),
                        (["create", "--role", "worker", "--name", "w"], "queue"),
                        (["create", "--role", "worker", "--name", "w", "--queue", "a", "--all-queues"], "queue"),
                        (["create", "--role", "viewer", "--name", "v", "--own-intents"], "own_intents"),
                        (["create", "--role", "worker", "--queue", "a", "--name", "bad name!"], "name"),
                        (["create", "--role", "worker", "--queue", "a", "--name", "w", "--expires-in", "soon"],
                         "expires_in"),
                        (["revoke", "nothex"], "token_id"),
                        (["revoke", "0123456789ab"], "task")]:
        code, out, err = run(dsn, "tokens", *args)
        assert code == 2 and out == "", (args, out, err)
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert auth.list_tokens(q) == []


def test_prune_command(q: leaseq.Queue, dsn: str) -> None:
    w = q.register_worker("w")
    t = q.enqueue("job", {"big": "payload"})
    [c] = q.claim(w)
    q.complete(w, c, {"r": 1})
    age_tasks(dsn, [t.id], 10 * 86400)
    code, out, _ = run(dsn, "prune", "--older-than", "30d", "--payloads-older-than", "7d", "--json")
    assert code == 0 and json.loads(out) == {"tasks": 0, "events": 0, "effects": 0, "payloads": 1, "evidence": 0,
                                             "evidence_pruned": 0, "audit_pruned": 0, "streams": 0,
                                             "spend_pruned": 0, "flow_keys_pruned": 0, "fairness_pruned": 0}
    assert q.get(t.id).payload is None and len(q.events(t.id)) == 3
    code, out, _ = run(dsn, "prune", "--older-than", "1w")
    assert code == 0 and out.startswith("pruned 1 task(s), 2 event(s)")  # the enqueued entry is the row itself
    assert "kept 3 and pruned 0 evidence entries" in out
    assert [e["type"] for e in q.evidence_record(t.id)] == ["enqueued", "claimed", "completed"]
    code, _, err = run(dsn, "prune", "--older-than", "1w", "--evidence-older-than", "5d")
    assert code == 2 and "evidence_older_than" in err and q.evidence_record(t.id)
    code, out, _ = run(dsn, "prune", "--older-than", "1d", "--evidence-older-than", "5d", "--json")
    assert code == 0 and json.loads(out)["evidence_pruned"] == 3 and q.evidence_record(t.id) == []
    code, _, err = run(dsn, "prune", "--older-than", "-3d")
    assert code == 2 and "older_than" in err


def test_serve_runs_until_sigterm(tmp_path) -> None:
    dsn = f"sqlite:///{tmp_path / 'served.db'}"
    env = {**os.environ, "LEASEQ_DSN": dsn}
    proc = subprocess.Popen([sys.executable, "-m", "leaseq.cli", "serve", "--port", "0", "--migrate",
                             "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert m, line
        url = m.group(1)
        q = leaseq.connect(dsn)
        token, _ = auth.create_token(q, name="ops", role="operator")
        q.close()
        assert httpx.get(f"{url}/healthz").json()["ok"] is True
        resp = httpx.post(f"{url}/v1/tasks", json={"kind": "hello"}, headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == 201 and resp.json()["status"] == "queued"
        assert httpx.get(f"{url}/openapi.json").json()["info"]["title"] == "leaseq"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert "leaseq service stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_serve_refuses_a_database_without_schema(tmp_path) -> None:
    code, out, err = run(f"sqlite:///{tmp_path / 'missing.db'}", "serve", "--port", "0")
    assert code == 2 and "leaseq migrate" in err


def test_serve_refuses_bad_maintenance_options(q: leaseq.Queue, dsn: str) -> None:
    for args, field in ((["--leader-lease", "0"], "leader_lease"), (["--leader-lease", "2h"], "leader_lease"),
                        (["--sweep-every", "soon"], "sweep_every"),
                        (["--prune-evidence-older-than", "400d"], "prune_evidence_older_than"),
                        (["--prune-older-than", "30d", "--prune-evidence-older-than", "7d"],
                         "prune_evidence_older_than"),
                        (["--prune-older-than", "30d", "--prune-evidence-older-than", "1y"],
                         "prune_evidence_older_than")):
        code, out, err = run(dsn, "serve", "--port", "0", *args)
        assert code == 2 and err.startswith(f"error: {field}: "), (args, err)


def test_serve_takes_its_retention_from_the_environment(q: leaseq.Queue, dsn: str) -> None:
    """Each option has its variable (LEASEQ_SERVE_<OPTION>), checked as the option is."""
    shown = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=200).stdout
    for name in ("LEASEQ_SERVE_PRUNE_OLDER_THAN", "LEASEQ_SERVE_PRUNE_PAYLOADS_OLDER_THAN",
                 "LEASEQ_SERVE_PRUNE_EVIDENCE_OLDER_THAN"):
        assert name in shown, name
    shown = CliRunner().invoke(cli, ["prune", "--help"], terminal_width=200).stdout
    assert "LEASEQ_PRUNE_EVIDENCE_OLDER_THAN" in shown
    result = CliRunner().invoke(cli, ["--dsn", dsn, "serve", "--port", "0"],
                                env={"LEASEQ_SERVE_PRUNE_OLDER_THAN": "30d",
                                     "LEASEQ_SERVE_PRUNE_EVIDENCE_OLDER_THAN": "7d"})
    assert result.exit_code == 2 and result.stderr.startswith("error: prune_evidence_older_than: "), result.stderr


def test_serve_refuses_a_bad_process_count(q: leaseq.Queue, dsn: str) -> None:
    for value in ("0", "65", "two"):
        code, out, err = run(dsn, "serve", "--port", "0", "--processes", value)
        assert code == 2 and "'--processes'" in err and "Traceback" not in err, (value, err)


def test_serve_logs_json_lines_with_the_task_fields(tmp_path) -> None:
    """``--log-format json``: every line an object; a worker's claims, completions, failures and
    refused leases each carry task id, kind (where known), generation, worker and duration."""
    from leaseq.client import RemoteQueue

    dsn = f"sqlite:///{tmp_path / 'served.db'}"
    with leaseq.connect(dsn) as q:
        q.migrate()
        token, _ = auth.create_token(q, name="w", role="worker", all_queues=True)
        ids = [q.enqueue("mail", {"n": i}).id for i in range(3)]
    proc = subprocess.Popen([sys.executable, "-m", "leaseq.cli", "--dsn", dsn, "serve", "--port", "0",
                             "--log-format", "json", "--log-level", "debug"], stderr=subprocess.PIPE, text=True)
    try:
        before = []  # at debug, uvicorn and maintenance speak before the listening line
        while not before or "listening on" not in before[-1]["message"]:
            line = proc.stderr.readline()
            assert line, "the service ended before listening"
            before.append(json.loads(line))
        url = re.search(r"listening on (http://127\.0\.0\.1:\d+)", before[-1]["message"]).group(1)
        assert before[-1]["level"] == "info" and before[-1]["logger"] == "leaseq.service"
        with RemoteQueue(url, token) as remote:
            w = remote.register_worker("mailer")
            claims = remote.claim(w, limit=3)
            assert sorted(c.task_id for c in claims) == ids
            assert remote.complete_many(w, [(claims[0], "sent")]) == {ids[0]}
            assert remote.complete_many(w, [(claims[0], "again")]) == set()  # refused: already completed
            remote.fail(w, claims[1], "mailbox full")
            with pytest.raises(leaseq.LeaseLost):
                remote.complete(w, claims[0], "once more")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        lines = before + [json.loads(line) for line in proc.stderr.read().splitlines() if line.strip()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert lines[-1]["message"] == "leaseq service stopped"
    tasks = [r for r in lines if r.get("task_id") is not None]
    for r in tasks:
        assert r["worker"] == w.id and r["generation"] == 1 and r["duration"] >= 0, r
        assert {"time", "level", "logger", "message"} <= set(r)

    def record(task_id: int, message: str, times: int = 1) -> dict:
        found = [r for r in tasks if r["task_id"] == task_id and r["message"] == message]
        assert len(found) == times, (message, found)
        return found[0]

    assert record(ids[0], "claimed")["kind"] == "mail" and record(ids[0], "claimed")["level"] == "debug"
    assert record(ids[0], "completed")["level"] == "debug"
    # refused twice: in a batch, and by the single-task route
    assert record(ids[0], "complete refused: lease no longer held", times=2)["level"] == "info"
    failed = record(ids[1], "failed -> queued")
    assert failed["kind"] == "mail" and failed["level"] == "info"
    assert any(r["logger"] == "uvicorn.access" for r in lines)  # uvicorn's records come as JSON too
