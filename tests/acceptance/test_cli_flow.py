"""The operator's flow through the real CLI, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from datetime import datetime

import pytest

import leaseq
from conformance.support import run_out

from .cli_support import CLI, assert_one_error_line, cli_env, snapshot


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc.stdout


def as_json(proc: subprocess.CompletedProcess[str]):
    return json.loads(ok(proc))


def test_operator_flow(dsn, run_cli):
    cli = lambda *args, **kw: run_cli("--dsn", dsn, *args, **kw)  # noqa: E731

    # Before the schema exists, commands say how to create it.
    line = assert_one_error_line(cli("ls"), "dsn" if dsn.startswith("sqlite") else "database")
    assert "leaseq migrate" in line
    assert "applied migration" in ok(cli("migrate"))
    assert "up to date" in ok(cli("migrate"))

    first = as_json(cli("enqueue", "summarize", "--payload", '{"doc": 1}', "--json"))
    assert first["status"] == "queued" and first["payload"] == {"doc": 1} and first["effect"] == "read_only"
    out = ok(cli("enqueue", "send_welcome", "--effect", "side_effect", "--key", "welcome:7", "--priority", "5",
                 "--max-attempts", "3", "--lease-seconds", "12.5", "--payload", '{"note": "[bold]kept[/bold]"}'))
    assert out.startswith("task ") and "welcome:7" in out
    second_id = int(out.split()[1])
    # The same key in the same queue is the same task.
    again = as_json(cli("enqueue", "send_welcome", "--effect", "side_effect", "--key", "welcome:7", "--json",
                        "--priority", "5", "--max-attempts", "3", "--lease-seconds", "12.5",
                        "--payload", '{"note": "[bold]kept[/bold]"}'))
    assert again["id"] == second_id

    listed = as_json(cli("ls", "--json"))
    assert [t["id"] for t in listed] == [second_id, first["id"]]
    assert listed[0]["priority"] == 5 and listed[0]["max_attempts"] == 3 and listed[0]["lease_seconds"] == 12.5
    datetime.fromisoformat(listed[0]["created_at"])
    assert as_json(cli("ls", "--status", "queued", "--queue", "default", "--limit", "1", "--json"))[0]["id"] == second_id
    table = ok(cli("ls"))
    assert "summarize" in table and "send_welcome" in table and "side_effect" in table

    out = ok(cli("cancel", str(second_id), "--reason", "customer left"))
    assert "cancelled" in out
    detail = as_json(cli("show", str(second_id), "--json"))
    assert detail["task"]["status"] == "cancelled"
    assert [e["type"] for e in detail["events"]] == ["enqueued", "cancelled"]
    assert detail["events"][1]["detail"]["reason"] == "customer left"
    datetime.fromisoformat(detail["events"][1]["at"])
    assert detail["effects"] == []
    shown = ok(cli("show", str(second_id)))
    assert "[bold]kept[/bold]" in shown, "user data must not be read as rich markup"
    for words in ("evidence trail", "enqueued", "welcome:7", "cancelled", "customer left"):
        assert words in shown, words
    with leaseq.connect(dsn) as q:
        assert q.get(second_id).status == "cancelled"

    stats = as_json(cli("stats", "--json"))
    counts = {(r["queue"], r["status"]): r["count"] for r in stats["by_status"]}
    assert counts == {("default", "queued"): 1, ("default", "cancelled"): 1}
    table = ok(cli("stats"))
    assert "default" in table and "cancelled" in table and "queued" in table


def wait_expired(q: leaseq.Queue, claim: leaseq.Claim) -> None:
    """Wait until ``claim``'s lease is past its deadline by the database's clock."""
    while q.now() <= claim.expires_at:
        time.sleep(0.05)


def test_pausing_a_mistyped_queue_is_refused_unless_created(dsn, run_cli):
    """`leaseq pause defualt` used to pause a queue nobody uses and report success: a queue that
    has had no task and has no switch is refused, naming the known queues; --create takes it."""
    cli = lambda *args, **kw: run_cli("--dsn", dsn, *args, **kw)  # noqa: E731
    with leaseq.connect(dsn) as q:
        q.migrate()
        q.enqueue("job", queue="default")
        q.enqueue("job", queue="mail")
    before = snapshot(dsn)
    for verb in ("pause", "resume"):
        line = assert_one_error_line(cli(verb, "defualt"), "queue")
        assert "'defualt' is not a known queue" in line, line
        assert "(known queues: default, mail)" in line and f"leaseq {verb} --create" in line, line
    assert snapshot(dsn) == before, "a refused pause changes nothing"
    assert ok(cli("pause", "default")).startswith("queue default paused")  # it has had a task
    assert ok(cli("pause", "later", "--create")).startswith("queue later paused")  # before its first task
    assert ok(cli("resume", "later")).startswith("queue later resumed")  # it has a switch now
    with leaseq.connect(dsn) as q:
        assert [(s["name"], bool(s["paused"])) for s in q.queues()] == [("default", True), ("later", False)]
    assert "--create" in ok(cli("pause", "--help"))


def test_workers_queues_pause_and_sweep(dsn, run_cli):
    cli = lambda *args, **kw: run_cli("--dsn", dsn, *args, **kw)  # noqa: E731
    with leaseq.connect(dsn) as q:
        q.migrate()
        w = q.register_worker("worker-x")
        held = q.enqueue("held", queue="jobs", lease_seconds=3600)
        q.claim(w, queue="jobs")

    workers = as_json(cli("workers", "--json"))
    assert [(r["id"], r["name"], r["leases"]) for r in workers] == [(w.id, "worker-x", 1)]
    assert w.id in ok(cli("workers"))

    ok(cli("pause", "jobs"))
    queues = {r["queue"]: r for r in as_json(cli("queues", "--json"))}
    assert queues["jobs"]["paused"] is True and queues["jobs"]["running"] == 1
    assert "paused" in ok(cli("queues"))
    with leaseq.connect(dsn) as q:
        q.enqueue("waiting", queue="jobs")
        assert q.claim(w, queue="jobs") == [], "a paused queue hands out no claims"
    ok(cli("resume", "jobs"))
    with leaseq.connect(dsn) as q:
        assert [(s["name"], s["paused"]) for s in q.queues()] == [("jobs", False)]

    with leaseq.connect(dsn) as q:
        stale = q.enqueue("stale", queue="jobs", priority=9)
        [claim] = q.claim(w, queue="jobs", lease_seconds=0.2)
        assert claim.task_id == stale.id
        wait_expired(q, claim)
    stats = as_json(cli("stats", "--json"))
    assert sum(r["expired_leases"] for r in stats["by_status"]) == 1
    assert "expired lease" in ok(cli("stats"))
    assert "routed 1 expired lease" in ok(cli("sweep"))
    with leaseq.connect(dsn) as q:
        assert q.get(stale.id).status == "queued"
        assert q.get(held.id).status == "running"
        assert [e.type for e in q.events(stale.id)][-1] == "lease_expired"




def test_reconcile_unblock_requeue(dsn, run_cli):
    cli = lambda *args, **kw: run_cli("--dsn", dsn, *args, **kw)  # noqa: E731
    with leaseq.connect(dsn) as q:
        q.migrate()
        w = q.register_worker("worker-r")
        mail = q.enqueue("send", {"to": "a@example.com"}, effect="side_effect")
        [claim] = q.claim(w)
        q.begin_effect(w, claim, "email.send")
        run_out(q, w, claim)
        q.sweep()
        assert q.get(mail.id).status == "needs_reconciliation"
        cred = q.enqueue("fetch", queue="creds")
        [claim] = q.claim(w, queue="creds")
        q.fail(w, claim, "token revoked", block=True)
        dead = q.enqueue("parse", queue="dead")
        [claim] = q.claim(w, queue="dead")
        q.fail(w, claim, "bad input", retry=False)
        assert (q.get(cred.id).status, q.get(dead.id).status) == ("blocked", "dead")

    assert "needs_reconciliation" in ok(cli("ls", "--status", "needs_reconciliation"))
    shown = ok(cli("show", str(mail.id)))
    assert "effects ledger" in shown and "email.send" in shown and "pending" in shown
    out = ok(cli("reconcile", str(mail.id), "--outcome", "completed", "--note", "provider log: delivered",
                 "--result", '{"message_id": "m-1"}'))
    assert "completed" in out
    out = ok(cli("unblock", str(cred.id), "--note", "token rotated"))
    assert "queued" in out
    requeued = as_json(cli("requeue", str(dead.id), "--json"))
    assert requeued["status"] == "queued" and requeued["attempts"] == 0

    with leaseq.connect(dsn) as q:
        done = q.get(mail.id)
        assert (done.status, done.result) == ("completed", {"message_id": "m-1"})
        assert [fx.status for fx in q.effects(mail.id)] == ["reconciled"]
        assert q.events(mail.id)[-1].detail["note"] == "provider log: delivered"
        assert q.get(cred.id).status == "queued" and q.events(cred.id)[-1].type == "unblocked"
        assert q.events(dead.id)[-1].type == "requeued"


def test_embedded_default_and_env_dsn(run_cli, tmp_path):
    # No --dsn and no $LEASEQ_DSN: ./leaseq.db, created and migrated on first use.
    proc = run_cli("enqueue", "hello")
    ok(proc)
    assert "embedded database" in proc.stderr
    assert (run_cli.cwd / "leaseq.db").exists()
    assert "hello" in ok(run_cli("ls"))
    # $LEASEQ_DSN names a database the CLI does not create behind the user's back.
    other = tmp_path / "other.db"
    proc = run_cli("ls", env=cli_env(LEASEQ_DSN=f"sqlite:///{other}"))
    assert "leaseq migrate" in assert_one_error_line(proc, "dsn")
    assert not other.exists()
    ok(run_cli("migrate", env=cli_env(LEASEQ_DSN=f"sqlite:///{other}")))
    assert as_json(run_cli("ls", "--json", env=cli_env(LEASEQ_DSN=f"sqlite:///{other}"))) == []


@pytest.mark.parametrize("command", [["leaseq"], [*CLI[:2], "leaseq.cli"]])
def test_console_script_and_module_entry_points(command, run_cli):
    if command == ["leaseq"]:
        path = shutil.which("leaseq")
        if path is None:
            pytest.skip("the leaseq console script is not on PATH (package not installed)")
        command = [path]
    proc = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60, env=cli_env())
    assert proc.returncode == 0, proc.stderr
    for name in ("migrate", "enqueue", "ls", "show", "cancel", "reconcile", "unblock", "requeue", "stats",
                 "pause", "resume", "workers", "queues", "sweep", "demo"):
        assert f"  {name} " in proc.stdout, name


def test_approvals_through_the_cli(dsn, run_cli):
    cli = lambda *args, **kw: run_cli("--dsn", dsn, *args, **kw)  # noqa: E731
    ok(cli("migrate"))
    gated = as_json(cli("enqueue", "payments.refund", "--queue", "payments", "--effect", "side_effect",
                        "--payload", '{"order": 7, "cents": 1250}', "--approval-required", "--json"))
    assert gated["status"] == "awaiting_approval"
    other = as_json(cli("enqueue", "payments.refund", "--queue", "payments", "--payload", '{"order": 8}',
                        "--approval-required", "--approval-deadline", "3600", "--json"))
    listed = as_json(cli("approvals", "--json"))
    assert [a["task_id"] for a in listed] == [gated["id"], other["id"]]
    digest = listed[0]["digest"]
    assert listed[0]["requested_by"].startswith("cli:") and listed[0]["task"]["payload"]["cents"] == 1250
    shown = ok(cli("approvals"))
    assert digest in shown and f"leaseq approve {gated['id']} --digest {digest}" in shown.replace("\n", "")

    # the digest is required, and a different one decides nothing
    missing = cli("approve", str(gated["id"]))
    assert missing.returncode == 2 and "--digest" in missing.stderr
    wrong = leaseq.approval_digest("payments.refund", {"order": 7, "cents": 999999}, "payments")
    line = assert_one_error_line(cli("approve", str(gated["id"]), "--digest", wrong), "digest")
    assert digest not in line and "look at the task again" in line  # a refusal never tells the right digest
    out = ok(cli("approve", str(gated["id"]), "--digest", digest, "--note", "matches the order"))
    assert f"task {gated['id']} approved" in out and "queued" in out
    assert "denied" in ok(cli("deny", str(other["id"]), "--reason", "never paid"))
    assert_one_error_line(cli("deny", str(other["id"]), "--reason", "again"), "status")
    assert "nothing awaits approval" in ok(cli("approvals"))
    with leaseq.connect(dsn) as q:
        decided = q.approval(gated["id"])
        assert decided.decision == "approved" and decided.decided_by.startswith("cli:")
        assert decided.decided_via == "cli" and decided.note == "matches the order"
        assert q.approval(other["id"]).note == "never paid"


def test_sweep_runs_bounded_passes_until_the_last_queue(dsn, run_cli) -> None:
    """`leaseq sweep` examines at most --max-queues queues a pass, each pass resuming after the
    last queue the one before examined, until the last queue or --max-passes."""
    cli = lambda *args, **kw: run_cli("--dsn", dsn, *args, **kw)  # noqa: E731
    with leaseq.connect(dsn) as q:
        q.migrate()
        w = q.register_worker("gone")
        for name in ("a", "b", "c"):
            q.enqueue("job", queue=name)
            [claim] = q.claim(w, queue=name)
            run_out(q, w, claim)
    out = ok(cli("sweep", "--max-queues", "1", "--max-passes", "2"))
    assert "routed 2 expired leases in 2 passes" in out
    assert "queues after 'b' are not swept yet" in out
    # a new command starts at the first queue again; four passes: a, b, c, then none after c
    assert "routed 1 expired lease in 4 passes" in ok(cli("sweep", "--max-queues", "1"))
    bad = cli("sweep", "--max-queues", "0")
    assert bad.returncode == 2 and "--max-queues" in bad.stderr and "Traceback" not in bad.stderr
