"""The CI configurations of `leaseq chaos`: 60 s on PostgreSQL, 30 s on SQLite, 30 s with remote
workers through `leaseq serve` and 30 s through PgBouncer in transaction mode, every fault on.

Each run is bounded (the duration includes the settle phase) and stops by
itself. The assertions check the verdict, and also that the run really was
hostile: every enabled fault was injected, leases were recovered, stale
writes were refused, and most work still finished. The long mode (ten
minutes and more) is not run here; see docs/reliability.md.

The selected runs start with the module's first test, in two lanes side by
side (``LANES``), and each test then reads its run: about 100 s for the four,
not 160. Their processes wait on leases, sleeps and the database most of the
time: the four take about 50 s of CPU in all, their private PostgreSQL servers
included, so two side by side stay under one of CI's two cores (a worker
starved of CPU would rightly lose a lease the run then counts against it).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from system_tools import find_tool, require_tool

from .support import ChaosRun, describe, recheck_cli, violation_timelines

# serial: eight worker processes on one-second leases, against the clock; beside other tests on a
# small machine, a starved worker can rightly lose a lease the run then counts against it.
pytestmark = [pytest.mark.timeout(300), pytest.mark.serial]

#: Each test's run: the ``leaseq chaos`` arguments, and the system tools it needs.
RUNS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "test_sixty_seconds_on_postgres_with_every_fault": (
        ("--backend", "postgres", "--duration", "60", "--workers", "8", "--tasks", "400", "--seed", "1",
         "--faults", "all", "--quiet"), ("pg_ctl",)),
    "test_thirty_seconds_on_sqlite_with_every_fault_it_supports": (
        ("--backend", "sqlite", "--duration", "30", "--workers", "4", "--tasks", "150", "--seed", "2",
         "--faults", "all", "--quiet"), ()),
    "test_thirty_seconds_of_remote_workers_through_a_restarted_service": (
        ("--backend", "postgres", "--transport", "mixed", "--duration", "30", "--workers", "4", "--tasks", "150",
         "--seed", "3", "--faults", "all", "--prefetch", "2", "--quiet"), ("pg_ctl",)),
    "test_thirty_seconds_through_pgbouncer_in_the_portable_mode": (
        ("--backend", "postgres", "--pooler", "pgbouncer", "--portable", "--duration", "30", "--workers", "4", "--tasks", "150",
         "--seed", "4", "--faults", "all", "--quiet"), ("pg_ctl", "pgbouncer")),
}


#: Two lanes side by side, each running its runs one after another: no more than two runs share
#: the machine at any moment, and the SQLite run, the lightest, ends alone.
LANES = (("test_sixty_seconds_on_postgres_with_every_fault",
          "test_thirty_seconds_on_sqlite_with_every_fault_it_supports"),
         ("test_thirty_seconds_of_remote_workers_through_a_restarted_service",
          "test_thirty_seconds_through_pgbouncer_in_the_portable_mode"))
#: Seconds between the lanes' starts: a run's first seconds (a dozen Python processes importing
#: leaseq, initdb) are its busiest, and two at once would fill both cores while leases are taken.
STAGGER = 8.0


class Lanes:
    """The selected runs, started lane by lane: each lane's runs one after another, the lanes
    side by side. A run whose tools are missing is left out (its test skips, or fails under
    LEASEQ_REQUIRE_TOOLS, naming them)."""

    def __init__(self, names: set[str], factory: pytest.TempPathFactory):
        self.factory, self.runs = factory, {}
        self.ready = {name: threading.Event() for name in names}
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._lane, args=([n for n in lane if n in names], i * STAGGER),
                                         daemon=True) for i, lane in enumerate(LANES)]
        for thread in self.threads:
            thread.start()

    def _lane(self, names: list[str], delay: float) -> None:
        try:
            self.stopped.wait(delay)
            for name in names:
                if self.stopped.is_set() or not all(find_tool(tool) for tool in RUNS[name][1]):
                    continue
                run = self.runs[name] = start(name, self.factory)
                self.ready[name].set()
                if self.stopped.is_set():  # stop() came while this run started: it may not have seen it
                    run.stop()
                try:  # the next run of the lane starts when this one ends, or at its deadline
                    run.proc.wait(max(0.0, run.deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    run.stop()
        finally:
            for name in names:
                self.ready[name].set()

    def run(self, name: str) -> ChaosRun:
        """Run ``name`` once its lane has started it."""
        self.ready[name].wait()
        if name not in self.runs:
            pytest.fail(f"{name}: its run was not started (see the lane's error above)")
        return self.runs[name]

    def stop(self) -> None:
        self.stopped.set()
        for run in list(self.runs.values()):
            run.stop()
        for thread in self.threads:
            thread.join()


def start(name: str, factory: pytest.TempPathFactory) -> ChaosRun:
    return ChaosRun(factory.mktemp(name[:40]), *RUNS[name][0])


@pytest.fixture(scope="module")
def started(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lanes | None]:
    """The runs of this module's selected tests, started in their lanes with the module's first
    test. Under xdist a process runs only some of the selected tests: each starts its own there."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        yield None
        return
    lanes = Lanes({item.name for item in request.session.items if item.module is request.module
                   and item.name in RUNS}, tmp_path_factory)
    try:
        yield lanes
    finally:
        lanes.stop()


def run_of(started: Lanes | None, request: pytest.FixtureRequest) -> ChaosRun:
    """This test's run, started (its :meth:`~ChaosRun.result` waits for its end): its tools are
    required first (a skip or a failure naming them)."""
    name = request.node.name
    for tool in RUNS[name][1]:
        require_tool(tool)
    return start(name, request.getfixturevalue("tmp_path_factory")) if started is None else started.run(name)


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


def test_sixty_seconds_on_postgres_with_every_fault(started, request):
    run = run_of(started, request)
    proc, doc = run.result()
    assert_clean_and_hostile(proc, doc, ["kill", "stop", "terminate", "restart", "partition", "skew",
                                         "drop_queue", "drop_ledger", "revoke"])
    assert_revoked_workers_came_back(doc)
    # Downstream writes really happened (and each landed once: the verdict above).
    counts = doc["verdict"]["counts"]
    assert counts["downstream writes"] >= 100
    spawned = [r for r in doc["history"] if r["op"] == "spawn"]
    assert len({(r["clock_offset"], r["clock_rate"]) for r in spawned}) > 8, "skew should vary the clocks"


def test_thirty_seconds_on_sqlite_with_every_fault_it_supports(started, request):
    run = run_of(started, request)
    proc, doc = run.result()
    assert_clean_and_hostile(proc, doc, ["kill", "stop", "skew", "revoke"])
    assert doc["config"]["faults"] == ["kill", "stop", "skew", "revoke"]
    assert_revoked_workers_came_back(doc)
    again = recheck_cli(run.history)
    assert again.returncode == 0 and "no violations" in again.stdout, describe(again)


def test_thirty_seconds_of_remote_workers_through_a_restarted_service(started, request):
    run = run_of(started, request)
    proc, doc = run.result()
    assert_clean_and_hostile(proc, doc, ["kill", "stop", "service", "revoke", "drop_queue", "drop_ledger"])
    assert doc["config"]["prefetch"] == 2  # every worker leases two tasks ahead of its slots
    spawned = {r["transport"] for r in doc["history"] if r["op"] == "spawn"}
    assert spawned == {"direct", "http"}
    remote = {r["proc_name"] for r in doc["history"] if r["op"] == "spawn" and r["transport"] == "http"}
    assert sum(1 for r in doc["history"] if r["op"] == "complete" and r["outcome"] == "ok"
               and r["proc"] in remote) >= 10, "the remote workers completed next to nothing"
    assert sum(1 for r in doc["history"] if r["op"] == "service_start") >= 2, "the service was never restarted"


def test_thirty_seconds_through_pgbouncer_in_the_portable_mode(started, request):
    """The workers' queue connections pass through a PgBouncer of the run's own (transaction mode,
    four server connections for every worker, ``?pooler=transaction``), in the portable mode
    (``?portable=true``): no server-side prepared statement, no session setting, no advisory lock,
    no LISTEN; idle workers poll. (Through a transaction-mode pooler leaseq sends the portable
    mode's statements but for the advisory lock its migrate takes, so one run covers both.) About
    35 s: 30 s is what it takes for every fault to be scheduled at least once (a 20 s run missed
    some)."""
    run = run_of(started, request)
    proc, doc = run.result()
    assert_clean_and_hostile(proc, doc, ["kill", "stop", "terminate", "restart", "partition", "drop_queue",
                                         "revoke"])
    assert doc["config"]["pooler"] == "pgbouncer" and doc["config"]["portable"] is True
