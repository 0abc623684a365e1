"""Closing a queue (or a fenced store) while other threads still use it.

``sqlite3`` closes a connection that another thread is stepping a statement
on without any guard, and the process dies with a segmentation fault. An
application that shuts down (``close()`` from its main thread while a
worker thread or a request still runs a statement) met exactly that. The
race runs in a child process, so a crash fails the test with the signal
instead of killing the test runner's worker; it runs on PostgreSQL too,
where a closed pool must refuse the same way.

After ``close()``, every call is refused with BackendUnavailable naming the
database, on both backends, and writes nothing.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import leaseq
from leaseq.fencing import FencedStore

#: Rounds of the race per run: before the guard, the first few rounds crashed every time.
ROUNDS = 25

RACE = textwrap.dedent('''
    import os, sys, threading, time
    import leaseq
    from leaseq.fencing import FencedStore

    where, rounds = sys.argv[1], int(sys.argv[2])
    refusals, unexpected = [], []

    def hammer(call):
        # until refused: after close() every call is, so every thread ends
        while True:
            try:
                call()
            except leaseq.BackendUnavailable as exc:
                (refusals if "closed" in str(exc) else unexpected).append(repr(exc))
                return
            except Exception as exc:
                unexpected.append(repr(exc))
                return

    for n in range(rounds):
        # SQLite: two files a round; PostgreSQL: the test's schema, connected afresh each round
        sqlite = not where.startswith("postgresql")
        q = leaseq.connect(f"sqlite:///{where}/queue{n}.db" if sqlite else where)
        q.migrate()
        worker = q.register_worker("racer")
        fence = FencedStore(f"sqlite:///{where}/fence{n}.db" if sqlite else where)
        fence.migrate()

        def queue_work():
            q.enqueue("job", {"n": 1})
            for claim in q.claim(worker, limit=5):
                q.complete(worker, claim, {"ok": True})

        def fence_work():
            fence.apply("resource", "7.1", lambda conn: None)
            fence.newest_generation("resource", 7)

        threads = [threading.Thread(target=hammer, args=(work,))
                   for work in (queue_work, queue_work, queue_work, fence_work, fence_work)]
        for t in threads:
            t.start()
        time.sleep(0.01 + 0.002 * (n % 10))  # close at a different point of the work each round
        q.close()
        fence.close()
        for t in threads:
            t.join(30)
            if t.is_alive():
                unexpected.append("a thread was still running 30 s after close()")
    print(f"refusals={len(refusals)} unexpected={unexpected[:3]!r}")
    sys.exit(1 if unexpected else 0)
''')


def test_closing_while_other_threads_run_statements_never_crashes(dsn, tmp_path):
    where = str(tmp_path) if dsn.startswith("sqlite") else dsn
    proc = subprocess.run([sys.executable, "-c", RACE, where, str(ROUNDS)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (
        f"exit {proc.returncode} (a negative code is the signal that killed it)\n"
        f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    # every thread met the close: each was refused with the clean error, none crashed
    assert f"refusals={5 * ROUNDS} " in proc.stdout, proc.stdout


def test_a_closed_queue_refuses_every_call_and_writes_nothing(dsn):
    q = leaseq.connect(dsn)
    q.migrate()
    worker = q.register_worker("w")
    q.enqueue("job", {"n": 1})
    q.close()
    for call in (lambda: q.enqueue("job", {"n": 2}), lambda: q.claim(worker), lambda: q.list_tasks()):
        with pytest.raises(leaseq.BackendUnavailable, match="closed"):
            call()
    with leaseq.connect(dsn) as again:
        assert [t.payload for t in again.list_tasks()] == [{"n": 1}]


def test_a_closed_fenced_store_refuses_reads_and_writes(dsn):
    fence = FencedStore(dsn)
    fence.migrate()
    fence.close()
    for call in (lambda: fence.apply("resource", "7.1", lambda conn: None),
                 lambda: fence.newest_generation("resource", 7)):
        with pytest.raises(leaseq.BackendUnavailable, match="closed"):
            call()
