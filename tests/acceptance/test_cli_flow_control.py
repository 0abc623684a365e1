"""``leaseq enqueue --singleton/--debounce`` as a person runs it: the real CLI, both backends."""

from __future__ import annotations

import json

from .cli_support import assert_one_error_line


def test_singleton_and_debounce_from_the_command_line(dsn, run_cli):
    assert run_cli("--dsn", dsn, "migrate").returncode == 0
    first = run_cli("--dsn", dsn, "enqueue", "sync", "--no-check", "--singleton", "cust-1", "--json")
    assert first.returncode == 0, first.stderr
    task = json.loads(first.stdout)
    assert (task["singleton_key"], task["enqueue_outcome"]) == ("cust-1", "created")
    again = run_cli("--dsn", dsn, "enqueue", "sync", "--no-check", "--singleton", "cust-1")
    assert again.returncode == 0, again.stderr
    assert f"existing task {task['id']} returned (singleton key cust-1" in again.stdout
    replaced = run_cli("--dsn", dsn, "enqueue", "sync", "--no-check", "--singleton", "cust-1",
                       "--on-conflict", "cancel_running", "--json")
    assert json.loads(replaced.stdout)["enqueue_outcome"] == "created"
    one = run_cli("--dsn", dsn, "enqueue", "reindex", "--payload", '{"n": 1}', "--no-check", "--debounce", "60",
                  "--debounce-key", "repo", "--max-delay", "300", "--json")
    two = run_cli("--dsn", dsn, "enqueue", "reindex", "--payload", '{"n": 2}', "--no-check", "--debounce", "60",
                  "--debounce-key", "repo")
    assert two.returncode == 0, two.stderr
    assert f"collapsed into task {json.loads(one.stdout)['id']} (debounce key repo" in two.stdout


def test_bad_flow_options_are_one_error_line(dsn, run_cli):
    assert run_cli("--dsn", dsn, "migrate").returncode == 0
    bad = run_cli("--dsn", dsn, "enqueue", "reindex", "--no-check", "--debounce", "60")
    assert_one_error_line(bad, "debounce_key")
    bad = run_cli("--dsn", dsn, "enqueue", "reindex", "--no-check", "--on-conflict", "queue")
    assert_one_error_line(bad, "on_conflict")
