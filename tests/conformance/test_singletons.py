"""Singletons (``enqueue(..., singleton_key=..., on_conflict=...)``): at most one
unfinished task per key, decided under the key's lock in the database; the claim
never runs two tasks of one key. Both backends, with threads really racing."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

import leaseq
from leaseq import InvalidInput, LeaseLost

RACES = 5
THREADS = 8


def test_skip_returns_the_task_that_holds_the_key_and_writes_nothing(q: leaseq.Queue) -> None:
    first = q.enqueue("sync", {"n": 1}, singleton_key="customer-7")
    assert (first.enqueue_outcome, first.singleton_key) == ("created", "customer-7")
    again = q.enqueue("sync", {"n": 2}, singleton_key="customer-7")
    assert (again.id, again.enqueue_outcome, again.payload) == (first.id, "skipped", {"n": 1})
    other = q.enqueue("sync", singleton_key="customer-8")  # another key: its own task
    assert other.enqueue_outcome == "created" and other.id != first.id
    elsewhere = q.enqueue("sync", queue="other", singleton_key="customer-7")  # keys are per queue
    assert elsewhere.enqueue_outcome == "created"
    assert q.get(first.id).enqueue_outcome is None  # only an enqueue's answer says it
    events = q.events(first.id)
    assert [e.type for e in events] == ["enqueued", "singleton_skipped"]
    assert events[1].detail["singleton_key"] == "customer-7" and events[1].detail["on_conflict"] == "skip"
    w = q.register_worker("w")
    [c] = q.claim(w, kinds=["sync"])
    assert c.task_id == first.id
    assert q.enqueue("sync", singleton_key="customer-7").id == first.id  # running holds it too
    q.complete(w, c)
    after = q.enqueue("sync", singleton_key="customer-7")  # ended: the key is free again
    assert after.enqueue_outcome == "created" and after.id != first.id


def test_cancel_running_fences_the_old_generation_and_enqueues_the_new(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    old = q.enqueue("sync", {"v": 1}, singleton_key="repo")
    [c] = q.claim(w)
    assert c.task_id == old.id
    new = q.enqueue("sync", {"v": 2}, singleton_key="repo", on_conflict="cancel_running")
    assert new.enqueue_outcome == "created" and new.id != old.id and new.status == "queued"
    gone = q.get(old.id)
    assert (gone.status, gone.lease_owner) == ("cancelled", None)
    with pytest.raises(LeaseLost):  # the old holder's next guarded write is refused
        q.complete(w, c, result="late")
    with pytest.raises(LeaseLost):
        q.heartbeat(w, c)
    cancelled = [e for e in q.events(old.id) if e.type == "cancelled"]
    assert len(cancelled) == 1 and cancelled[0].generation == c.generation
    assert cancelled[0].detail["replaced_by"] == new.id and cancelled[0].detail["previous_status"] == "running"
    assert cancelled[0].detail["revoked_lease_of"] == w.id
    [c2] = q.claim(w)
    assert c2.task_id == new.id
    # a queued holder is cancelled the same way
    nxt = q.enqueue("sync", {"v": 3}, singleton_key="repo2")
    newer = q.enqueue("sync", {"v": 4}, singleton_key="repo2", on_conflict="cancel_running")
    assert q.get(nxt.id).status == "cancelled" and newer.status == "queued"


def test_queue_keeps_one_waiting_behind_the_running_one(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    a = q.enqueue("sync", {"v": "a"}, singleton_key="k", on_conflict="queue")
    assert q.enqueue("sync", {"v": "b"}, singleton_key="k", on_conflict="queue").id == a.id  # a not started
    [c] = q.claim(w)
    assert c.task_id == a.id
    b = q.enqueue("sync", {"v": "b"}, singleton_key="k", on_conflict="queue")
    assert b.enqueue_outcome == "created" and b.status == "queued"
    again = q.enqueue("sync", {"v": "c"}, singleton_key="k", on_conflict="queue")
    assert (again.id, again.enqueue_outcome) == (b.id, "skipped")  # one queued + one running at most
    assert q.claim(w) == []  # b waits behind the running a
    q.complete(w, c)
    [c2] = q.claim(w)
    assert c2.task_id == b.id


def test_a_retried_holder_keeps_its_turn(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    a = q.enqueue("sync", singleton_key="k", on_conflict="queue", max_attempts=3)
    [c] = q.claim(w)
    b = q.enqueue("sync", singleton_key="k", on_conflict="queue")
    q.fail(w, c, "boom", delay=0)  # a is queued again, older than b
    [c2] = q.claim(w, limit=10)
    assert c2.task_id == a.id  # never b beside it
    assert q.claim(w, limit=10) == []
    q.complete(w, c2)
    assert [x.task_id for x in q.claim(w, limit=10)] == [b.id]


def test_bad_parameters_name_their_field(q: leaseq.Queue) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        (dict(singleton_key="", ), "singleton_key"),
        (dict(singleton_key=5), "singleton_key"),
        (dict(singleton_key="k", on_conflict="replace"), "on_conflict"),
        (dict(on_conflict="queue"), "on_conflict"),
        (dict(singleton_key="k", approval="required"), "approval"),
        (dict(singleton_key="k", debounce=5, key="x"), "debounce"),
    ]
    for options, field in cases:
        with pytest.raises(InvalidInput) as err:
            q.enqueue("sync", **options)
        assert err.value.field == field, options
    assert q.list_tasks() == []


@pytest.mark.parametrize("on_conflict", ["skip", "queue", "cancel_running"])
def test_racing_enqueuers_leave_at_most_one_task_per_key(dsn: str, q: leaseq.Queue, on_conflict: str) -> None:
    """THREADS threads, each with its own connection, enqueue one key at once, RACES times."""
    w = q.register_worker("w")
    for race in range(RACES):
        key = f"race-{on_conflict}-{race}"
        if on_conflict == "queue":  # one running already: the racers may add one behind it
            q.enqueue("sync", singleton_key=key, on_conflict="queue")
            [held] = q.claim(w, kinds=["sync"])
        barrier = threading.Barrier(THREADS)
        outcomes: list[str] = []
        errors: list[BaseException] = []

        def racer(n: int) -> None:
            try:
                with leaseq.connect(dsn) as mine:
                    barrier.wait()
                    t = mine.enqueue("sync", {"n": n}, singleton_key=key, on_conflict=on_conflict)
                    outcomes.append(t.enqueue_outcome or "")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=racer, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        live = [t for t in q.list_tasks(limit=1000) if t.singleton_key == key
                and t.status in ("queued", "running")]
        counts = Counter(outcomes)
        if on_conflict == "skip":
            assert counts == {"created": 1, "skipped": THREADS - 1} and len(live) == 1
        elif on_conflict == "queue":
            assert counts == {"created": 1, "skipped": THREADS - 1}
            assert sorted(t.status for t in live) == ["queued", "running"]
            q.complete(w, held)
        else:  # each replaces the one before: THREADS made, all but the last cancelled
            assert counts == {"created": THREADS} and len(live) == 1
        for t in live:  # leave nothing claimable for the next round
            if t.status == "queued":
                q.cancel(t.id, "round over")


def test_racing_claimers_never_run_two_tasks_of_one_key(dsn: str, q: leaseq.Queue) -> None:
    """A retried holder and one queued behind it: claimers racing never hold both."""
    for race in range(RACES):
        key = f"claim-race-{race}"
        w0 = q.register_worker("setup")
        q.enqueue("sync", singleton_key=key, on_conflict="queue", max_attempts=3)
        [c] = q.claim(w0, kinds=["sync"])
        q.enqueue("sync", singleton_key=key, on_conflict="queue")
        q.fail(w0, c, "again", delay=0)  # two queued now, one older
        barrier = threading.Barrier(THREADS)
        got: list[int] = []

        def claimer() -> None:
            with leaseq.connect(dsn) as mine:
                w = mine.register_worker("racer")
                barrier.wait()
                got.extend(x.task_id for x in mine.claim(w, kinds=["sync"], limit=5))

        threads = [threading.Thread(target=claimer) for _ in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 1, got
        running = [t for t in q.list_tasks(limit=1000) if t.singleton_key == key and t.status == "running"]
        assert len(running) == 1
        for t in q.list_tasks(limit=1000):
            if t.singleton_key == key and t.status in ("queued", "running"):
                q.cancel(t.id, "round over")



def test_async_queue_takes_the_same_parameters(q: leaseq.Queue) -> None:
    import asyncio

    from leaseq.aio import AsyncQueue

    async def go() -> tuple[leaseq.Task, leaseq.Task, leaseq.Task]:
        aq = AsyncQueue(q)
        a = await aq.enqueue("sync", singleton_key="a1")
        b = await aq.enqueue("sync", singleton_key="a1")
        c = await aq.enqueue("reindex", debounce=60, key="r")
        return a, b, c

    a, b, c = asyncio.run(go())
    assert (b.id, b.enqueue_outcome) == (a.id, "skipped") and c.enqueue_outcome == "created"
