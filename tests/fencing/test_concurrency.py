"""The fence and the idempotency records under real concurrency: several OS processes.

Each test starts processes that open their own FencedStore on the same
database, release them together from a barrier, and then checks the
database and an append-only call log that every write appends to before it
touches the database (so a write that ran and was rolled back still shows).
"""

from __future__ import annotations

import multiprocessing
import queue
from collections import Counter

import pytest

from leaseq.fencing import FencedStore

from . import fence_workers

PROCESSES = 4
SPAWN = multiprocessing.get_context("spawn")  # no inherited pools or threads


@pytest.fixture
def fenced(fence_dsn):
    with FencedStore(fence_dsn) as store:
        store.migrate()
        serial = "BIGSERIAL" if store.dialect == "postgres" else "INTEGER"
        with store.transaction() as conn:
            conn.execute(f"CREATE TABLE fence_log (id {serial} PRIMARY KEY, token BIGINT, note TEXT NOT NULL)")
        yield store


def run_processes(target, arg_sets) -> list[dict]:
    barrier = SPAWN.Barrier(len(arg_sets))
    results = SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(*args, barrier, results)) for args in arg_sets]
    for proc in procs:
        proc.start()
    collected = []
    try:
        for _ in procs:
            collected.append(results.get(timeout=60))
    except queue.Empty:
        pytest.fail("a child process did not report within 60 s")
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    errors = [r["error"] for r in collected if "error" in r]
    assert not errors, errors
    return collected


def log_rows(store: FencedStore) -> list[tuple]:
    with store.transaction() as conn:
        return [tuple(r) for r in conn.execute("SELECT id, token, note FROM fence_log ORDER BY id").fetchall()]


def test_mixed_tokens_from_many_processes_never_accept_an_older_token(fenced, fence_dsn, tmp_path):
    """Two tasks, two processes each, race on one resource: each task's generations are
    accepted in order, and neither task's generations ever refuse the other's writes."""
    calls = tmp_path / "calls.log"
    rounds = 40
    tasks = [1 + seed % 2 for seed in range(PROCESSES)]
    results = run_processes(fence_workers.mixed_tokens,
                            [(fence_dsn, seed, rounds, str(calls), tasks[seed]) for seed in range(PROCESSES)])
    rows = log_rows(fenced)
    assert len(calls.read_text().splitlines()) == len(rows)  # stale writes never ran at all
    for task in (1, 2):
        mine = [r for r in results if r["task"] == task]
        accepted = [t for r in mine for t in r["accepted"]]
        stale = [t for r in mine for t in r["stale"]]
        assert len(accepted) + len(stale) == 2 * rounds
        assert accepted and stale, "the run should exercise both outcomes"
        # The fence row lock serialises a task's writers, so its log ids follow
        # acceptance order: no accepted generation is lower than one before it.
        tokens = [row[1] for row in rows if row[2] == str(task)]
        assert sorted(accepted) == sorted(tokens)
        assert all(a <= b for a, b in zip(tokens, tokens[1:])), tokens
        assert fenced.newest_generation("shared", task) == max(accepted) == max(accepted + stale)
    # Whatever order the scheduler gave the processes, a task-2 write with its next
    # generation (far below task 1's) is accepted after task 1's have been: fences are per task.
    next_of_2 = fenced.newest_generation("shared", 2) + 1
    assert next_of_2 < min(t for r in results if r["task"] == 1 for t in r["accepted"])
    fenced.apply("shared", f"2.{next_of_2}", lambda conn: fence_workers._insert(fenced, conn, next_of_2, "2"))
    assert log_rows(fenced)[-1][1:] == (next_of_2, "2")


def test_one_idempotency_key_is_acted_on_once_across_processes(fenced, fence_dsn, tmp_path):
    calls = tmp_path / "calls.log"
    keys = [f"k{i}" for i in range(20)]
    results = run_processes(fence_workers.same_keys,
                            [(fence_dsn, seed, keys, None, str(calls)) for seed in range(PROCESSES)])
    # Every process got an outcome for every key, and all agree on who acted.
    for key in keys:
        seen = {r["outcomes"][key]["pid"] for r in results}
        assert len(seen) == 1, (key, seen)
        assert fenced.outcome(key).value == results[0]["outcomes"][key]   # unfenced: kept as given
    assert Counter(line.split()[1] for line in calls.read_text().splitlines()) == Counter(keys)
    assert Counter(row[2] for row in log_rows(fenced)) == Counter(keys)


def test_a_key_raced_across_resources_runs_once_and_the_rest_are_refused(fenced, fence_dsn, tmp_path):
    calls = tmp_path / "calls.log"
    keys = [f"k{i}" for i in range(15)]
    results = run_processes(fence_workers.same_keys,
                            [(fence_dsn, seed, keys, f"proc-{seed}", str(calls)) for seed in range(PROCESSES)])
    for key in keys:
        winners = [r for r in results if key in r["outcomes"]]
        assert len(winners) == 1, key
        assert sum(key in r["refused"] for r in results) == PROCESSES - 1
    assert Counter(line.split()[1] for line in calls.read_text().splitlines()) == Counter(keys)
