"""Completions that lease the next tasks in the same request (``claim_with_completion``).

A batch of completions may ask for more work: after the completions, in
their transaction (the claim authorized for its queue), up to ``claim.limit``
tasks are leased; where that claim could wait for a lock out of order, in a
transaction of its own after their commit. The claim's refusal or failure
never undoes the completions; failed completions take the claim with them;
bad input refuses the whole request and changes nothing. A remote worker uses it to refill the slots a batch frees:
one request per batch instead of a completion and then a claim.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq import engine
from leaseq.auth import AccessDenied
from leaseq.client import AsyncRemoteQueue, RemoteQueue
from leaseq.worker import WorkerRuntime
from pg_modes import own_connection
from conformance.support import run_out

from .support import error_of, snapshot


def _worker(svc: Any, name: str = "agent", **options: Any) -> tuple[RemoteQueue, Any, str]:
    token = svc.token("worker", name=f"{name}-token", **(options or {"all_queues": True}))
    rq = svc.remote(token)
    return rq, rq.register_worker(name), token


def test_completions_then_the_next_leases_in_one_request(svc) -> None:
    rq, w, _ = _worker(svc)
    ids = [svc.q.enqueue("job", {"n": i}).id for i in range(5)]
    first = rq.claim(w, limit=2)
    done, more = rq.complete_and_claim(w, [(c, {"n": c.task_id}) for c in first], limit=10)
    assert done == {c.task_id for c in first}
    assert sorted(c.task_id for c in more) == sorted(set(ids) - done)  # all that was left, no more
    for c in more:
        task = svc.q.get(c.task_id)
        assert (task.status, task.lease_owner, task.claim_generation) == ("running", w.id, c.generation)
        assert c.worker_id == w.id and c.task.kind == "job"
    assert [svc.q.get(i).status for i in sorted(done)] == ["completed", "completed"]
    # the new leases are held like any others: renewed and completed under their generations
    assert set(rq.renew_leases(w, more)) == {c.task_id for c in more}
    assert rq.complete_and_claim(w, [(c, None) for c in more], limit=3) == ({c.task_id for c in more}, [])


def test_a_refused_completion_does_not_stop_the_claim(svc) -> None:
    rq, w, _ = _worker(svc)
    for i in range(3):
        svc.q.enqueue("job", {"n": i})
    [stale, held] = rq.claim(w, limit=2)
    svc.q.cancel(stale.task_id, "operator stopped it")
    done, more = rq.complete_and_claim(w, [(stale, "late"), (held, "ok")], limit=2)
    assert done == {held.task_id}
    assert svc.q.get(stale.task_id).status == "cancelled" and svc.q.get(stale.task_id).result is None
    assert len(more) == 1 and svc.q.get(more[0].task_id).status == "running"


def test_a_claim_refused_for_its_queue_leaves_the_completions_committed(svc) -> None:
    rq, w, token = _worker(svc, queues=["default"])
    svc.q.enqueue("job", {})
    other = svc.q.enqueue("job", {}, queue="secret")
    [c] = rq.claim(w)
    body = {"tasks": [{"task_id": c.task_id, "generation": c.generation, "result": 1}],
            "claim": {"queue": "secret", "limit": 5}}
    with svc.http(token) as http:
        resp = http.post(f"/v1/workers/{w.id}/complete", json=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert data["completed"] == [c.task_id] and data["claims"] == []
    assert data["claim_error"]["code"] == "forbidden", data
    assert svc.q.get(c.task_id).status == "completed"
    assert svc.q.get(other.id).status == "queued"  # nothing leased from the queue the token may not claim


def test_a_paused_queue_hands_out_nothing_with_the_completions(svc) -> None:
    rq, w, _ = _worker(svc)
    for _ in range(2):
        svc.q.enqueue("job", {})
    [c] = rq.claim(w)
    svc.q.pause("default")
    assert rq.complete_and_claim(w, [(c, None)], limit=5) == ({c.task_id}, [])
    assert [t.status for t in svc.q.list_tasks()].count("queued") == 1


def test_hostile_claims_refuse_the_whole_request_and_change_nothing(svc) -> None:
    rq, w, token = _worker(svc)
    for _ in range(2):
        svc.q.enqueue("job", {})
    [c] = rq.claim(w)
    task = {"task_id": c.task_id, "generation": c.generation, "result": "ok"}
    cases = {
        "bad queue name": ({"queue": "no spaces allowed", "limit": 1}, "claim.queue"),
        "zero limit": ({"limit": 0}, "claim.limit"),
        "huge limit": ({"limit": 10_001}, "claim.limit"),
        "string limit": ({"limit": "5"}, "claim.limit"),
        "negative lease": ({"limit": 1, "lease_seconds": -1.0}, "claim.lease_seconds"),
        "empty kinds": ({"limit": 1, "kinds": []}, "claim.kinds"),
        "blank kind": ({"limit": 1, "kinds": ["job", " "]}, "claim.kinds[1]"),
        "unknown field": ({"limit": 1, "wait": 5}, "claim.wait"),
        "not an object": ([1], "claim"),
    }
    before = snapshot(svc.dsn)
    with svc.http(token) as http:
        for name, (claim, field) in cases.items():
            resp = http.post(f"/v1/workers/{w.id}/complete", json={"tasks": [task], "claim": claim})
            assert resp.status_code == 422, (name, resp.status_code, resp.text[:300])
            assert error_of(resp)["field"] == field, (name, resp.json())
    assert snapshot(svc.dsn) == before  # not even the completion was written


class Counting(AsyncRemoteQueue):
    """The real client (the worker's port onto the service), counting the requests the runtime makes."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()
        self.on_refill: Any = None
        #: seconds each complete_and_claim answers late, after the service committed it
        self.answer_late = 0.0

    def _count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + n

    async def claim(self, *args: Any, **kwargs: Any) -> list[leaseq.Claim]:
        self._count("claim")
        return await super().claim(*args, **kwargs)

    async def complete_many(self, *args: Any, **kwargs: Any) -> set[int]:
        self._count("complete")
        return await super().complete_many(*args, **kwargs)

    async def complete_and_claim(self, *args: Any, **kwargs: Any) -> tuple[set[int], leaseq.Claims]:
        self._count("complete_and_claim")
        if self.on_refill is not None:
            self.on_refill()
            await asyncio.sleep(0)  # the stop request lands while the request is on its way
        done, claims = await super().complete_and_claim(*args, **kwargs)
        self._count("refilled", len(claims))
        await asyncio.sleep(self.answer_late)
        return done, claims

    async def renew_leases(self, *args: Any, **kwargs: Any) -> dict[int, Any]:
        self._count("renew")
        return await super().renew_leases(*args, **kwargs)


class Ran(list[int]):
    """The tasks whose handlers ran, and the most running at once."""

    running = most = 0


def _runtime(svc: Any, concurrency: int) -> tuple[WorkerRuntime, Counting, Ran]:
    rq = Counting(svc.url, svc.token("worker", all_queues=True), timeout=10)  # the runtime closes it
    app = leaseq.App(name="refill")
    ran = Ran()

    @app.task("job")
    async def job(ctx: leaseq.TaskContext, n: int) -> int:
        ran.append(n)
        ran.running += 1
        ran.most = max(ran.most, ran.running)
        try:
            await asyncio.sleep(0.002 * (n % 5))  # staggered: batches of different sizes
        finally:
            ran.running -= 1
        return n

    return WorkerRuntime(app, rq, concurrency=concurrency), rq, ran


def test_a_busy_remote_worker_refills_its_slots_with_its_completions(svc) -> None:
    tasks = 60
    ids = svc.q.enqueue_many("job", [{"n": i} for i in range(tasks)])
    runtime, rq, ran = _runtime(svc, concurrency=6)
    stats = asyncio.run(runtime.run(until_idle=True))
    assert sorted(ran) == list(range(tasks))  # each task ran once
    assert ran.most == 6  # full, and never more handlers than the concurrency
    assert stats.completed == tasks
    assert {svc.q.get(i).status for i in ids} == {"completed"}
    # Each batch of completions brought the next tasks: the worker claimed on its own
    # only to start and, at the end, to find the queue empty. (Without the refill every
    # batch is followed by a claim of its own: at least tasks / concurrency claims.)
    assert rq.calls["complete_and_claim"] >= tasks // 6
    assert rq.calls.get("claim", 0) < rq.calls["complete_and_claim"] // 2, rq.calls


def test_leases_answered_to_a_stopping_worker_are_given_back_unstarted(svc) -> None:
    ids = svc.q.enqueue_many("job", [{"n": i} for i in range(8)])
    runtime, rq, ran = _runtime(svc, concurrency=2)
    rq.on_refill = runtime.stop  # the worker begins stopping while the request is on its way
    stats = asyncio.run(runtime.run())
    statuses = {i: svc.q.get(i).status for i in ids}
    assert "running" not in statuses.values(), statuses  # no lease left behind
    assert stats.completed == len(ran) == 2
    # released unstarted, with the attempt its claim counted: as if never claimed, but fenced
    given_back = [i for i in ids if statuses[i] == "queued" and svc.q.get(i).claim_generation == 1]
    assert given_back and len(given_back) == rq.calls["refilled"], (statuses, rq.calls)  # released, not run
    for i in given_back:
        assert svc.q.get(i).attempts == 0
        released = [e for e in svc.q.events(i) if e.type == "lease_released"]
        assert released and "never started" in released[-1].detail.get("reason", ""), svc.q.events(i)
        assert released[-1].detail["started"] is False


# a 0.3 s lease on a loaded machine runs out before the first completion is sent (seen: five
# reclaims in a row, none completed): the test runs with the serial ones, alone
@pytest.mark.serial
def test_a_lease_refused_while_its_completion_is_answered_is_not_renewed_again(svc) -> None:
    """Over HTTP as directly (tests/worker/test_runtime.py): a completion whose answer is
    late leaves its lease ended in the database and still held by the worker; the first
    renewal is refused and the worker renews it no more (before: thousands of requests)."""
    task = svc.q.enqueue("job", {"n": 0})
    rq = Counting(svc.url, svc.token("worker", all_queues=True), timeout=10)  # the runtime closes it
    rq.answer_late = 1.5
    app = leaseq.App(name="late")

    @app.task("job")
    def job(ctx: leaseq.TaskContext, n: int) -> int:
        return n

    stats = asyncio.run(WorkerRuntime(app, rq, concurrency=1, lease_seconds=0.3).run(until_idle=True))
    assert stats.completed == 1 and stats.lost == 0
    assert svc.q.get(task.id).status == "completed"
    assert rq.calls["complete_and_claim"] == 1
    # A renewal every 0.1 s would be 15; the first one is refused (the task is completed).
    assert 1 <= rq.calls.get("renew", 0) <= 2, rq.calls


@pytest.mark.parametrize("refusal", ["old service"])
def test_a_service_that_refuses_the_claim_field_is_completed_plainly(svc, monkeypatch, refusal: str) -> None:
    # A service from before this field answers 422 naming it: the worker completes
    # without it from then on, and nothing is lost.
    async def refuse(self: Counting, *args: Any, **kwargs: Any) -> Any:
        self._count("complete_and_claim")
        raise leaseq.InvalidInput("claim", "extra inputs are not permitted")

    monkeypatch.setattr(Counting, "complete_and_claim", refuse)
    tasks = 20
    ids = svc.q.enqueue_many("job", [{"n": i} for i in range(tasks)])
    runtime, rq, ran = _runtime(svc, concurrency=4)
    stats = asyncio.run(runtime.run(until_idle=True))
    assert sorted(ran) == list(range(tasks)) and stats.completed == tasks
    assert {svc.q.get(i).status for i in ids} == {"completed"}
    assert rq.calls["complete_and_claim"] == 1  # asked once, then never again


def test_completions_that_fail_take_the_claim_with_them(svc, monkeypatch) -> None:
    # The claim runs after the completions in their transaction: when the completions
    # fail, it rolls back too, and no lease is left that no answer hands over.
    rq, w, _ = _worker(svc)
    ids = [svc.q.enqueue("job", {"n": i}).id for i in range(4)]
    [c] = rq.claim(w)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise leaseq.BackendUnavailable("the database went away in the middle of the request")
        yield  # an operation

    monkeypatch.setattr(engine.leases, "_complete_many", broken)
    with pytest.raises(leaseq.BackendUnavailable):
        rq.complete_and_claim(w, [(c, "ok")], limit=3)
    monkeypatch.undo()
    assert svc.q.get(c.task_id).status == "running"  # its completion was not written: the worker retries it
    for i in ids:
        if i != c.task_id:
            task = svc.q.get(i)
            assert (task.status, task.lease_owner, task.attempts) == ("queued", None, 0), task  # never leased
    assert rq.complete_and_claim(w, [(c, "ok")], limit=3)[0] == {c.task_id}  # the retry goes through


def test_a_claim_that_fails_after_the_completions_leaves_them_written(svc, monkeypatch) -> None:
    # The claim's statement fails inside the completions' transaction: it rolls back,
    # the completions are written again on their own, and the answer reports the claim.
    rq, w, token = _worker(svc)
    ids = [svc.q.enqueue("job", {"n": i}).id for i in range(3)]
    [c] = rq.claim(w)
    tried: list[bool] = []

    def broken(*args: Any, **kwargs: Any) -> Any:
        tried.append(True)
        raise leaseq.BackendUnavailable("the claim statement failed")
        yield  # an operation

    monkeypatch.setattr(engine.leases, "_claim", broken)
    body = {"tasks": [{"task_id": c.task_id, "generation": c.generation, "result": 1}], "claim": {"limit": 5}}
    with svc.http(token) as http:
        resp = http.post(f"/v1/workers/{w.id}/complete", json=body)
    monkeypatch.undo()
    assert tried and resp.status_code == 200, resp.text
    data = resp.json()
    assert data["completed"] == [c.task_id] and data["claims"] == [], data
    assert data["claim_error"]["code"] == leaseq.BackendUnavailable.code, data
    assert svc.q.get(c.task_id).status == "completed"
    assert [e.type for e in svc.q.events(c.task_id)].count("completed") == 1  # written once, not twice
    assert {svc.q.get(i).status for i in ids if i != c.task_id} == {"queued"}


def test_completions_that_give_limit_slots_back_claim_in_a_transaction_of_their_own(svc) -> None:
    # The claim then follows the completions' commit: still answered with them.
    svc.q.set_limit("model-api", max_running=2, by="test")
    rq, w, _ = _worker(svc)
    for i in range(4):
        svc.q.enqueue("job", {"n": i}, limits=["model-api"])
    first = rq.claim(w, limit=5)
    assert len(first) == 2  # the limit's two slots
    done, more = rq.complete_and_claim(w, [(c, None) for c in first], limit=5)
    assert done == {c.task_id for c in first} and len(more) == 2  # the slots the completions freed
    assert svc.q.limits()[0]["running"] == 2


def test_a_claim_that_must_route_expired_leases_first_still_comes_with_the_completions(svc) -> None:
    # An expired lease waits to be routed: the claim's fast path cannot settle, and its
    # slow path (which locks the worker row) follows the completions' commit instead.
    rq, w, _ = _worker(svc)
    lost, paused, _ = _worker(svc, name="paused")
    for i in range(3):
        svc.q.enqueue("job", {"n": i})
    [stale] = lost.claim(paused, lease_seconds=0.2)
    [c] = rq.claim(w)
    time.sleep(0.5)  # the other worker's lease runs out
    done, more = rq.complete_and_claim(w, [(c, None)], limit=5)
    assert done == {c.task_id}
    assert len(more) == 2 and stale.task_id in {m.task_id for m in more}  # routed back, and claimed again
    assert [m.generation for m in more if m.task_id == stale.task_id] == [stale.generation + 1]


def test_racing_completions_and_claims_under_shared_limits_never_deadlock(svc) -> None:
    # Workers complete tasks that hold limit slots and, in the same request, claim tasks
    # that need other limits too. Were the claim to run in the completions' transaction,
    # it would take limit rows after the completions locked theirs, out of key order,
    # against another request's claim taking them in order: PostgreSQL's deadlock detector
    # would break the cycle (a second's wait, then an error) and count it.
    if svc.q.store.dialect != "postgres":
        pytest.skip("SQLite runs one write transaction at a time: no row lock is ever waited for")
    for key in ("a", "b", "c"):
        svc.q.set_limit(key, max_running=50, by="test")
    shapes = [["a", "b", "c"], ["c"], ["b"], ["a", "c"], ["b", "c"]]
    for i, shape in enumerate(shapes):
        svc.q.enqueue_many("job", [{"n": n} for n in range(i, 1500, len(shapes))], limits=shape)
    before = _deadlocks(svc.dsn)
    errors: list[BaseException] = []

    threads = [threading.Thread(target=_drain, args=(svc, f"racer-{n}", errors)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert {t.status for t in svc.q.list_tasks(limit=2000)} == {"completed"}
    assert _deadlocks(svc.dsn) == before


def test_claims_that_must_route_expired_leases_under_shared_limits_never_deadlock(svc) -> None:
    # A stalled worker keeps leaving expired leases that hold limit slots, so the claims
    # that come with completions cannot settle on their fast path. Their slow path routes
    # those leases (giving slots back: limit rows locked) and then claims (taking slots:
    # more limit rows). Run inside the completions' transaction, the two would take limit
    # rows out of key order, against other claims taking them in order: a deadlock, which
    # PostgreSQL breaks after a second and counts. So it runs after their commit.
    _limited_jobs(svc, 1200)
    before = _deadlocks(svc.dsn)
    errors: list[BaseException] = []
    stop = threading.Event()

    staller = threading.Thread(target=_stall, args=(svc, stop))
    staller.start()
    threads = [threading.Thread(target=_drain, args=(svc, f"racer-{n}", errors)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    staller.join(30)
    assert not errors, errors
    time.sleep(1.2)  # a backend reports its counters to pg_stat_database within a second
    assert _deadlocks(svc.dsn) == before


def test_claims_after_completions_that_gave_no_slots_back_never_route_in_their_transaction(svc) -> None:
    # The completions here are of tasks that name no limit, so their transaction holds no
    # limit row and the claim may join it; but only on its one-statement fast path. Where
    # expired leases holding limit slots wait to be routed, routing them in that
    # transaction would lock their limit rows (slots given back) before the claim takes
    # limit rows in key order: against plain claims taking the same rows in order, a
    # deadlock. So such a claim is left to transactions of its own (engine.leases:
    # complete_and_claim's fast_only).
    _limited_jobs(svc, 1500)
    svc.q.enqueue_many("free", [{"n": n} for n in range(1500)], queue="free")
    before = _deadlocks(svc.dsn)
    errors: list[BaseException] = []
    stop = threading.Event()

    def mixed(name: str) -> None:
        # completes tasks without limits, and claims tasks with limits in the same request
        try:
            rq, w, _ = _worker(svc, name=name)
            while True:
                free = rq.claim(w, queue="free", limit=2, lease_seconds=60)
                if not free:
                    return
                _, held = rq.complete_and_claim(w, [(c, None) for c in free], limit=3, lease_seconds=60)
                if held:
                    rq.complete_many(w, [(c, None) for c in held])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def plain(name: str) -> None:
        try:
            rq, w, _ = _worker(svc, name=name)
            while not stop.is_set():
                held = rq.claim(w, limit=4, lease_seconds=60)
                if held:
                    rq.complete_many(w, [(c, None) for c in held])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    staller = threading.Thread(target=_stall, args=(svc, stop))
    others = [threading.Thread(target=plain, args=(f"plain-{n}",)) for n in range(3)]
    racers = [threading.Thread(target=mixed, args=(f"mixed-{n}",)) for n in range(6)]
    for t in [staller, *others, *racers]:
        t.start()
    for t in racers:
        t.join(120)
    stop.set()
    for t in [staller, *others]:
        t.join(30)
    assert not errors, errors
    time.sleep(1.2)  # a backend reports its counters to pg_stat_database within a second
    assert _deadlocks(svc.dsn) == before


def test_a_revocation_racing_completions_whose_claim_routes_expired_leases_never_deadlocks(svc) -> None:
    # An expired lease awaits routing, so the claim that comes with the completions takes
    # its slow path, which locks the worker row. A revocation locks that row first and then
    # the worker's tasks. Were the slow path to run in the completions' transaction, it
    # would ask for the worker row while holding a completed task's row that the
    # revocation waits for: a lock cycle, which PostgreSQL breaks (a second's wait, then
    # an error) and counts. Each round revokes a fresh worker at a moment swept across
    # the request.
    if svc.q.store.dialect != "postgres":
        pytest.skip("SQLite runs one write transaction at a time: no row lock is ever waited for")
    stalled_rq, stalled, _ = _worker(svc, name="stalled")
    before = _deadlocks(svc.dsn)
    unexpected: list[BaseException] = []
    rounds = 40
    for rnd in range(rounds):
        rq, w, _ = _worker(svc, name=f"revoked-{rnd}")
        svc.q.enqueue_many("job", [{"round": rnd, "n": n} for n in range(3)])
        [held] = rq.claim(w, lease_seconds=60)
        [stale] = stalled_rq.claim(stalled, lease_seconds=60)
        run_out(svc.q, stalled, stale)
        start = threading.Barrier(2)

        def complete() -> None:
            start.wait()
            try:
                rq.complete_and_claim(w, [(held, None)], limit=1)
            except (leaseq.LeaseLost, AccessDenied, leaseq.UnknownWorker):
                pass  # revoked first: refused, as it should be
            except BaseException as exc:  # pragma: no cover - reported below
                unexpected.append(exc)

        def revoke(delay: float = rnd % 10 * 0.0008) -> None:
            start.wait()
            time.sleep(delay)
            try:
                svc.q.revoke_worker(w, by="test")
            except BaseException as exc:  # pragma: no cover - reported below
                unexpected.append(exc)

        threads = [threading.Thread(target=complete), threading.Thread(target=revoke)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert svc.q.get(held.task_id).status in ("completed", "running", "queued")
    time.sleep(1.2)  # a backend reports its counters to pg_stat_database within a second
    assert _deadlocks(svc.dsn) == before
    assert not unexpected, unexpected


def _drain(svc: Any, name: str, errors: list[BaseException]) -> None:
    """A remote worker that completes what it holds and claims the next tasks in the same
    request, four at a time, until none is left; what it raises goes to ``errors``."""
    try:
        rq, w, _ = _worker(svc, name=name)
        held = rq.claim(w, limit=4)
        while held:
            _, held = rq.complete_and_claim(w, [(c, None) for c in held], limit=4)
    except BaseException as exc:  # pragma: no cover - reported by the test
        errors.append(exc)


def _limited_jobs(svc: Any, count: int) -> None:
    """``count`` tasks under three shared limits, in six shapes (on PostgreSQL only)."""
    if svc.q.store.dialect != "postgres":
        pytest.skip("SQLite runs one write transaction at a time: no row lock is ever waited for")
    for key in ("a", "b", "c"):
        svc.q.set_limit(key, max_running=100, by="test")
    shapes = [["a", "b", "c"], ["c"], ["b"], ["a", "c"], ["b", "c"], ["a"]]
    for i, shape in enumerate(shapes):
        svc.q.enqueue_many("job", [{"n": n} for n in range(i, count, len(shapes))], limits=shape, max_attempts=50)


def _stall(svc: Any, stop: threading.Event) -> None:
    """A remote worker whose leases all run out, one after another until ``stop``: expired
    leases holding their limit slots keep waiting to be routed."""
    rq, w, _ = _worker(svc, name="staller")
    while not stop.is_set():
        for c in rq.claim(w, limit=3, lease_seconds=60):
            run_out(svc.q, w, c)
        time.sleep(0.002)


def _deadlocks(dsn: str) -> int:
    with own_connection(dsn) as conn:
        return int(conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
                   .fetchone()[0])


def test_a_refused_token_counts_once_against_the_failed_authentication_limit(svc, monkeypatch) -> None:
    rq, w, token = _worker(svc)
    access = svc.app.state.access
    counted: list[Any] = []
    failed = access.failed
    monkeypatch.setattr(access, "failed", lambda exc, client: (counted.append(exc), failed(exc, client))[1])
    body = {"tasks": [], "claim": {"limit": 1}}
    with svc.http(token[:-4] + "abcd") as http:  # the right id, a wrong secret
        resp = http.post(f"/v1/workers/{w.id}/complete", json=body)
    assert resp.status_code == 401, resp.text
    assert len(counted) == 1  # one request, one failure, though two transactions checked it


def test_an_unusable_result_fails_its_task_alone_and_keeps_the_refill(svc) -> None:
    # A result the queue cannot store fails only its own task; the worker's other
    # completions still bring the next tasks.
    ids = svc.q.enqueue_many("job", [{"n": i} for i in range(12)])
    rq = Counting(svc.url, svc.token("worker", all_queues=True), timeout=10)  # the runtime closes it
    app = leaseq.App(name="refill")

    @app.task("job")
    async def job(ctx: leaseq.TaskContext, n: int) -> str:
        await asyncio.sleep(0.002 * (n % 3))
        return "bad\x00" if n == 0 else "ok"  # PostgreSQL cannot store U+0000

    runtime = WorkerRuntime(app, rq, concurrency=3)
    asyncio.run(runtime.run(until_idle=True))
    bad = svc.q.get(ids[0])
    assert bad.status == "dead" and "unusable result" in (bad.last_error or ""), bad
    assert {svc.q.get(i).status for i in ids[1:]} == {"completed"}
    assert runtime.completer is not None and runtime.completer.refills  # not given up for a bad result
    assert rq.calls["complete_and_claim"] >= 3, rq.calls
