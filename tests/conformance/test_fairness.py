"""Fair share across tenants (``enqueue(..., fairness_key=..., fairness_weight=...)``):
within one priority the claim serves the keys with tasks ready in weighted round robin,
first in first out within a key, decided in the claim statement; tasks without a key
are claimed as before. Both backends, with claimers really racing."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import threading
from collections import Counter
from typing import Any

import pytest
from pg_modes import own_connection

import leaseq
from leaseq import IdempotencyKeyConflict, InvalidInput
from leaseq.aio import AsyncQueue

from .test_transports import TRANSPORTS, over


def fair_rows(dsn: str) -> dict[tuple[str, int, str], dict[str, Any]]:
    """The keys' rows (leaseq_fairness), read by the test's own connection."""
    sql = "SELECT queue, priority, key, vtime, vstart, service, claimed FROM leaseq_fairness"
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"), timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            found = [dict(r) for r in conn.execute(sql)]
        finally:
            conn.close()
    else:
        with own_connection(dsn, autocommit=True) as conn:
            cur = conn.execute(sql)
            names = [c.name for c in cur.description]
            found = [dict(zip(names, r)) for r in cur.fetchall()]
    return {(r["queue"], r["priority"], r["key"]): r for r in found}


def keys_of(q: leaseq.Queue, claims: list[leaseq.Claim]) -> str:
    return "".join(c.task.fairness_key or "-" for c in claims)


def one_at_a_time(q: leaseq.Queue, w: leaseq.Worker, n: int, **claim: Any) -> list[leaseq.Claim]:
    out: list[leaseq.Claim] = []
    for _ in range(n):
        out += q.claim(w, **claim)
    return out


def in_proportion(order: str, shares: dict[str, int]) -> bool:
    """Whether every stretch of a claim order from its start served each key in proportion to
    its share, to within one task of each."""
    for n in range(len(order) + 1):
        seen = Counter(order[:n])
        rounds = [seen[k] / share for k, share in shares.items()]
        if max(rounds) - min(rounds) > 1 + 1 / min(shares.values()):
            return False
    return True


def two_to_one(order: str) -> bool:
    return in_proportion(order, {"a": 2, "b": 1})


def test_weights_interleave_the_claims_two_to_one(q: leaseq.Queue) -> None:
    """Deep backlogs of weights 2 and 1: the first key is served twice as often, in every
    stretch of the order, one claim at a time and within one batch alike."""
    w = q.register_worker("w")
    q.enqueue_many("k", [{"n": i} for i in range(90)], fairness_key="a", fairness_weight=2)
    q.enqueue_many("k", [{"n": i} for i in range(90)], fairness_key="b")
    claims = one_at_a_time(q, w, 30)
    order = keys_of(q, claims)
    assert Counter(order) == {"a": 20, "b": 10} and two_to_one(order), order
    assert "aab" * 8 in order  # settled into the round
    batch = keys_of(q, q.claim(w, limit=30))  # one statement: the answer in the order it decided
    assert Counter(batch) == {"a": 20, "b": 10} and two_to_one(batch) and "aab" * 8 in "b" + batch, batch
    t = claims[0].task
    assert (t.fairness_key, t.fairness_weight) == ("a", 2.0)
    more = keys_of(q, [c for _ in range(10) for c in q.claim(w, limit=3)])
    assert Counter(more) == {"a": 20, "b": 10} and two_to_one(more), more


def test_each_key_first_in_first_out_and_priority_first(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    a = q.enqueue_many("k", [{"n": i} for i in range(10)], fairness_key="a")
    b = q.enqueue_many("k", [{"n": i} for i in range(10)], fairness_key="b")
    urgent = q.enqueue_many("k", [{"n": i} for i in range(3)], fairness_key="b", priority=5)
    claims = one_at_a_time(q, w, 23)
    ids = [c.task_id for c in claims]
    assert ids[:3] == urgent  # priority before any fair share: b's urgent tasks, though b is served most
    assert [i for i in ids if i in a] == a and [i for i in ids if i in b] == b  # FIFO within each key
    order = keys_of(q, claims[3:])  # b's urgent tasks were served at their own priority: level here
    assert Counter(order) == {"a": 10, "b": 10} and in_proportion(order, {"a": 1, "b": 1}), order


def test_a_queue_without_keys_is_claimed_as_before_and_charges_nothing(dsn: str, q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    low = q.enqueue_many("k", [{"n": i} for i in range(5)])
    high = q.enqueue("k", priority=3).id
    claims = q.claim(w, limit=3) + q.claim(w, limit=10)
    assert [c.task_id for c in claims] == [high, *low]
    assert all(c.task.fairness_key is None and c.task.fairness_weight is None for c in claims)
    assert fair_rows(dsn) == {}  # no key served: no row written


def test_tasks_without_a_key_are_one_more_key(dsn: str, q: leaseq.Queue) -> None:
    """Beside keyed tasks, the tasks without a key take turns as one key of weight 1."""
    w = q.register_worker("w")
    q.enqueue_many("k", [{"n": i} for i in range(10)])
    q.enqueue_many("k", [{"n": i} for i in range(10)], fairness_key="c", fairness_weight=1)
    order = keys_of(q, one_at_a_time(q, w, 20))
    assert Counter(order[:10]) == {"-": 5, "c": 5}, order
    assert in_proportion(order, {"-": 1, "c": 1}), order
    rows = fair_rows(dsn)  # the last task without a key was claimed with no key queued: not charged
    assert rows[("default", 0, "")]["claimed"] == 9 and rows[("default", 0, "c")]["claimed"] == 10


def test_a_new_key_is_served_next_behind_a_deep_backlog_and_owed_nothing_after_idling(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    q.enqueue_many("k", [{"n": i} for i in range(300)], fairness_key="deep")
    one_at_a_time(q, w, 50)
    late = q.enqueue_many("k", [{"n": i} for i in range(3)], fairness_key="late")
    claims = one_at_a_time(q, w, 6)
    assert claims[0].task_id == late[0]  # the next claim: the deep backlog delays it by none
    assert sorted(c.task_id for c in claims if c.task.fairness_key == "late") == late
    # "late" idles while "deep" is served a hundred more; back, it is owed none of that time
    one_at_a_time(q, w, 100)
    q.enqueue_many("k", [{"n": i} for i in range(20)], fairness_key="late")
    order = keys_of(q, one_at_a_time(q, w, 10)).replace("late", "L").replace("deep", "D")
    assert order.startswith("L") and 5 <= order.count("L") <= 6, order


def test_the_keys_are_charged_what_they_were_served(dsn: str, q: leaseq.Queue) -> None:
    """A key's virtual time moves on by 1/weight per task claimed; the keys' rows say what
    each was served. A retried task is charged again when it is claimed again."""
    w = q.register_worker("w")
    q.enqueue_many("k", [{"n": i} for i in range(8)], fairness_key="x", fairness_weight=4)
    q.enqueue_many("k", [{"n": i} for i in range(8)], fairness_key="y", fairness_weight=0.5)
    claims = q.claim(w, limit=9)
    assert Counter(c.task.fairness_key for c in claims) == {"x": 8, "y": 1}
    rows = fair_rows(dsn)
    x, y = rows[("default", 0, "x")], rows[("default", 0, "y")]
    assert (x["claimed"], y["claimed"]) == (8, 1)
    assert math.isclose(x["service"], 8 * 0.25) and math.isclose(y["service"], 2.0)
    # both new: each started one task's cost behind the priority's virtual time (0), level
    assert math.isclose(x["vtime"], -0.25 + 2.0) and math.isclose(y["vtime"], -2.0 + 2.0)
    retried = next(c for c in claims if c.task.fairness_key == "y")
    q.fail(w, retried, "again", delay=0)
    rest = q.claim(w, limit=10)
    assert retried.task_id in [c.task_id for c in rest] and len(rest) == 8
    assert fair_rows(dsn)[("default", 0, "y")]["claimed"] == 9


def test_limits_kinds_and_queues_pass_over_a_key_without_stopping_the_others(dsn: str, q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    q.set_limit("slow-api", max_running=1)
    q.enqueue_many("k", [{"n": i} for i in range(5)], fairness_key="a", limits=["slow-api"])
    q.enqueue_many("k", [{"n": i} for i in range(5)], fairness_key="b")
    q.enqueue_many("other-kind", [{"n": i} for i in range(5)], fairness_key="c")
    q.enqueue_many("k", [{"n": i} for i in range(5)], fairness_key="a", queue="elsewhere")
    claims = q.claim(w, limit=10, kinds=["k"])
    assert Counter(c.task.fairness_key for c in claims) == {"a": 1, "b": 5}  # a's limit has room for one
    rows = fair_rows(dsn)
    assert rows[("default", 0, "a")]["claimed"] == 1 and ("default", 0, "c") not in rows  # refused: not charged
    assert [c.task.queue for c in q.claim(w, queue="elsewhere", limit=5)] == ["elsewhere"] * 5


def test_the_fair_claim_refuses_a_spent_window_and_passes_over_it_for_the_other_keys(dsn: str,
                                                                                      q: leaseq.Queue) -> None:
    """A limit's window (per_day) is judged in the fair claim as in the plain one: a batch
    takes the window to its total and no further, the other key is served in full, and once
    the window is spent its key's tasks are passed over while the others' are claimed."""
    w = q.register_worker("w")
    q.set_limit("daily", per_day=2)
    q.enqueue_many("k", [{"n": i} for i in range(5)], fairness_key="a", limits=["daily"], queue="windows")
    q.enqueue_many("k", [{"n": i} for i in range(5)], fairness_key="b", queue="windows")
    claims = q.claim(w, queue="windows", limit=10)  # one statement: the judgement is its own
    assert Counter(c.task.fairness_key for c in claims) == {"a": 2, "b": 5}
    [row] = q.limits("daily")
    assert row["day_used"] == 2
    assert fair_rows(dsn)[("windows", 0, "a")]["claimed"] == 2  # refused: not charged
    q.enqueue("k", {"n": 9}, fairness_key="b", queue="windows")
    assert [c.task.fairness_key for c in q.claim(w, queue="windows", limit=10)] == ["b"]  # a's passed over
    assert q.limits("daily")[0]["day_used"] == 2


def test_the_fair_claim_serves_a_started_task_only_under_a_version_its_worker_serves(q: leaseq.Queue) -> None:
    """Code versions hold in the fair claim: a task started under version 1 is passed over by
    a worker that serves only 2 (which takes the other key's task, stamping its own version),
    and claimed, keeping its version, by one that declares 1 compatible."""
    v1 = q.register_worker("v1", version="1")
    v2 = q.register_worker("v2", version="2")
    both = q.register_worker("v2-reads-1", version="2", compatible_versions=["1"])
    started = q.enqueue("k", {"n": 1}, fairness_key="a", max_attempts=10, queue="versions")
    [first] = q.claim(v1, queue="versions")
    assert first.task_id == started.id and first.task.code_version == "1"  # the fair claim stamps it
    q.fail(v1, first, "crashed", delay=0)
    fresh = q.enqueue("k", {"n": 2}, fairness_key="b", queue="versions")
    assert [(c.task_id, c.task.code_version) for c in q.claim(v2, queue="versions", limit=5)] == [(fresh.id, "2")]
    [served] = q.claim(both, queue="versions", limit=5)
    assert (served.task_id, served.task.code_version, served.task.fairness_key) == (started.id, "1", "a")


def test_bad_parameters_name_their_field_and_write_nothing(q: leaseq.Queue) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"fairness_weight": 2}, "fairness_weight"),  # a weight without a key
        ({"fairness_key": "t", "fairness_weight": 0}, "fairness_weight"),
        ({"fairness_key": "t", "fairness_weight": -1}, "fairness_weight"),
        ({"fairness_key": "t", "fairness_weight": float("nan")}, "fairness_weight"),
        ({"fairness_key": "t", "fairness_weight": float("inf")}, "fairness_weight"),
        ({"fairness_key": "t", "fairness_weight": 1e6}, "fairness_weight"),
        ({"fairness_key": "t", "fairness_weight": True}, "fairness_weight"),
        ({"fairness_key": "t", "fairness_weight": "2"}, "fairness_weight"),
        ({"fairness_key": ""}, "fairness_key"),
        ({"fairness_key": 7}, "fairness_key"),
        ({"fairness_key": "x" * 300}, "fairness_key"),
    ]
    for options, field in bad:
        with pytest.raises(InvalidInput) as raised:
            q.enqueue("k", **options)
        assert raised.value.field == field, (options, raised.value)
        with pytest.raises(InvalidInput) as raised:
            q.enqueue_many("k", [{}, {}], **options)
        assert raised.value.field == field, (options, raised.value)
    assert q.list_tasks(limit=10) == []


def test_an_idempotency_key_compares_the_fairness_key_and_weight(q: leaseq.Queue) -> None:
    first = q.enqueue("k", {"n": 1}, idempotency_key="once", fairness_key="t", fairness_weight=2)
    assert q.enqueue("k", {"n": 1}, idempotency_key="once", fairness_key="t", fairness_weight=2).id == first.id
    with pytest.raises(IdempotencyKeyConflict) as other_key:
        q.enqueue("k", {"n": 1}, idempotency_key="once", fairness_key="u", fairness_weight=2)
    assert "fairness_key" in other_key.value.fields
    with pytest.raises(IdempotencyKeyConflict) as other_weight:
        q.enqueue("k", {"n": 1}, idempotency_key="once", fairness_key="t")
    assert "fairness_weight" in other_weight.value.fields
    ids = q.enqueue_many("k", [{"n": 1}], idempotency_keys=["once"], fairness_key="t", fairness_weight=2)
    assert ids == [first.id]


def test_async_queue_and_app_definitions_take_the_same_parameters(dsn: str, q: leaseq.Queue) -> None:
    async def go() -> tuple[leaseq.Task, list[int]]:
        aq = AsyncQueue(q)
        one = await aq.enqueue("k", fairness_key="t1", fairness_weight=3)
        many = await aq.enqueue_many("k", [{}, {}], fairness_key="t2")
        return one, many

    one, many = asyncio.run(go())
    assert (one.fairness_key, one.fairness_weight) == ("t1", 3.0)
    assert {(q.get(i).fairness_key, q.get(i).fairness_weight) for i in many} == {("t2", 1.0)}
    app = leaseq.App(queue=q)

    @app.task("summarise", fairness_weight=2)
    def summarise(ctx: Any, doc: int) -> None:
        pass

    @app.task("batch", fairness_key="batch-jobs", fairness_weight=0.5)
    def batch(ctx: Any) -> None:
        pass

    plain = summarise.enqueue(doc=1)  # a weight declared without a key: no key, no weight
    tenant = summarise.options(fairness_key="acme").enqueue(doc=2)
    fixed = batch.enqueue()
    assert (plain.fairness_key, plain.fairness_weight) == (None, None)
    assert (tenant.fairness_key, tenant.fairness_weight) == ("acme", 2.0)
    assert (fixed.fairness_key, fixed.fairness_weight) == ("batch-jobs", 0.5)
    with pytest.raises(InvalidInput) as raised:
        app.task("bad", fairness_weight=0)
    assert raised.value.field == "fairness_weight"


THREADS = 6
BATCH = 4
#: keys and weights of the race: deep backlogs, so every key has work throughout
RACED = {"a": 1.0, "b": 1.0, "c": 2.0}
PER_KEY = 240


def test_racing_claimers_interleave_fairly_and_claim_each_task_once(dsn: str, q: leaseq.Queue) -> None:
    """Claimers race (their own connections, at once) until half of the work is claimed:
    no task is claimed twice, every key is charged exactly what it was served, and the keys
    were served in proportion to their weights, to within one batch per claimer."""
    for key, weight in RACED.items():
        q.enqueue_many("k", [{"key": key, "n": i} for i in range(PER_KEY)], fairness_key=key,
                       fairness_weight=weight)
    target = PER_KEY * len(RACED) // 2
    barrier = threading.Barrier(THREADS)
    lock = threading.Lock()
    got: list[tuple[int, str]] = []
    errors: list[BaseException] = []

    def claimer() -> None:
        try:
            with leaseq.connect(dsn) as mine:
                w = mine.register_worker("racer")
                barrier.wait()
                while True:
                    with lock:
                        if len(got) >= target:
                            return
                    claims = mine.claim(w, limit=BATCH)
                    with lock:
                        got.extend((c.task_id, c.task.fairness_key or "") for c in claims)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    ids = [i for i, _ in got]
    assert len(ids) == len(set(ids))  # no task claimed twice
    served = Counter(key for _, key in got)
    running = Counter(t.fairness_key for t in q.list_tasks(status="running", limit=10_000))
    assert served == running
    rows = fair_rows(dsn)
    for key, weight in RACED.items():  # charged exactly: no claim's charge lost to another's
        row = rows[("default", 0, key)]
        assert row["claimed"] == served[key]
        assert math.isclose(row["service"], served[key] / weight, rel_tol=1e-9)
        # its virtual time: where it started (new: one task's cost behind 0), moved on by
        # every claim's charge, each from where the claim before it left it
        assert math.isclose(row["vtime"], -1 / weight + served[key] / weight, rel_tol=1e-9), (key, row)
    total = sum(served.values())
    slack = THREADS * BATCH  # the claims in flight when the count was reached
    for key, weight in RACED.items():
        expected = total * weight / sum(RACED.values())
        assert abs(served[key] - expected) <= slack, (served, expected)
    # the keys' virtual times stayed level: none ran ahead of another by more than a batch
    times = [rows[("default", 0, key)]["vtime"] for key in RACED]
    assert max(times) - min(times) <= BATCH, times


def test_claims_on_two_connections_charge_one_key_without_waiting_on_each_other(pg_schema_dsn: str) -> None:
    """PostgreSQL: a claim whose transaction is still open holds no lock another connection's
    claim of the same key waits for (each charges the key in its connection's share, schema
    37); once both commit, the key is charged what both were served, as one claim after the
    other would have. (SQLite writes one transaction at a time: its claims never overlap.)"""
    import psycopg

    from leaseq.store.base import load_queries

    with leaseq.connect(pg_schema_dsn) as q:
        q.migrate()
        w = q.register_worker("w").id
        q.enqueue_many("k", [{"n": i} for i in range(40)], fairness_key="a")
    sql = load_queries("postgres")["claim_fair"]
    params = dict(queue="default", limit=4, lease_seconds=None, compact=False, route_first=True, kinds=None,
                  worker_id=w)
    first = psycopg.connect(pg_schema_dsn)
    seconds = []  # another connection, in another share than the first's (process ids modulo 64)
    try:
        pid = first.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        while not seconds or seconds[-1].info.backend_pid % 64 == pid % 64:
            seconds.append(psycopg.connect(pg_schema_dsn, autocommit=True))
        second = seconds[-1]
        first.execute("SET LOCAL ROLE leaseq_owner")  # the statement as its function runs it
        assert len(first.execute(sql, params).fetchall()) == 4  # claimed and charged, not committed
        second.execute("SET lock_timeout = '5s'")
        with second.transaction():
            second.execute("SET LOCAL ROLE leaseq_owner")
            # the claim skips the first's rows and charges the key without waiting for it
            assert len(second.execute(sql, params).fetchall()) == 4
        first.commit()
    finally:
        first.close()
        for conn in seconds:
            conn.close()
    row = fair_rows(pg_schema_dsn)[("default", 0, "a")]
    assert (row["claimed"], row["service"], row["vtime"]) == (8, 8.0, -1.0 + 8)


def test_racing_claims_of_a_slot_at_a_time_never_come_back_empty_from_a_deep_key(dsn: str, q: leaseq.Queue) -> None:
    """Claimers racing for one or two tasks at a time (a worker's free slots), each completing
    what it claimed: while a key's backlog is deep, no claim comes back empty. (The rows of the
    claims beside one, and of those committed since it began, are skipped: with too few rows
    read per key, every one of them could be taken.)"""
    claimers, rounds = 8, 40
    q.enqueue_many("k", [{"n": i} for i in range(claimers * rounds * 2 + 200)], fairness_key="deep")
    barrier = threading.Barrier(claimers)
    empty: list[int] = []
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            with leaseq.connect(dsn) as mine:
                w = mine.register_worker("racer")
                barrier.wait()
                for i in range(rounds):
                    claims = mine.claim(w, limit=1 + (n + i) % 2)
                    if not claims:
                        empty.append(n)
                    mine.complete_many(w, [(c, None) for c in claims])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not empty, f"{len(empty)} of {claimers * rounds} claims came back empty"


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_one_keys_backlog_is_charged_exactly_and_a_second_key_is_served_next(dsn: str, q: leaseq.Queue,
                                                                              kind: str) -> None:
    """One key alone queued (on PostgreSQL its claims after the first run claim_fair_one): each
    claim charges the key exactly what it served, as claim_fair does; a second key enqueued
    is served at the next claim, and the first resumes after it."""
    with over(kind, q, "worker") as t:
        w = t.register_worker("w")
        a = q.enqueue_many("k", [{"n": i} for i in range(30)], fairness_key="a", fairness_weight=2)
        served = [c.task_id for _ in range(6) for c in t.claim(w, limit=2)]
        assert served == a[:12]
        row = fair_rows(dsn)[("default", 0, "a")]
        assert (row["claimed"], row["service"], row["vtime"]) == (12, 6.0, -0.5 + 6.0)
        b = q.enqueue("k", {"n": 0}, fairness_key="b")
        assert [c.task_id for c in t.claim(w)] == [b.id]
        assert [c.task_id for c in t.claim(w, limit=2)] == a[12:14]
        rows = fair_rows(dsn)
        assert (rows[("default", 0, "a")]["claimed"], rows[("default", 0, "b")]["claimed"]) == (14, 1)
        assert rows[("default", 0, "a")]["service"] == 7.0


def test_a_key_enqueued_during_a_one_key_claim_is_served_next(pg_schema_dsn: str) -> None:
    """PostgreSQL, the race: a second key's task is enqueued while a one-key claim
    (claim_fair_one) runs, held at the worker row's lock with its snapshot taken. The claim
    answers as one made before the enqueue; the queue's next claim serves the new key."""
    import time


    with leaseq.connect(pg_schema_dsn) as q:
        q.migrate()
        w = q.register_worker("w")
        a = q.enqueue_many("k", [{"n": i} for i in range(10)], fairness_key="a")
        assert [c.task_id for c in q.claim(w)] == a[:1]  # claim_fair: one key alone
        assert "default" in q.settings.fair_one_queues
        got: list[list[int]] = []
        with own_connection(pg_schema_dsn) as locker:
            locker.execute("SELECT 1 FROM leaseq_workers WHERE id = %s FOR UPDATE", (w.id,))
            [[pid]] = locker.execute("SELECT pg_backend_pid()").fetchall()
            claimer = threading.Thread(target=lambda: got.append([c.task_id for c in q.claim(w)]))
            claimer.start()
            with own_connection(pg_schema_dsn, autocommit=True) as watch:
                deadline = time.monotonic() + 10
                while not watch.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                        (pid,)).fetchone()[0]:  # type: ignore[index]
                    assert time.monotonic() < deadline, "the claim never reached the worker row"
                    time.sleep(0.01)
            b = q.enqueue("k", {"n": 0}, fairness_key="b")
            locker.rollback()
            claimer.join(timeout=10)
        assert got == [a[1:2]]  # as before the enqueue
        assert [c.task_id for c in q.claim(w)] == [b.id]  # the new key at once
        assert "default" not in q.settings.fair_one_queues
        assert [c.task_id for c in q.claim(w, limit=3)] == a[2:5]
        row = fair_rows(pg_schema_dsn)[("default", 0, "a")]
        assert (row["claimed"], row["service"]) == (5, 5.0)


#: each way a task makes its queue's one-key claim test limits and singleton keys
LIMITED: dict[str, dict[str, Any]] = {
    "limit": dict(limits=["one-key-cap"]),
    "singleton_key": dict(singleton_key="only-one"),
}


@pytest.mark.parametrize("limited", sorted(LIMITED))
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_one_keys_backlog_that_gains_a_limited_task_is_claimed_with_its_tests_at_once(
        dsn: str, q: leaseq.Queue, kind: str, limited: str) -> None:
    """One key's backlog of tasks that name no limit and no singleton key (on PostgreSQL
    claimed by claim_fair_one_plain, which reads neither): a task of the key that names one,
    enqueued at a higher priority, is the next claim's (priority first: a claim that passed
    over it would hand out the backlog's next task), with its limit's slot taken; and the
    key is charged as before."""
    q.set_limit("one-key-cap", max_running=1)
    with over(kind, q, "worker") as t:
        w = t.register_worker("w")
        a = q.enqueue_many("k", [{"n": i} for i in range(10)], fairness_key="a")
        assert [c.task_id for _ in range(3) for c in t.claim(w)] == a[:3]
        hi = q.enqueue("k", {"n": 99}, fairness_key="a", priority=5, **LIMITED[limited])
        assert [c.task_id for c in t.claim(w)] == [hi.id]
        assert [c.task_id for c in t.claim(w, limit=2)] == a[3:5]
        assert q.limits("one-key-cap")[0]["running"] == (1 if limited == "limit" else 0)
        rows = fair_rows(dsn)
        assert rows[("default", 0, "a")]["claimed"] == 5 and rows[("default", 5, "a")]["claimed"] == 1


def test_a_limited_task_enqueued_during_a_lean_one_key_claim_is_held_by_its_limit(pg_schema_dsn: str) -> None:
    """PostgreSQL, the race: a task of the queue's one key that names a limit is enqueued while
    the lean one-key claim (claim_fair_one_plain, which tests no limit) runs, held at the
    worker row's lock with its snapshot taken. The claim answers as one made before the
    enqueue; the queue's next claim tests limits (claim_fair_one): it takes the task by its
    priority and its limit's slot, and a second such task, its limit full, is held back."""
    import time


    with leaseq.connect(pg_schema_dsn) as q:
        q.migrate()
        q.set_limit("cap", max_running=1)
        w = q.register_worker("w")
        a = q.enqueue_many("k", [{"n": i} for i in range(10)], fairness_key="a")
        assert [c.task_id for _ in range(2) for c in q.claim(w)] == a[:2]  # claim_fair, then the lean one
        assert "default" in q.settings.fair_one_queues and "default" not in q.settings.limited_queues
        got: list[list[int]] = []
        with own_connection(pg_schema_dsn) as locker:
            locker.execute("SELECT 1 FROM leaseq_workers WHERE id = %s FOR UPDATE", (w.id,))
            [[pid]] = locker.execute("SELECT pg_backend_pid()").fetchall()
            claimer = threading.Thread(target=lambda: got.append([c.task_id for c in q.claim(w)]))
            claimer.start()
            with own_connection(pg_schema_dsn, autocommit=True) as watch:
                deadline = time.monotonic() + 10
                while not watch.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                        (pid,)).fetchone()[0]:  # type: ignore[index]
                    assert time.monotonic() < deadline, "the claim never reached the worker row"
                    time.sleep(0.01)
            capped = q.enqueue("k", {"n": 99}, fairness_key="a", priority=5, limits=["cap"])
            locker.rollback()
            claimer.join(timeout=10)
        assert got == [a[2:3]]  # as before the enqueue
        [taken] = q.claim(w)
        assert taken.task_id == capped.id  # the limits' tests at once: priority first
        assert "default" in q.settings.limited_queues
        assert q.limits("cap")[0]["running"] == 1
        held = q.enqueue("k", {"n": 100}, fairness_key="a", priority=5, limits=["cap"])
        assert [c.task_id for c in q.claim(w, limit=2)] == a[3:5]  # the limit is full: held back
        assert q.get(held.id).status == "queued" and q.limits("cap")[0]["running"] == 1
        q.complete(w, taken)
        assert [c.task_id for c in q.claim(w)] == [held.id]
        row = fair_rows(pg_schema_dsn)[("default", 0, "a")]
        assert (row["claimed"], row["service"]) == (5, 5.0)
