"""``leaseq cancel ID --tree``: the real command cancels a task with its children and prints the
cancel tree, each child and open effect with its disposition, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess

import leaseq

from .cli_support import assert_one_error_line


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc.stdout


def _tree(dsn: str) -> tuple[int, int, int, int]:
    """A root waiting for a running child (a side effect in flight) that spawned a grandchild, and
    a child that completed. Returns (root, done, busy, grandchild)."""
    with leaseq.connect(dsn) as q:
        q.migrate()
        w = q.register_worker("w")
        root = q.enqueue("plan", {}, idempotency_key="plan-cli")
        [top] = q.claim(w, kinds=["plan"])
        done = q.spawn(w, top, "leaf", {}, key="done")
        busy = q.spawn(w, top, "mid", {}, key="busy", effect="side_effect")
        [leaf] = q.claim(w, kinds=["leaf"])
        q.complete(w, leaf, "ok")
        [mid] = q.claim(w, kinds=["mid"])
        grandchild = q.spawn(w, mid, "leaf", {}, key="later")
        q.begin_effect(w, mid, "crm.update")
        assert q.wait_children(w, top, "plan-cli:children:0", [done.id, busy.id])["state"] == "suspended"
        return root.id, done.id, busy.id, grandchild.id


def test_cancel_tree_prints_each_disposition(dsn, run_cli):
    root, done, busy, grandchild = _tree(dsn)
    out = ok(run_cli("--dsn", dsn, "cancel", str(root), "--reason", "wrong plan", "--tree"))
    assert out.startswith(f"task {root} cancelled: now cancelled")
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.split() and
            line.split()[0].isdigit()}
    assert rows[str(done)][-1] == "completed" and rows[str(busy)][-1] == "unknown"
    assert rows[str(grandchild)][-1] == "not_started"
    assert "crm.update (side_effect)" in out and "children" in out  # the open effect, the wait that ended
    with leaseq.connect(dsn) as q:
        assert [q.get(i).status for i in (root, done, busy, grandchild)] == \
            ["cancelled", "completed", "cancelled", "cancelled"]
        [kept] = [e for e in q.events(root) if e.type == "tree_cancelled"]
        assert kept.detail["by"].startswith("cli:")


def test_cancel_tree_as_json_and_refused_twice(dsn, run_cli):
    root, done, busy, grandchild = _tree(dsn)
    report = json.loads(ok(run_cli("--dsn", dsn, "cancel", str(root), "--reason", "r", "--tree", "--json")))
    assert {c["task_id"]: c["disposition"] for c in report["children"]} == \
        {done: "completed", busy: "unknown", grandchild: "not_started"}
    assert [e["disposition"] for e in report["effects"]] == ["unknown"]
    again = run_cli("--dsn", dsn, "cancel", str(root), "--reason", "r", "--tree")
    assert "is cancelled" in assert_one_error_line(again, "status")
