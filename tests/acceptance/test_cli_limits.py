"""``leaseq limits`` as an operator runs it: the real CLI in a subprocess, on both backends."""

from __future__ import annotations

import json

import leaseq

from .cli_support import assert_one_error_line, snapshot


def test_set_list_and_delete_a_limit(dsn, run_cli):
    assert run_cli("--dsn", dsn, "migrate").returncode == 0
    done = run_cli("--dsn", dsn, "limits", "set", "openai", "--max-running", "8", "--per-minute", "60")
    assert done.returncode == 0, done.stderr
    assert "limit openai set" in done.stdout and "openai" in done.stdout
    added = run_cli("--dsn", dsn, "enqueue", "chat", "--limit", "openai", "--units", "3", "--json")
    assert added.returncode == 0, added.stderr
    task = json.loads(added.stdout)
    assert (task["limits"], task["units"]) == (["openai"], 3)
    with leaseq.connect(dsn) as q:
        w = q.register_worker("w")
        [claim] = q.claim(w)
        assert claim.task_id == task["id"]
    listed = run_cli("--dsn", dsn, "limits", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert (row["key"], row["max_running"], row["running"], row["leases"], row["per_second"]) == \
        ("openai", 8, 1, 1, 1.0)
    table = run_cli("--dsn", dsn, "limits")
    assert table.returncode == 0 and "openai" in table.stdout
    gone = run_cli("--dsn", dsn, "limits", "delete", "openai")
    assert gone.returncode == 0 and "limit openai deleted" in gone.stdout
    empty = run_cli("--dsn", dsn, "limits")
    assert empty.returncode == 0 and "no limits" in empty.stdout
    with leaseq.connect(dsn) as q:
        assert [e["action"] for e in leaseq.auth.audit_log(q)][:2] == ["delete_limit", "set_limit"]


def test_bad_limit_input_is_one_error_line_and_changes_nothing(dsn, run_cli):
    assert run_cli("--dsn", dsn, "migrate").returncode == 0
    before = snapshot(dsn)
    assert_one_error_line(run_cli("--dsn", dsn, "limits", "set", "k", "--burst", "3"), "burst")
    assert_one_error_line(run_cli("--dsn", dsn, "limits", "set", "k", "--max-running", "0"), "max_running")
    assert_one_error_line(run_cli("--dsn", dsn, "limits", "set", "k k", "--max-running", "1"), "key")
    assert_one_error_line(run_cli("--dsn", dsn, "limits", "delete", "nope"), "key")
    assert_one_error_line(run_cli("--dsn", dsn, "enqueue", "chat", "--limit", "no way"), "limits[0]")
    assert_one_error_line(run_cli("--dsn", dsn, "enqueue", "chat", "--units", "0"), "units")
    assert snapshot(dsn) == before
    with leaseq.connect(dsn) as q:
        assert q.limits() == []
