"""The CI configurations of `leaseq chaos`: 60 s on PostgreSQL, 30 s on SQLite, 30 s with remote
workers through `leaseq serve` and 30 s through PgBouncer in transaction mode, every fault on.

Each run is bounded (the duration includes the settle phase) and stops by
itself. The assertions check the verdict, and also that the run really was
hostile: every enabled fault was injected, leases were recovered, stale
writes were refused, and most work still finished. The long mode (ten
minutes and more) is not run here; see docs/reliability.md.
"""

from __future__ import annotations

import pytest

from system_tools import require_tool

from .support import describe, need_pg_binaries, recheck_cli, run_chaos_cli, violation_timelines

# serial: eight worker processes on one-second leases, against the clock; beside other tests on a
# small machine, a starved worker can rightly lose a lease the run then counts against it.
pytestmark = [pytest.mark.timeout(300), pytest.mark.serial]


def assert_clean_and_hostile(proc, doc, faults: list[str]) -> None:
    verdict = doc["verdict"]
    counts = verdict["counts"]
    assert verdict["violations"] == [], violation_timelines(doc) + "\n" + describe(proc)
    assert doc["settled"], "the queue did not settle within the run"
    assert "violations: no_task_lost" in proc.stdout and "violations: no_attempt_charged" in proc.stdout
    assert proc.returncode == 0, describe(proc)
    assert "no violations" in proc.stdout
    # a handler that returned was never charged an attempt for the infrastructure's trouble
    assert counts["attempts consumed by infrastructure faults"] == 0, describe(proc)
    assert counts["handlers returned"] >= 0.5 * counts["tasks enqueued"]
    for fault in faults:
        assert counts.get(f"fault: {fault}", 0) >= 1, f"{fault} was never injected: {counts}"
    assert counts["leases recovered"] >= 1
    assert counts["stale writes refused by the queue"] + counts["probe stale writes refused"] >= 5
    assert counts["probe stale writes refused"] >= 6  # at least one whole probe cycle
    statuses = verdict["statuses"]
    # the workload parks some tasks on purpose (permanent failures, sends whose response is never recorded)
    assert statuses.get("completed", 0) >= 0.5 * counts["tasks enqueued"], statuses
    assert set(statuses) <= {"completed", "dead", "cancelled", "needs_reconciliation", "blocked"}


def assert_revoked_workers_came_back(doc) -> None:
    """A revoked worker process is refused, exits, and the fleet starts one that registers anew."""
    revoked = {r["worker"] for r in doc["history"]
               if r["op"] == "fault" and r["fault"] == "revoke" and r["outcome"] == "ok"}
    registered = [r["worker"] for r in doc["history"] if r["op"] == "register"]
    assert revoked and revoked < set(registered) and len(set(registered)) == len(registered)
    revoked_at = {r["worker"]: (r["t"], r["slot"]) for r in doc["history"]
                  if r["op"] == "fault" and r["fault"] == "revoke" and r["outcome"] == "ok"}
    settle = next(r["t"] for r in doc["history"] if r["op"] == "settle")
    for wid, (t, slot) in revoked_at.items():
        successors = [r for r in doc["history"] if r["op"] == "register" and r["t"] > t
                      and r["proc"].startswith(f"w{slot}.")]
        if t < settle - 5:  # later ones may meet a queue that settles before the process is replaced
            assert successors, f"slot {slot} never came back under a new identity after {wid} was revoked"
        late = [r for r in doc["history"] if r["op"] in ("claim", "complete", "renew") and r["outcome"] == "ok"
                and r.get("worker") == wid and r.get("t0", r["t"]) > t]
        assert late == [], f"revoked worker {wid} still got {late[:3]}"


def test_sixty_seconds_on_postgres_with_every_fault(tmp_path):
    need_pg_binaries()
    proc, doc = run_chaos_cli(tmp_path, "--backend", "postgres", "--duration", "60", "--workers", "8",
                              "--tasks", "400", "--seed", "1", "--faults", "all", "--quiet")
    assert_clean_and_hostile(proc, doc, ["kill", "stop", "terminate", "restart", "partition", "skew",
                                         "drop_queue", "drop_ledger", "revoke"])
    assert_revoked_workers_came_back(doc)
    # Downstream writes really happened (and each landed once: the verdict above).
    counts = doc["verdict"]["counts"]
    assert counts["downstream writes"] >= 100
    spawned = [r for r in doc["history"] if r["op"] == "spawn"]
    assert len({(r["clock_offset"], r["clock_rate"]) for r in spawned}) > 8, "skew should vary the clocks"


def test_thirty_seconds_on_sqlite_with_every_fault_it_supports(tmp_path):
    proc, doc = run_chaos_cli(tmp_path, "--backend", "sqlite", "--duration", "30", "--workers", "4",
                              "--tasks", "150", "--seed", "2", "--faults", "all", "--quiet")
    assert_clean_and_hostile(proc, doc, ["kill", "stop", "skew", "revoke"])
    assert doc["config"]["faults"] == ["kill", "stop", "skew", "revoke"]
    assert_revoked_workers_came_back(doc)
    again = recheck_cli(tmp_path / "history.json")
    assert again.returncode == 0 and "no violations" in again.stdout, describe(again)


def test_thirty_seconds_of_remote_workers_through_a_restarted_service(tmp_path):
    need_pg_binaries()
    proc, doc = run_chaos_cli(tmp_path, "--backend", "postgres", "--transport", "mixed", "--duration", "30",
                              "--workers", "4", "--tasks", "150", "--seed", "3", "--faults", "all", "--prefetch", "2",
                              "--quiet")
    assert_clean_and_hostile(proc, doc, ["kill", "stop", "service", "revoke", "drop_queue", "drop_ledger"])
    assert doc["config"]["prefetch"] == 2  # every worker leases two tasks ahead of its slots
    spawned = {r["transport"] for r in doc["history"] if r["op"] == "spawn"}
    assert spawned == {"direct", "http"}
    remote = {r["proc_name"] for r in doc["history"] if r["op"] == "spawn" and r["transport"] == "http"}
    assert sum(1 for r in doc["history"] if r["op"] == "complete" and r["outcome"] == "ok"
               and r["proc"] in remote) >= 10, "the remote workers completed next to nothing"
    assert sum(1 for r in doc["history"] if r["op"] == "service_start") >= 2, "the service was never restarted"


def test_thirty_seconds_through_pgbouncer_in_transaction_mode(tmp_path):
    """The workers' queue connections pass through a PgBouncer of the run's own (transaction mode,
    four server connections for every worker, ``?pooler=transaction``): no server-side prepared
    statement, no session setting, no LISTEN; idle workers poll. About 35 s: 30 s is what it takes
    for every fault to be scheduled at least once (a 20 s run missed some)."""
    need_pg_binaries()
    require_tool("pgbouncer")
    proc, doc = run_chaos_cli(tmp_path, "--backend", "postgres", "--pooler", "pgbouncer", "--duration", "30",
                              "--workers", "4", "--tasks", "150", "--seed", "4", "--faults", "all", "--quiet")
    assert_clean_and_hostile(proc, doc, ["kill", "stop", "terminate", "restart", "partition", "drop_queue",
                                         "revoke"])
    assert doc["config"]["pooler"] == "pgbouncer"
