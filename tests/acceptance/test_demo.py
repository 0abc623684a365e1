"""``leaseq demo`` tells the design note's story, and the database shows that it happened."""

from __future__ import annotations

import re
import time

import leaseq

from .cli_support import cli_env

REFUSED_CALLS = ["heartbeat", "complete", "fail", "begin_effect", "finish_effect"]


def check_story(stdout: str) -> None:
    """The output narrates the refusals, the routing and the reconciliation, in 80 columns."""
    for call in REFUSED_CALLS:
        assert re.search(rf"refused\s+{call}\s+LeaseLost: lease no longer held", stdout), call
    assert stdout.count("refused ") == len(REFUSED_CALLS)
    assert "ACCEPTED" not in stdout
    for words in ("generation 2", "needs_reconciliation", "lease_expired", "routed_to=queued",
                  "reconciled", "Evidence trail of task", "Effects ledger", "Done in"):
        assert words in stdout, words
    too_wide = [line for line in stdout.splitlines() if len(line.rstrip()) > 80 and "--dsn" not in line]
    assert too_wide == []
    # piped, the tables break no word in two: the settled intent's key stays whole on its line
    assert re.search(r"settled_intents=welcome-user-7:email\.send\s*$", stdout, re.M), stdout
    # and the story ends with a next step
    assert "leaseq worker yourmodule:app" in stdout.rstrip().splitlines()[-2], stdout[-400:]


def check_database(q: leaseq.Queue, queue: str) -> None:
    """The demo's two tasks ended as the story says: B's result, and a reconciled side effect."""
    summarize, welcome = sorted(q.list_tasks(queue=queue), key=lambda t: t.id)
    assert (summarize.status, summarize.claim_generation) == ("completed", 2)
    assert summarize.result == {"summary": "three lines", "by": "worker-b"}
    types = [e.type for e in q.events(summarize.id)]
    assert types == ["enqueued", "claimed", "lease_expired", "claimed", "completed"]
    assert (welcome.status, welcome.claim_generation) == ("completed", 1)
    assert [e.type for e in q.events(welcome.id)] == [
        "enqueued", "claimed", "effect_intent", "lease_expired", "needs_reconciliation", "reconciled"]
    assert [(fx.action, fx.status) for fx in q.effects(welcome.id)] == [("email.send", "reconciled")]


def test_demo_on_a_throwaway_database_kept(run_cli, tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    started = time.monotonic()
    proc = run_cli("demo", "--keep", env=cli_env(TMPDIR=str(scratch)))
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    check_story(proc.stdout)
    assert elapsed < 10, f"the demo took {elapsed:.1f} s"
    kept = re.search(r"leaseq --dsn sqlite:///(\S+) show 1", proc.stdout).group(1)
    assert kept.startswith(str(scratch))
    with leaseq.connect(f"sqlite:///{kept}") as q:
        check_database(q, "demo")
    assert not (run_cli.cwd / "leaseq.db").exists(), "the demo must not touch the embedded default"


def test_demo_removes_its_throwaway_database(run_cli, tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = run_cli("demo", env=cli_env(TMPDIR=str(scratch)))
    assert proc.returncode == 0, proc.stderr
    assert "was kept" not in proc.stdout
    assert list(scratch.iterdir()) == []


def test_demo_on_a_given_database_leaves_other_work_alone(dsn, run_cli):
    with leaseq.connect(dsn) as q:
        q.migrate()
        bystander = q.enqueue("real-work")
    proc = run_cli("--dsn", dsn, "demo")
    assert proc.returncode == 0, proc.stderr
    check_story(proc.stdout)
    queue = re.search(r"queue (demo-[0-9a-f]{8})", proc.stdout).group(1)
    with leaseq.connect(dsn) as q:
        check_database(q, queue)
        assert q.get(bystander.id) == bystander, "the demo must not touch other queues' tasks"
