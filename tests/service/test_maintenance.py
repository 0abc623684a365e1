"""The maintenance leader, on both backends: one replica at a time, moved when it dies.

Each ``Maintenance`` gets a connection of its own (as separate replicas would)
to the same SQLite file or PostgreSQL schema. Leases are sub-second so that
leadership really expires and moves during the test.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import leaseq
from leaseq.service import create_app
from leaseq.service.maintenance import Maintenance, MaintenanceConfig

from conformance.support import run_out

from .conftest import serve

LEASE = 0.4


@pytest.fixture
def replicas(dsn: str) -> Iterator[list]:
    """Makes Maintenance instances on connections of their own; stops and closes them all afterwards."""
    made: list[tuple[Maintenance, leaseq.Queue]] = []

    def make(**options) -> Maintenance:
        queue = leaseq.connect(dsn)
        options.setdefault("leader_lease_seconds", LEASE)
        options.setdefault("sweep_every", None)
        m = Maintenance(queue, MaintenanceConfig(**options))
        made.append((m, queue))
        return m

    yield make
    for m, queue in made:
        m.stop(resign=False)
        queue.close()


def leaders(instances: list[Maintenance]) -> list[Maintenance]:
    """The instances leading at one instant. Every change of leadership happens under an
    instance's lock, so holding all of them makes the reading one consistent snapshot."""
    with ExitStack() as stack:
        for m in instances:
            stack.enter_context(m._lock)
        now = time.monotonic()
        return [m for m in instances if m.leading_at(now)]


def test_racing_replicas_never_have_two_leaders(q: leaseq.Queue, replicas) -> None:
    rng = random.Random(15)
    live = [replicas() for _ in range(4)]
    every = list(live)
    for m in live:
        m.start()
    samples, worst = 0, 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal samples, worst
        while not stop.is_set():
            worst = max(worst, len(leaders(every)))
            samples += 1
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    handovers = 0
    try:
        deadline = time.monotonic() + 30
        while handovers < 8 and time.monotonic() < deadline:
            current = [m for m in live if m.leading]
            if not current:
                time.sleep(0.01)
                continue
            [leader] = current
            # The leader crashes (its lease runs out) or stops cleanly (it resigns);
            # a fresh replica joins the race in its place.
            leader.stop(resign=rng.random() < 0.5)
            live.remove(leader)
            fresh = replicas()
            every.append(fresh)
            live.append(fresh)
            fresh.start()
            handovers += 1
        assert handovers == 8, "leadership did not move often enough"
        assert any(m.signals.wait("elected", timeout=LEASE * 10) for m in live)
    finally:
        stop.set()
        sampler.join()
    assert samples > 1000, samples
    assert worst == 1, f"{worst} leaders at once"
    # The database gave each term to one replica only, and terms only grew.
    terms = [t for m in every for t in m.terms]
    assert len(terms) == len(set(terms)) >= 9, terms
    row = live[0].leader()
    assert row is not None and row["term"] == max(terms) and row["live"]


def test_a_dead_leader_is_replaced_within_about_one_lease(q: leaseq.Queue, replicas) -> None:
    lease = 1.5  # sub-second leases can lapse on a loaded machine before the crash this test makes
    a, b = replicas(leader_lease_seconds=lease), replicas(leader_lease_seconds=lease)
    a.start()
    assert a.signals.wait("elected")
    b.start()
    assert b.signals.wait("passed_over", 2)  # b tries at least twice while a is alive, and loses
    assert not b.leading and b.signals.count("elected") == 0
    killed = time.monotonic()
    a.stop(resign=False)  # a crash: nothing tells the database
    assert b.signals.wait("elected", timeout=10)
    took = time.monotonic() - killed
    assert took >= lease * 0.5, f"b took over {took:.2f}s after a died, before a's lease could have run out"
    assert b.terms == [a.terms[-1] + 1]
    row = b.leader()
    assert row["holder"] == b.replica_id and row["live"]


def test_a_leader_that_stops_resigns_and_is_replaced_at_once(q: leaseq.Queue, replicas) -> None:
    a, b = replicas(leader_lease_seconds=60), replicas(leader_lease_seconds=1.5)
    a.start()
    assert a.signals.wait("elected")
    b.start()
    a.stop()  # resigns: without it, b would wait out a's 60 s lease
    assert b.signals.wait("elected", timeout=10)
    assert a.signals.count("stepped_down") == 1 and not a.leading


def test_only_the_leader_sweeps_expired_leases(q: leaseq.Queue, replicas) -> None:
    w = q.register_worker("w")
    task = q.enqueue("send", {}, effect="side_effect", lease_seconds=0.3)
    [claim] = q.claim(w)
    q.begin_effect(w, claim, "email.send")  # an intent without a response
    run_out(q, w, claim)
    leader = replicas(sweep_every=0.1, leader_lease_seconds=3)
    leader.start()
    assert leader.signals.wait("elected")
    standby = replicas(sweep_every=0.1, leader_lease_seconds=3)
    standby.start()
    deadline = time.monotonic() + 10
    while q.get(task.id).status != "needs_reconciliation":  # no claim is made: the sweep routes it
        assert time.monotonic() < deadline, "the expired lease was never routed"
        assert leader.signals.wait("sweep", leader.signals.count("sweep") + 1, timeout=5)
    assert "lease_expired" in [e.type for e in q.events(task.id)]
    assert standby.signals.wait("passed_over", 2)
    assert standby.signals.count("sweep") == 0 and standby.signals.count("elected") == 0


def test_the_sweep_routes_every_queue_one_nobody_claims_from_included(q: leaseq.Queue, replicas) -> None:
    """A claim routes its own queue's expired leases only: those of queues no worker claims
    from (here, none claims at all) are routed by the maintenance sweep, queue by queue."""
    w = q.register_worker("w")
    tasks = []
    for queue in ("exports", "reports"):
        task = q.enqueue("send", {}, queue=queue, lease_seconds=30)
        [claim] = q.claim(w, queue=queue)
        run_out(q, w, claim)
        tasks.append(task)
    leader = replicas(sweep_every=0.1, leader_lease_seconds=3)
    leader.start()
    assert leader.signals.wait("elected")
    deadline = time.monotonic() + 10
    while [q.get(t.id).status for t in tasks] != ["queued", "queued"]:
        assert time.monotonic() < deadline, [q.get(t.id).status for t in tasks]
        assert leader.signals.wait("sweep", leader.signals.count("sweep") + 1, timeout=5)
    for t in tasks:
        assert "lease_expired" in [e.type for e in q.events(t.id)]


def test_a_sweep_pass_that_stops_at_its_bound_is_followed_at_once(q: leaseq.Queue, replicas) -> None:
    """The maintenance sweep examines at most sweep_max_queues queues a pass; while a pass stops
    at that bound, the next follows at once (not sweep_every later), until the last queue."""
    w = q.register_worker("w")
    tasks = []
    for n in range(5):
        task = q.enqueue("send", {}, queue=f"q{n}", lease_seconds=30)
        [claim] = q.claim(w, queue=f"q{n}")
        run_out(q, w, claim)
        tasks.append(task)
    leader = replicas(sweep_every=3600, sweep_max_queues=2, leader_lease_seconds=3)
    leader.start()
    assert leader.signals.wait("sweep", 3, timeout=10)  # q0 q1, q2 q3, q4: three passes at once
    assert [q.get(t.id).status for t in tasks] == ["queued"] * 5
    assert leader.queue.sweep_resumes_after is None  # the third reached the last queue...
    time.sleep(0.3)
    assert leader.signals.count("sweep") == 3  # ...and the next is sweep_every away


@pytest.mark.parametrize("bad", [0, -1, 100_001, 2.5, True])
def test_a_bad_sweep_max_queues_is_refused_naming_it(bad) -> None:
    with pytest.raises(leaseq.InvalidInput, match="sweep_max_queues"):
        MaintenanceConfig(sweep_max_queues=bad).validate()


def test_leadership_shows_in_metrics_and_health(q: leaseq.Queue, dsn: str) -> None:
    # A lease long enough that a loaded machine never lets leadership lapse: this
    # test reads the two replicas' reports, not how leadership moves.
    with serve(q, public_metrics=True, leader_lease_seconds=6) as (url, app):
        assert app.state.maintenance.signals.wait("elected")
        with serve(q, public_metrics=True, leader_lease_seconds=6) as (other_url, other):
            assert other.state.maintenance.signals.wait("passed_over")
            for u, a, expected in ((url, app, 1), (other_url, other, 0)):
                health = httpx.get(f"{u}/healthz").json()
                assert health["maintenance_leader"] is bool(expected)
                assert "replica" not in health  # it names the host: /metrics only
                text = httpx.get(f"{u}/metrics").text
                values = {(s.name, tuple(sorted(s.labels.items()))): s.value
                          for f in text_string_to_metric_families(text) for s in f.samples}
                replica = (("replica", a.state.maintenance.replica_id),)
                assert values[("leaseq_maintenance_leader", replica)] == expected
            sweeps = values[("leaseq_maintenance_passes_total", (("job", "sweep"), ("outcome", "ok")))]
            assert sweeps == 0  # the standby ran none


@pytest.mark.parametrize(("option", "value"), [("leader_lease_seconds", 0), ("leader_lease_seconds", 0.05),
                                               ("leader_lease_seconds", "15"), ("sweep_every", -1),
                                               ("sweep_every", float("nan")), ("prune_every", 0),
                                               ("prune_evidence_older_than", 400 * 86400.0),
                                               ("prune_evidence_older_than", -1)])
def test_bad_maintenance_settings_name_the_field(q: leaseq.Queue, option: str, value) -> None:
    with pytest.raises(leaseq.InvalidInput) as err:
        create_app(q, **{option: value})
    assert err.value.field == option


def test_evidence_retention_shorter_than_the_task_retention_is_refused(q: leaseq.Queue) -> None:
    with pytest.raises(leaseq.InvalidInput) as err:
        create_app(q, prune_older_than=30 * 86400.0, prune_evidence_older_than=7 * 86400.0)
    assert err.value.field == "prune_evidence_older_than" and "at least prune_older_than" in str(err.value)


def test_a_stopped_replica_can_start_again(q: leaseq.Queue, replicas) -> None:
    m = replicas()
    m.start()
    assert m.signals.wait("elected")
    with pytest.raises(RuntimeError):
        m.start()
    m.stop()
    assert not m.leading and not m.leader()["live"]  # resigned: the row says so at once
    m.start()  # an application's lifespan may run twice
    assert m.signals.wait("elected", 2)
    assert m.terms == [1, 1] and m.leader()["holder"] == m.replica_id


def test_added_jobs_run_on_the_leader_only_and_move_with_it(q: leaseq.Queue, replicas) -> None:
    ran: list[str] = []
    a, b = replicas(), replicas()
    for m in (a, b):
        m.add_job("fire_schedules", 0.05, lambda m=m: ran.append(m.replica_id))
    for name, every, field in (("fire_schedules", 1, "name"), ("bad name", 1, "name"), ("x", 0, "every")):
        with pytest.raises(leaseq.InvalidInput) as err:
            a.add_job(name, every, print)
        assert err.value.field == field
    a.start()
    assert a.signals.wait("fire_schedules", 3)
    b.start()
    assert b.signals.count("fire_schedules") == 0
    a.stop(resign=False)
    assert b.signals.wait("fire_schedules", 3, timeout=10)
    with pytest.raises(RuntimeError):
        b.add_job("late", 1, print)
    first_b = ran.index(b.replica_id)
    assert set(ran[:first_b]) == {a.replica_id} and set(ran[first_b:]) == {b.replica_id}
