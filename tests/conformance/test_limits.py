"""Limits shared by every worker, judged inside the claim statement, on both backends.

Usage is read from the database itself (:func:`live_leases`), not only from
what leaseq reports: a claim never hands out a task whose limit is at
max_running live leases or whose rate bucket is empty, across threads and
processes, and the slot a claim takes belongs to its lease until the
outcome that ends the lease gives it back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import leaseq
from leaseq.core.errors import InvalidInput, NotFound

from pg_modes import own_connection

from .support import wait_expired

ROOT = Path(__file__).resolve().parents[2]


def live_leases(dsn: str, key: str) -> int:
    """Running tasks naming ``key``, counted by the test's own connection."""
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"), timeout=30)
        try:
            return conn.execute("SELECT count(*) FROM leaseq_tasks WHERE status = 'running' AND EXISTS "
                                "(SELECT 1 FROM json_each(limits) WHERE value = ?)", (key,)).fetchone()[0]
        finally:
            conn.close()
    with own_connection(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM leaseq_tasks WHERE status = 'running' AND %s = ANY(limits)",
                            (key,)).fetchone()[0]


def usage(q: leaseq.Queue, key: str) -> int:
    [row] = q.limits(key)
    return row["running"]


# -- input ------------------------------------------------------------------------------

@pytest.mark.parametrize("options, field", [
    ({"key": "has space", "max_running": 1}, "key"),
    ({"key": "k", "max_running": 0}, "max_running"),
    ({"key": "k", "max_running": True}, "max_running"),
    ({"key": "k", "per_second": 0}, "per_second"),
    ({"key": "k", "per_second": float("nan")}, "per_second"),
    ({"key": "k", "max_running": 2, "burst": 5}, "burst"),
    ({"key": "k", "per_second": 1, "burst": 0.5}, "burst"),
    ({"key": "k", "max_running": 1, "counts": "tokens"}, "counts"),
    ({"key": "k"}, "max_running"),
])
def test_a_bad_limit_is_refused_naming_the_field_and_nothing_is_written(q: leaseq.Queue, options: dict,
                                                                         field: str) -> None:
    options = dict(options)
    key = options.pop("key")
    with pytest.raises(InvalidInput) as err:
        q.set_limit(key, **options)
    assert err.value.field == field
    assert q.limits() == []


@pytest.mark.parametrize("options, field", [
    ({"limits": "openai"}, "limits"),
    ({"limits": ["ok", "not ok"]}, "limits[1]"),
    ({"limits": [f"k{i}" for i in range(17)]}, "limits"),
    ({"units": 0}, "units"),
    ({"units": 1.5}, "units"),
])
def test_a_task_with_bad_limits_or_units_is_refused_and_nothing_is_written(q: leaseq.Queue, options: dict,
                                                                            field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        q.enqueue("job", **options)
    assert err.value.field == field
    with pytest.raises(InvalidInput):
        q.enqueue_many("job", [{}], **options)
    assert q.list_tasks() == []


def test_a_task_keeps_its_limits_and_units(q: leaseq.Queue) -> None:
    t = q.enqueue("job", limits=["b", "a", "b"], units=7)
    assert (t.limits, t.units) == (["a", "b"], 7)
    [tid] = q.enqueue_many("job", [{}], limits=["c"], units=2)
    assert (q.get(tid).limits, q.get(tid).units) == (["c"], 2)
    assert q.enqueue("job").limits is None and q.enqueue("job").units == 1


# -- max_running --------------------------------------------------------------------------

def test_max_running_caps_claims_and_the_tasks_behind_a_full_limit_still_run(q: leaseq.Queue, dsn: str) -> None:
    q.set_limit("openai", max_running=2)
    w = q.register_worker("w")
    limited = [q.enqueue("chat", {"i": i}, limits=["openai"], priority=10).id for i in range(5)]
    free = [q.enqueue("plain", {"i": i}).id for i in range(3)]
    got = q.claim(w, limit=10)
    assert sorted(c.task_id for c in got) == sorted(limited[:2] + free)
    assert live_leases(dsn, "openai") == usage(q, "openai") == 2
    assert q.claim(w, limit=10) == []  # full: the other three wait, and nothing else is due
    [row] = q.limits()
    assert (row["running"], row["leases"], row["available"]) == (2, 2, 0)
    assert {q.get(t).status for t in limited[2:]} == {"queued"}


def test_a_key_without_a_limit_limits_nothing(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    for i in range(4):
        q.enqueue("job", {"i": i}, limits=["nobody-set-me"])
    assert len(q.claim(w, limit=10)) == 4


def test_a_task_naming_two_limits_needs_room_in_both(q: leaseq.Queue) -> None:
    q.set_limit("a", max_running=5)
    q.set_limit("b", max_running=1)
    w = q.register_worker("w")
    ab = [q.enqueue("job", {"i": i}, limits=["a", "b"]).id for i in range(3)]
    only_a = [q.enqueue("job", {"j": i}, limits=["a"]).id for i in range(3)]
    got = {c.task_id for c in q.claim(w, limit=10)}
    # a batch may take fewer than fit (the refused count against "a" in it), never more
    assert ab[0] in got and got <= {ab[0], *only_a}
    got |= {c.task_id for c in q.claim(w, limit=10)}
    assert got == {ab[0], *only_a}
    assert (usage(q, "a"), usage(q, "b")) == (4, 1)


def test_changing_a_limit_recounts_the_leases_it_holds(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    for i in range(3):
        q.enqueue("job", {"i": i}, limits=["late"])
    q.enqueue("job", {"i": 9}, limits=["late"])
    assert len(q.claim(w, limit=3)) == 3  # no limit yet
    assert q.set_limit("late", max_running=2)["running"] == 3
    assert q.claim(w) == []
    q.delete_limit("late", by="test")
    assert len(q.claim(w)) == 1
    with pytest.raises(NotFound):
        q.delete_limit("late")
    assert [e["action"] for e in leaseq.auth.audit_log(q)][:2] == ["delete_limit", "set_limit"]


# -- the slot belongs to the lease -----------------------------------------------------------

OUTCOMES = ["complete", "complete_many", "fail_retry", "fail_dead", "retry", "release", "cancel", "expiry",
            "revoke", "reconcile"]


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_the_slot_comes_back_with_each_outcome(q: leaseq.Queue, dsn: str, outcome: str) -> None:
    q.set_limit("k", max_running=1)
    w = q.register_worker("w")
    effect = "side_effect" if outcome == "reconcile" else "read_only"
    lease = 0.5 if outcome == "expiry" else 30
    first = q.enqueue("job", {"n": 1}, limits=["k"], effect=effect, lease_seconds=lease, priority=1)
    second = q.enqueue("job", {"n": 2}, limits=["k"])
    [c] = q.claim(w, limit=5)
    assert c.task_id == first.id and usage(q, "k") == 1 and q.claim(w) == []
    if outcome == "complete":
        q.complete(w, c, {"ok": 1})
    elif outcome == "complete_many":
        assert q.complete_many(w, [(c, 1)]) == {c.task_id}
    elif outcome == "fail_retry":
        assert q.fail(w, c, "boom", delay=60).status == "queued"
    elif outcome == "fail_dead":
        assert q.fail(w, c, "boom", retry=False).status == "dead"
    elif outcome == "retry":
        assert q.retry(w, c, 60, "the provider said 429").status == "queued"
    elif outcome == "release":
        q.release(w, c, "shutting down")
    elif outcome == "cancel":
        q.cancel(c.task_id, "not needed", by="test")
    elif outcome == "expiry":
        wait_expired(q, c)
        assert usage(q, "k") == 1  # an expired lease keeps its slot until it is routed
        assert q.sweep() == 1
    elif outcome == "revoke":
        q.revoke_worker(w, by="test")
        assert usage(q, "k") == 1  # its lease ended, but the task is not routed yet
        assert q.sweep() == 1
        w = q.register_worker("w2")
    elif outcome == "reconcile":
        q.begin_effect(w, c, "mail.send")
        assert q.fail(w, c, "crashed mid-call").status == "needs_reconciliation"
        assert usage(q, "k") == 0  # the lease ended: reconciliation holds no slot
        q.reconcile(c.task_id, "requeue", "it never went out", by="test")
    assert usage(q, "k") == live_leases(dsn, "k") == 0
    [again] = q.claim(w, limit=5)
    expected = first.id if outcome in ("release", "expiry", "revoke", "reconcile") else second.id
    assert again.task_id == expected and usage(q, "k") == live_leases(dsn, "k") == 1
    q.complete(w, again)
    assert usage(q, "k") == 0


def test_a_refused_completion_gives_back_nothing(q: leaseq.Queue) -> None:
    q.set_limit("k", max_running=1)
    w = q.register_worker("w")
    q.enqueue("job", limits=["k"], lease_seconds=0.5)
    [c] = q.claim(w)
    wait_expired(q, c)
    with pytest.raises(leaseq.LeaseLost):
        q.complete(w, c)
    assert usage(q, "k") == 1  # only the routing of the expired lease gives it back
    q.sweep()
    assert usage(q, "k") == 0


# -- units ---------------------------------------------------------------------------------

def test_a_limit_that_counts_units_admits_by_weight_and_a_larger_task_runs_alone(q: leaseq.Queue) -> None:
    q.set_limit("tokens", max_running=10, counts="units")
    w = q.register_worker("w")
    small = [q.enqueue("job", {"i": i}, limits=["tokens"], units=4, priority=1).id for i in range(3)]
    big = q.enqueue("job", {"big": True}, limits=["tokens"], units=15).id
    first = q.claim(w, limit=10)
    assert [c.task_id for c in first] == small[:2] and usage(q, "tokens") == 8
    q.complete_many(w, [(c, None) for c in first])
    [third] = q.claim(w, limit=10)  # the big one does not fit beside it
    assert third.task_id == small[2] and usage(q, "tokens") == 4
    q.complete(w, third)
    [alone] = q.claim(w, limit=10)
    assert alone.task_id == big and usage(q, "tokens") == 15
    q.enqueue("job", limits=["tokens"], units=1)
    assert q.claim(w) == []
    q.complete(w, alone)
    assert len(q.claim(w)) == 1 and usage(q, "tokens") == 1


# -- races ---------------------------------------------------------------------------------

def test_many_threads_claiming_at_once_never_overshoot(q: leaseq.Queue, dsn: str) -> None:
    q.set_limit("api", max_running=3)
    q.enqueue_many("job", [{"i": i} for i in range(60)], limits=["api"])
    workers = [q.register_worker(f"t{i}") for i in range(8)]
    for _ in range(5):
        start = threading.Barrier(len(workers))
        claimed: list[list[leaseq.Claim]] = [[] for _ in workers]
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                start.wait(timeout=30)
                claimed[i].extend(q.claim(workers[i], limit=2))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not errors
        held = [(i, c) for i, got in enumerate(claimed) for c in got]
        assert len(held) == live_leases(dsn, "api") == usage(q, "api") == 3, "the limit was overshot or unused"
        for i, c in held:
            q.complete(workers[i], c)
        assert usage(q, "api") == 0


def test_two_worker_processes_never_hold_more_than_max_running(q: leaseq.Queue, dsn: str, tmp_path: Path) -> None:
    q.set_limit("shared", max_running=2)
    env = dict(os.environ, LEASEQ_DSN=dsn, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    procs = [subprocess.Popen([sys.executable, "-m", "leaseq.cli.main", "worker",
                               "tests.conformance.limits_app:app", "--name", f"p{i}", "--concurrency", "4",
                               "--poll-interval", "0.05"],
                              cwd=ROOT, env=env, stdout=open(tmp_path / f"p{i}.log", "w"), stderr=subprocess.STDOUT)
             for i in range(2)]
    samples: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(q.workers()) < 2:  # both are up and claiming before there is work to race for
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        ids = q.enqueue_many("limited", [{"n": i} for i in range(40)], limits=["shared"])
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            samples.append(live_leases(dsn, "shared"))
            if {t.status for t in q.list_tasks(limit=100)} == {"completed"}:
                break
            time.sleep(0.01)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    logs = "".join((tmp_path / f"p{i}.log").read_text() for i in range(2))
    assert {t.status for t in q.list_tasks(limit=100)} == {"completed"}, logs
    assert max(samples) <= 2, f"more than 2 leases of the limit at once: {max(samples)}"
    assert 2 in samples, "the two slots were never used at once"
    holders = {e.worker_id.split("-")[0] for t in ids for e in q.events(t) if e.type == "claimed"}
    # Both claim all along; where the database notifies, a freed slot wakes both (NOTIFY).
    # Where nothing notifies (SQLite, a transaction-mode pooler with no listen_dsn), the
    # process that frees a slot may take it again before the other's next poll.
    assert holders == {"p0", "p1"} or (not q.capabilities.listen_notify and holders), holders
    assert usage(q, "shared") == 0


# -- rate ----------------------------------------------------------------------------------

def test_a_rate_of_5_per_second_admits_5_claims_a_second(q: leaseq.Queue) -> None:
    q.set_limit("rate", per_second=5, burst=1)
    q.enqueue_many("job", [{"i": i} for i in range(100)], limits=["rate"])
    w = q.register_worker("w")
    got, hinted = 0, False
    start = time.monotonic()
    while time.monotonic() - start < 5.0:
        claims = q.claim(w, limit=10)
        got += len(claims)
        if not claims:
            hinted = hinted or (claims.limit_wait is not None and 0 <= claims.limit_wait <= 0.2 + 1e-6)
        time.sleep(0.01)
    assert 20 <= got <= 31, f"{got} claims in 5 s at 5/s (a full bucket of 1 to start)"
    assert hinted, "an empty bucket should say when it next holds a token"
    [row] = q.limits()
    assert row["tokens"] is not None and row["tokens"] <= 1.0


def test_a_bucket_refills_by_the_database_clock_up_to_its_burst(q: leaseq.Queue) -> None:
    q.set_limit("burst", per_second=20, burst=3)
    q.enqueue_many("job", [{"i": i} for i in range(20)], limits=["burst"])
    w = q.register_worker("w")
    assert len(q.claim(w, limit=10)) == 3  # a new bucket starts full
    time.sleep(0.5)  # 10 tokens' worth of time, capped at the burst
    assert len(q.claim(w, limit=10)) == 3


# -- the async driver -----------------------------------------------------------------------

def test_the_async_queue_sets_reads_and_deletes_limits(dsn: str, q: leaseq.Queue) -> None:
    async def main() -> None:
        aq = await leaseq.connect_async(dsn)
        try:
            row = await aq.set_limit("a", max_running=1, by="test")
            assert row["max_running"] == 1 and row["running"] == 0
            await aq.enqueue("job", limits=["a"])
            await aq.enqueue("job", limits=["a"])
            w = await aq.register_worker("w")
            assert len(await aq.claim(w, limit=5)) == 1
            assert [r["running"] for r in await aq.limits()] == [1]
            await aq.delete_limit("a")
            assert await aq.limits() == []
        finally:
            await aq.close()

    asyncio.run(main())


# -- a worker on a full limit ----------------------------------------------------------------

class CountingQueue:
    """The queue, counting the claims a worker sends through it."""

    def __init__(self, q: leaseq.Queue):
        self._q = leaseq.AsyncQueue(q)
        self.capabilities = q.capabilities
        self.claims = 0

    def __getattr__(self, name: str):
        return getattr(self._q, name)

    async def claim(self, *args, **kwargs):
        self.claims += 1
        return await self._q.claim(*args, **kwargs)


def test_a_worker_does_not_spin_on_a_full_limit(q: leaseq.Queue, dsn: str) -> None:
    q.set_limit("one", max_running=1)
    app = leaseq.App(queue=q)
    gate = threading.Event()

    @app.task("held", limits=["one"])
    def held(ctx: leaseq.TaskContext, n: int) -> int:
        assert gate.wait(30)
        return n

    for n in range(5):
        held.enqueue(n=n)
    counting = CountingQueue(q)
    runtime = app.worker(transport=counting, concurrency=4)
    thread = threading.Thread(target=lambda: asyncio.run(runtime.run()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while live_leases(dsn, "one") < 1:
            assert time.monotonic() < deadline, "the worker never claimed"
            time.sleep(0.02)
        before = counting.claims
        time.sleep(2.0)  # one slot, held: the other four tasks wait
        spent = counting.claims - before
        assert live_leases(dsn, "one") == 1
        assert spent <= 25, f"{spent} claims in 2 s on a full limit: the worker is spinning"
    finally:
        gate.set()
        deadline = time.monotonic() + 60
        while {t.status for t in q.list_tasks(limit=10)} != {"completed"} and time.monotonic() < deadline:
            time.sleep(0.05)
        runtime.stop()
        thread.join(30)
    assert {t.status for t in q.list_tasks(limit=10)} == {"completed"}


@pytest.mark.parametrize("ending", ["complete", "fail", "release", "cancel"])
def test_an_ended_lease_gives_its_slots_back_once(q: leaseq.Queue, ending: str) -> None:
    """Whatever ends a lease gives its slots back in that transaction, and naming the task
    again (in a transaction of its own, or twice in one) gives nothing more back: the count
    of running leases never drops below what live leases hold."""
    from leaseq import engine
    from leaseq.engine.steps import BEGIN, COMMIT

    q.set_limit("api", max_running=3, by="ops")
    w = q.register_worker("w")
    ended, live = q.enqueue("job", {"n": 1}, limits=["api"]), q.enqueue("job", {"n": 2}, limits=["api"])
    claims = {c.task_id: c for c in q.claim(w, limit=2)}
    assert q.limits("api")[0]["running"] == 2
    c = claims[ended.id]
    {"complete": lambda: q.complete(w, c, None), "fail": lambda: q.fail(w, c, "boom", delay=0),
     "release": lambda: q.release(w, c), "cancel": lambda: q.cancel(ended.id, by="ops")}[ending]()
    assert q.limits("api")[0]["running"] == 1
    rows = [{"id": ended.id, "limits": ["api"]}, {"id": live.id, "limits": ["api"]}]
    def give_back_twice():  # as the engine gives slots back, named twice in one transaction
        yield BEGIN
        yield from engine.limits.release(q.settings, rows)
        yield from engine.limits.release(q.settings, rows)
        yield COMMIT

    for _ in range(3):
        q._run(give_back_twice())
    assert q.limits("api")[0]["running"] == 1  # the live lease's slot, still held
