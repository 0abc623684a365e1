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


def test_redrive_and_cancel_where_from_the_command_line(dsn, run_cli):
    import leaseq

    assert run_cli("--dsn", dsn, "migrate").returncode == 0
    with leaseq.connect(dsn) as q:
        w = q.register_worker("w")
        ids = []
        for _ in range(2):
            ids.append(q.enqueue("mail", max_attempts=1).id)
            [c] = q.claim(w)
            q.fail(w, c, "HTTP 429", retry=False)
    dry = run_cli("--dsn", dsn, "redrive", "--error", "429", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith(f"would requeue 2 task(s): {ids[0]}, {ids[1]}")
    done = run_cli("--dsn", dsn, "redrive", "--kind", "mail", "--older-than", "0s", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["task_ids"] == ids
    gone = run_cli("--dsn", dsn, "cancel-where", "--status", "queued", "--reason", "not needed")
    assert gone.returncode == 0 and gone.stdout.startswith("cancelled 2 task(s)")
    bad = run_cli("--dsn", dsn, "cancel-where", "--kind", "mail")
    assert_one_error_line(bad, "status")
    bad = run_cli("--dsn", dsn, "redrive", "--older-than", "soon")
    assert_one_error_line(bad, "older_than")


def test_fairness_key_and_weight_from_the_command_line(dsn, run_cli):
    assert run_cli("--dsn", dsn, "migrate").returncode == 0
    made = run_cli("--dsn", dsn, "enqueue", "sync", "--no-check", "--fairness-key", "acme", "--fairness-weight", "2.5",
                   "--json")
    assert made.returncode == 0, made.stderr
    task = json.loads(made.stdout)
    assert (task["fairness_key"], task["fairness_weight"]) == ("acme", 2.5)
    bad = run_cli("--dsn", dsn, "enqueue", "sync", "--no-check", "--fairness-weight", "2")
    assert_one_error_line(bad, "fairness_weight")
    bad = run_cli("--dsn", dsn, "enqueue", "sync", "--no-check", "--fairness-key", "acme", "--fairness-weight", "0")
    assert_one_error_line(bad, "fairness_weight")
