"""Debounce (``enqueue(..., debounce=seconds, key=..., debounce_mode=..., max_delay=...)``):
enqueues of one key inside the window collapse into one task, decided under the
key's lock in the database. Both backends; the burst really races."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

import leaseq
from leaseq import InvalidInput

from .support import seconds_between, wait_until

BURST = 1000
THREADS = 8


def test_trailing_keeps_the_last_payload_and_moves_the_run_to_the_end_of_the_window(q: leaseq.Queue) -> None:
    first = q.enqueue("reindex", {"n": 1}, debounce=30, key="repo-1")
    assert (first.enqueue_outcome, first.debounce_key, first.status) == ("created", "repo-1", "queued")
    assert 29 <= seconds_between(first.available_at, first.created_at) <= 31
    time.sleep(0.2)
    second = q.enqueue("reindex", {"n": 2}, debounce=30, key="repo-1")
    assert (second.id, second.enqueue_outcome, second.payload) == (first.id, "collapsed", {"n": 2})
    assert second.available_at > first.available_at  # the window restarts at the last enqueue
    other = q.enqueue("reindex", {"n": 9}, debounce=30, key="repo-2")  # another key: its own task
    assert other.id != first.id and other.enqueue_outcome == "created"
    w = q.register_worker("w")
    assert q.claim(w) == []  # nothing runs before its window ends
    stored = q.get(first.id)
    assert stored.payload == {"n": 2} and stored.available_at == second.available_at
    events = q.events(first.id)
    assert [e.type for e in events] == ["enqueued", "debounced"]
    assert events[1].detail["debounce_key"] == "repo-1" and events[1].detail["mode"] == "trailing"


def test_trailing_never_runs_later_than_max_delay_after_the_first(q: leaseq.Queue) -> None:
    first = q.enqueue("reindex", {"n": 1}, debounce=60, key="busy", max_delay=1.0)
    assert 0.9 <= seconds_between(first.available_at, first.created_at) <= 1.1
    for n in range(2, 5):
        t = q.enqueue("reindex", {"n": n}, debounce=60, key="busy", max_delay=1.0)
        assert t.id == first.id and t.enqueue_outcome == "collapsed"
        assert abs(seconds_between(t.available_at, first.created_at) - 1.0) < 0.01
    wait_until(q, q.get(first.id).available_at)
    w = q.register_worker("w")
    [c] = q.claim(w)
    assert c.task_id == first.id and c.task.payload == {"n": 4}
    # once started, the next enqueue of the key opens a new window: a new task
    nxt = q.enqueue("reindex", {"n": 5}, debounce=60, key="busy", max_delay=1.0)
    assert nxt.enqueue_outcome == "created" and nxt.id != first.id
    q.complete(w, c)


def test_leading_runs_the_first_at_once_and_drops_the_rest_of_the_window(q: leaseq.Queue) -> None:
    first = q.enqueue("notify", {"n": 1}, debounce=0.5, key="user-3", debounce_mode="leading")
    assert first.enqueue_outcome == "created"
    dropped = q.enqueue("notify", {"n": 2}, debounce=0.5, key="user-3", debounce_mode="leading")
    assert (dropped.id, dropped.enqueue_outcome, dropped.payload) == (first.id, "collapsed", {"n": 1})
    w = q.register_worker("w")
    [c] = q.claim(w)  # at once
    assert c.task_id == first.id
    q.complete(w, c)
    assert q.enqueue("notify", {"n": 3}, debounce=0.5, key="user-3", debounce_mode="leading").id == first.id
    time.sleep(0.6)
    later = q.enqueue("notify", {"n": 4}, debounce=0.5, key="user-3", debounce_mode="leading")
    assert later.enqueue_outcome == "created" and later.id != first.id
    assert [e.type for e in q.events(first.id)].count("debounced") == 2


def test_bad_parameters_name_their_field(q: leaseq.Queue) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        (dict(debounce=5), "key"),
        (dict(key="k"), "key"),
        (dict(debounce=0, key="k"), "debounce"),
        (dict(debounce=-1, key="k"), "debounce"),
        (dict(debounce="5", key="k"), "debounce"),
        (dict(debounce=5, key=""), "key"),
        (dict(debounce=5, key="k", debounce_mode="middle"), "debounce_mode"),
        (dict(debounce_mode="leading"), "debounce_mode"),
        (dict(max_delay=5), "max_delay"),
        (dict(debounce=5, key="k", debounce_mode="leading", max_delay=9), "max_delay"),
        (dict(debounce=5, key="k", max_delay=0), "max_delay"),
        (dict(debounce=5, key="k", delay=3), "delay"),
        (dict(debounce=5, key="k", idempotency_key="i"), "idempotency_key"),
        (dict(debounce=5, key="k", after=[1]), "after"),
    ]
    for options, field in cases:
        with pytest.raises(InvalidInput) as err:
            q.enqueue("reindex", **options)
        assert err.value.field == field, options
    assert q.list_tasks() == []


@pytest.mark.parametrize("mode", ["trailing", "leading"])
def test_a_burst_of_enqueues_from_threads_makes_one_task_per_window(dsn: str, q: leaseq.Queue, mode: str) -> None:
    """BURST enqueues of one key from THREADS threads, each with its own connection: one task."""
    barrier = threading.Barrier(THREADS)
    answers: list[tuple[int, str]] = []
    errors: list[BaseException] = []

    def producer(n: int) -> None:
        try:
            with leaseq.connect(dsn) as mine:
                barrier.wait()
                for i in range(BURST // THREADS):
                    t = mine.enqueue("reindex", {"thread": n, "i": i}, debounce=600, key="hot",
                                     debounce_mode=mode)
                    answers.append((t.id, t.enqueue_outcome or ""))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(answers) == BURST
    assert len({task_id for task_id, _ in answers}) == 1
    assert Counter(outcome for _, outcome in answers) == {"created": 1, "collapsed": BURST - 1}
    [task] = q.list_tasks(limit=10)
    events = q.events(task.id)
    assert [e.type for e in events].count("debounced") == BURST - 1
    if mode == "trailing":  # the last payload wins: the last enqueue committed was some thread's last
        assert task.payload["i"] == BURST // THREADS - 1
    else:  # the first wins: some thread's first
        assert task.payload["i"] == 0


def test_windows_follow_each_other_while_a_worker_drains(dsn: str, q: leaseq.Queue) -> None:
    """Producers enqueue while a worker claims: each task is claimed once, and at no moment
    do two unstarted tasks of the key exist."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            with leaseq.connect(dsn) as mine:
                while not stop.is_set():
                    mine.enqueue("reindex", {"t": time.time()}, debounce=0.05, key="k", max_delay=0.1)
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=producer) for _ in range(4)]
    for t in threads:
        t.start()
    w = q.register_worker("w")
    claimed = 0
    deadline = time.monotonic() + 2.0
    try:
        while time.monotonic() < deadline:
            pending = [t for t in q.list_tasks(status="queued", limit=100) if t.debounce_key == "k"]
            assert len(pending) <= 1, pending
            for c in q.claim(w, limit=5):
                q.complete(w, c)
                claimed += 1
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert claimed >= 2  # windows ended (max_delay) and new ones began
