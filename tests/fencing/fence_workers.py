"""Code run in child processes by test_concurrency.py (spawned, so kept import-light)."""

from __future__ import annotations

import os
import random
import time

from leaseq.fencing import FencedStore, IdempotencyKeyReused, StaleToken


def _log_line(path: str, line: str) -> None:
    # O_APPEND writes of one short line are atomic across processes.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _insert(store: FencedStore, conn, token, note: str) -> None:
    p = "%s" if store.dialect == "postgres" else "?"
    conn.execute(f"INSERT INTO fence_log (token, note) VALUES ({p}, {p})", (token, note))


def mixed_tokens(dsn: str, seed: int, rounds: int, calls_path: str, task: int, barrier, results) -> None:
    """Apply ``rounds`` writes of task ``task`` to one resource with generations that rise with noise."""
    rng = random.Random(seed)
    store = FencedStore(dsn)
    accepted, stale = [], []
    barrier.wait()
    try:
        for i in range(rounds):
            # Task 1's generations run far above task 2's: compared across tasks, task 2 would be refused.
            token = max(0, i + rng.randint(-6, 6)) + (1000 if task == 1 else 0)

            def write(conn, token=token):
                _log_line(calls_path, f"{os.getpid()} {task} {token}")
                _insert(store, conn, token, str(task))
                time.sleep(rng.random() / 1000)  # widen the window a racing check would slip into

            try:
                store.apply("shared", f"{task}.{token}", write)
                accepted.append(token)
            except StaleToken as exc:
                newest_task, newest = map(int, exc.newest_token.split("."))
                assert newest_task == task and newest > token  # only the task's own attempts count
                stale.append(token)
        results.put({"accepted": accepted, "stale": stale, "task": task})
    except BaseException as exc:  # report instead of hanging the parent
        results.put({"error": repr(exc)})
    finally:
        store.close()


def same_keys(dsn: str, seed: int, keys: list[str], resource: str | None, calls_path: str,
              barrier, results) -> None:
    """Apply every key once, in a shuffled order; ``resource`` None means one resource per key."""
    rng = random.Random(seed)
    store = FencedStore(dsn)
    keys = list(keys)
    rng.shuffle(keys)
    outcomes, refused = {}, []
    barrier.wait()
    try:
        for key in keys:
            def write(conn, key=key):
                _log_line(calls_path, f"{os.getpid()} {key}")
                _insert(store, conn, None, key)
                time.sleep(rng.random() / 1000)
                return {"pid": os.getpid(), "key": key}

            target = resource if resource is not None else f"res-{key}"
            try:
                outcomes[key] = store.apply(target, None if resource is None else "1.1", write,
                                            idempotency_key=key)
            except IdempotencyKeyReused:
                refused.append(key)
        results.put({"outcomes": outcomes, "refused": refused})
    except BaseException as exc:
        results.put({"error": repr(exc)})
    finally:
        store.close()
