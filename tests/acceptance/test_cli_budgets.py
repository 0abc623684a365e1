"""Budgets settled after the call from the command line: the real CLI in a subprocess, on both
backends (``leaseq enqueue --budget``, ``leaseq limits set --total-per-*``, ``leaseq limits``,
``leaseq limits spend``, ``leaseq approve --raise-budget``)."""

from __future__ import annotations

import json

import leaseq

from .cli_support import assert_one_error_line, snapshot


def test_a_budget_from_enqueue_to_a_raised_approval(dsn, run_cli):
    assert run_cli("--dsn", dsn, "migrate").returncode == 0
    done = run_cli("--dsn", dsn, "limits", "set", "tokens", "--counts", "units", "--total-per-day", "100000",
                   "--total-per-minute", "5000")
    assert done.returncode == 0, done.stderr
    added = run_cli("--dsn", dsn, "enqueue", "agent", "--no-check", "--limit", "tokens", "--units", "100",
                    "--budget", "tokens=200_000", "--json")
    assert added.returncode == 0, added.stderr
    task = json.loads(added.stdout)
    assert task["budget"] == {"tokens": 200000}
    with leaseq.connect(dsn) as q:
        w = q.register_worker("w")
        [claim] = q.claim(w)
        assert q.consume(w, claim, "agent:consume:0", "tokens", 250_000)["state"] == "paused"
    listed = run_cli("--dsn", dsn, "limits", "--json")
    [row] = json.loads(listed.stdout)
    assert (row["per_minute"], row["per_day"], row["day_used"], row["spent_today"]) == (5000, 100000, 250000, 250000)
    table = run_cli("--dsn", dsn, "limits")
    assert table.returncode == 0 and "250000/100000" in table.stdout, table.stdout
    spend = run_cli("--dsn", dsn, "limits", "spend", "--json")
    assert [(r["key"], r["units"]) for r in json.loads(spend.stdout)] == [("tokens", 250000)]
    assert "tokens" in run_cli("--dsn", dsn, "limits", "spend", "tokens").stdout
    shown = run_cli("--dsn", dsn, "show", str(task["id"]))
    assert "tokens 250000 of 200000" in shown.stdout, shown.stdout
    approvals = json.loads(run_cli("--dsn", dsn, "approvals", "--json").stdout)
    [request] = approvals
    assert request["reason"] == "budget" and request["detail"]["spent"] == 250000
    approved = run_cli("--dsn", dsn, "approve", str(task["id"]), "--digest", request["digest"],
                       "--raise-budget", '{"tokens": 100000}')
    assert approved.returncode == 0, approved.stderr
    with leaseq.connect(dsn) as q:
        assert (q.get(task["id"]).status, q.get(task["id"]).budget) == ("queued", {"tokens": 300000})


def test_bad_budget_input_is_one_error_line_and_changes_nothing(dsn, run_cli):
    assert run_cli("--dsn", dsn, "migrate").returncode == 0
    before = snapshot(dsn)
    assert_one_error_line(run_cli("--dsn", dsn, "enqueue", "agent", "--no-check", "--budget", "tokens"), "budget")
    assert_one_error_line(run_cli("--dsn", dsn, "enqueue", "agent", "--no-check", "--budget", "tokens=lots"),
                          "budget")
    assert_one_error_line(run_cli("--dsn", dsn, "enqueue", "agent", "--no-check", "--budget", "tokens=0"),
                          "budget['tokens']")
    assert_one_error_line(run_cli("--dsn", dsn, "limits", "set", "k", "--total-per-hour", "0"), "per_hour")
    assert_one_error_line(run_cli("--dsn", dsn, "limits", "spend", "--days", "0"), "days")
    assert snapshot(dsn) == before
