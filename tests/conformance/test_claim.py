"""Claiming: atomic select-and-lease, ordering, delays, pauses and worker identity."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections import Counter

import pytest

import leaseq
from leaseq import auth

from .support import claim_until_empty, seconds_between, snapshot, wait_expired, wait_until


def test_claim_leases_the_task_with_a_new_generation(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    t = q.enqueue("job", {"n": 1}, lease_seconds=45)
    before = q.now()
    [c] = q.claim(w)
    assert (c.task_id, c.generation, c.worker_id) == (t.id, 1, w.id)
    assert c.task.status == "running" and c.task.attempts == 1 and c.task.lease_owner == w.id
    assert 44 < seconds_between(c.expires_at, before) < 50
    row = q.get(t.id)
    assert (row.status, row.lease_owner, row.claim_generation, row.attempts) == ("running", w.id, 1, 1)
    assert row.lease_expires_at == c.expires_at
    assert q.claim(w) == []  # the only task is leased


def test_each_claim_increments_generation_and_attempts(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    t = q.enqueue("job", max_attempts=10)
    seen = []
    for _ in range(3):
        [c] = q.claim(w)
        seen.append((c.generation, c.task.attempts))
        q.release(w, c)
    assert seen == [(1, 1), (2, 2), (3, 3)]
    assert q.get(t.id).claim_generation == 3


def test_threads_never_claim_the_same_task(q: leaseq.Queue) -> None:
    ids = {q.enqueue("job", {"i": i}).id for i in range(200)}
    workers = [q.register_worker(f"t{i}") for i in range(6)]
    start = threading.Barrier(len(workers))
    claimed: list[list[tuple[int, int]]] = [[] for _ in workers]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            start.wait(timeout=10)
            while batch := q.claim(workers[i], limit=3):
                claimed[i].extend((c.task_id, c.generation) for c in batch)
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors
    every = [tid for got in claimed for tid, _ in got]
    assert Counter(every).most_common(1)[0][1] == 1, "a task was claimed twice"
    assert set(every) == ids
    assert all(gen == 1 for got in claimed for _, gen in got)
    assert sum(1 for got in claimed if got) >= 2, "the claims did not overlap at all"


def test_processes_with_their_own_connections_never_claim_the_same_task(q: leaseq.Queue, dsn: str) -> None:
    ids = {q.enqueue("job", {"i": i}).id for i in range(200)}
    ctx = multiprocessing.get_context("spawn")
    n = 3
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    procs = [ctx.Process(target=claim_until_empty, args=(dsn, barrier, results, 2)) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
    assert all(p.exitcode == 0 for p in procs)
    every = [tid for part in got for tid, _ in part]
    assert Counter(every).most_common(1)[0][1] == 1, "a task was claimed twice"
    assert set(every) == ids
    assert sum(1 for part in got if part) >= 2, "the processes did not overlap at all"
    assert {t.status for t in q.list_tasks(limit=500)} == {"running"}


def test_batch_claim_respects_limit_then_priority(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    tasks = [q.enqueue("job", {"i": i}, priority=p) for i, p in enumerate([0, 5, 0, 10, 5])]
    first = q.claim(w, limit=3)
    assert [c.task_id for c in first] == [tasks[3].id, tasks[1].id, tasks[4].id]
    rest = q.claim(w, limit=10)
    assert [c.task_id for c in rest] == [tasks[0].id, tasks[2].id]
    assert q.claim(w, limit=10) == []


def test_equal_priority_is_claimed_by_available_at_before_id(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    late = q.enqueue("job", {"n": "late"}, delay=0.3)
    early = q.enqueue("job", {"n": "early"})
    assert late.id < early.id and late.available_at > early.available_at
    wait_until(q, late.available_at)
    assert [c.task_id for c in q.claim(w, limit=2)] == [early.id, late.id]


def test_delayed_task_is_not_claimed_before_it_is_due(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    t = q.enqueue("job", delay=0.4)
    assert 0.35 < seconds_between(t.available_at, t.created_at) < 0.6
    assert q.claim(w) == []
    assert q.get(t.id).status == "queued"
    wait_until(q, t.available_at)
    assert [c.task_id for c in q.claim(w)] == [t.id]


def test_paused_queue_hands_out_nothing(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    t = q.enqueue("job")
    other = q.enqueue("job", queue="other")
    q.pause("default", by="ops")
    assert q.claim(w) == []
    assert q.get(t.id).status == "queued"
    assert [c.task_id for c in q.claim(w, queue="other")] == [other.id]  # only that queue is paused
    q.resume("default")
    assert [c.task_id for c in q.claim(w)] == [t.id]


def test_an_unknown_queue_is_switched_only_with_create(q: leaseq.Queue, dsn: str) -> None:
    """Pause and resume take a queue that has had a task or has a switch; a name never seen
    (a typo) is refused naming the known queues, and changes nothing, unless ``create``.
    AsyncQueue shares the rule (it is the engine's)."""
    for verb in (q.pause, q.resume):
        with pytest.raises(leaseq.InvalidInput) as info:
            verb("defualt", by="ops")
        assert info.value.field == "queue" and "no queue is known yet" in info.value.problem
    q.enqueue("job")  # "default" has had a task
    q.enqueue("job", queue="mail")
    with pytest.raises(leaseq.InvalidInput) as info:
        q.pause("defualt", by="ops")
    assert info.value.problem.startswith("'defualt' is not a known queue")
    assert "(known queues: default, mail)" in info.value.problem and "create=True" in info.value.problem
    assert q.queues() == [] and not any(e["action"] == "pause" for e in auth.audit_log(q, 10))
    with pytest.raises(leaseq.InvalidInput) as info:
        q.pause("later", create="yes")  # type: ignore[arg-type]
    assert info.value.field == "create"
    assert q.pause("default") == {"queue": "default", "paused": True}
    assert q.pause("later", create=True) == {"queue": "later", "paused": True}  # before its first task
    assert q.resume("later") == {"queue": "later", "paused": False}  # its switch makes it known
    assert [(r["name"], bool(r["paused"])) for r in q.queues()] == [("default", True), ("later", False)]
    # the queues that had tasks are found past many tasks and more queues than the refusal names
    for i in range(25):
        q.enqueue_many("job", [{}, {}], queue=f"bulk-{i:02d}")
    with pytest.raises(leaseq.InvalidInput) as info:
        q.resume("defualt")
    assert "known queues: bulk-00, bulk-01," in info.value.problem and "bulk-19, …)" in info.value.problem

    async def from_asyncio() -> None:
        async with await leaseq.connect_async(dsn) as aq:
            with pytest.raises(leaseq.InvalidInput) as refused:
                await aq.pause("nosuch")
            assert refused.value.field == "queue" and "bulk-00" in refused.value.problem
            assert await aq.pause("nosuch", create=True) == {"queue": "nosuch", "paused": True}
            assert await aq.resume("mail") == {"queue": "mail", "paused": False}
            with pytest.raises(leaseq.InvalidInput):
                await aq.resume("still-nosuch")

    asyncio.run(from_asyncio())
    assert {r["name"] for r in q.queues()} == {"default", "later", "nosuch", "mail"}


def test_claim_only_takes_its_own_queue(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    q.enqueue("job", queue="mail")
    assert q.claim(w, queue="reports") == []
    assert len(q.claim(w, queue="mail")) == 1


def test_unknown_worker_raises_and_claims_nothing(q: leaseq.Queue) -> None:
    t = q.enqueue("job")
    with pytest.raises(leaseq.UnknownWorker):
        q.claim("made-up-worker-1")
    forged = leaseq.Worker(id="worker-a-000000000000", name="worker-a")
    with pytest.raises(leaseq.UnknownWorker):
        q.claim(forged)
    assert q.get(t.id).status == "queued"
    assert q.get(t.id).claim_generation == 0


def test_revoked_worker_raises_and_claims_nothing(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    t = q.enqueue("job")
    q.revoke_worker(w)
    with pytest.raises(leaseq.UnknownWorker):
        q.claim(w)
    assert q.get(t.id).status == "queued"
    with pytest.raises(leaseq.UnknownWorker):
        q.revoke_worker("never-registered")


def test_registered_ids_are_issued_by_the_queue(q: leaseq.Queue) -> None:
    a1, a2 = q.register_worker("a"), q.register_worker("a")
    assert a1.id != a2.id and a1.name == a2.name == "a"
    assert a1.id != "a"


def test_lease_seconds_override(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    q.enqueue("job", lease_seconds=600)
    q.enqueue("job", lease_seconds=600)
    before = q.now()
    [long] = q.claim(w)
    [short] = q.claim(w, lease_seconds=2.5)
    assert 599 < seconds_between(long.expires_at, before) < 605
    assert 2.4 < seconds_between(short.expires_at, before) < 4
    # a heartbeat renews by the lease the claim was given
    assert seconds_between(q.heartbeat(w, short), before) < 5


def test_lease_seconds_override_does_not_stick_to_the_task(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    q.enqueue("job", lease_seconds=600)
    [short] = q.claim(w, lease_seconds=0.2)
    wait_expired(q, short)
    before = q.now()
    [again] = q.claim(w)
    assert again.generation == 2
    assert seconds_between(again.expires_at, before) > 590


@pytest.mark.parametrize("kwargs, field", [
    (dict(limit=0), "limit"),
    (dict(limit="3"), "limit"),
    (dict(lease_seconds=0), "lease_seconds"),
    (dict(lease_seconds=-1), "lease_seconds"),
    (dict(queue="no spaces"), "queue"),
])
def test_bad_claim_arguments(q: leaseq.Queue, kwargs: dict, field: str) -> None:
    w = q.register_worker("a")
    t = q.enqueue("job")
    with pytest.raises(leaseq.InvalidInput) as info:
        q.claim(w, **kwargs)
    assert info.value.field == field
    assert q.get(t.id).status == "queued"


def test_racing_claimers_route_each_expired_lease_once(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    ids = {q.enqueue("job", {"i": i}).id for i in range(40)}
    stalled = q.claim(a, limit=40, lease_seconds=0.2)
    wait_expired(q, max(stalled, key=lambda c: c.expires_at))
    workers = [q.register_worker(f"r{i}") for i in range(4)]
    start = threading.Barrier(len(workers))
    claimed: list[list[leaseq.Claim]] = [[] for _ in workers]
    errors: list[BaseException] = []
    total, counting = [0], threading.Lock()

    def run(i: int) -> None:
        # Until every task is claimed by someone: a claim may come back empty while another
        # claimer's routing of the expired leases has not committed yet (seen under load).
        try:
            start.wait(timeout=10)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                batch = q.claim(workers[i], limit=3)
                with counting:
                    claimed[i].extend(batch)
                    total[0] += len(batch)
                    if total[0] >= len(ids):
                        return
                if not batch:
                    time.sleep(0.01)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors
    every = [c for part in claimed for c in part]
    assert sorted(c.task_id for c in every) == sorted(ids)
    assert {c.generation for c in every} == {2}
    for tid in ids:
        assert [e.type for e in q.events(tid)].count("lease_expired") == 1


def test_a_claim_limited_to_kinds_takes_only_those_in_claim_order(q: leaseq.Queue, dsn: str) -> None:
    w = q.register_worker("w")
    mail = [q.enqueue("mail", {"i": i}, priority=p).id for i, p in enumerate((0, 5))]
    report = q.enqueue("report", {}, priority=9).id
    other = q.enqueue("resize", {}).id
    got = q.claim(w, limit=10, kinds=["mail", "report", "never-enqueued"])
    assert [c.task_id for c in got] == [report, mail[1], mail[0]]
    assert q.get(other).status == "queued" and q.get(other).claim_generation == 0
    assert q.claim(w, kinds=("mail",)) == []
    [last] = q.claim(w)  # None: any kind
    assert last.task_id == other


@pytest.mark.parametrize("kinds, field", [("mail", "kinds"), ([], "kinds"), ([""], "kinds[0]"),
                                          (["ok", 7], "kinds[1]"), (["x" * 201], "kinds[0]"), (3, "kinds")])
def test_a_bad_kinds_filter_is_refused_and_changes_nothing(q: leaseq.Queue, dsn: str, kinds, field) -> None:
    w = q.register_worker("w")
    q.enqueue("mail")
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        q.claim(w, kinds=kinds)
    assert info.value.field == field
    assert snapshot(dsn) == before


@pytest.mark.parametrize(("asked", "granted"), [(7 * 86400, 30.0), (5, 5.0), (None, 30.0)])
def test_a_claim_gets_at_most_the_tasks_own_lease(q: leaseq.Queue, asked, granted) -> None:
    """A claim may ask for a shorter lease than the task declared, never a longer one: the
    deadline, the claim's lease_seconds (which paces its renewals) and the evidence agree."""
    task = q.enqueue("job", lease_seconds=30)
    w = q.register_worker("w")
    [claim] = q.claim(w, lease_seconds=asked)
    assert claim.lease_seconds == granted
    assert (claim.expires_at - q.now()).total_seconds() <= granted
    [claimed] = [e for e in q.events(task.id) if e.type == "claimed"]
    assert claimed.detail["lease_seconds"] == granted
    renewed = q.heartbeat(w, claim)  # a renewal gives the granted length again, no more
    assert (renewed - q.now()).total_seconds() <= granted
