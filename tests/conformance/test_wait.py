"""Queue.wait / AsyncQueue.wait: return a task once it has ended or is parked,
else TimeoutError. On PostgreSQL the wait is woken by NOTIFY, not by polling."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import leaseq
from pg_modes import own_connection


def _finish_later(q: leaseq.Queue, ready: threading.Event, act) -> threading.Thread:
    """Run ``act()`` on a thread once ``ready`` is set."""
    def body() -> None:
        assert ready.wait(20)
        act()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def test_wait_returns_the_completed_task(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    t = q.enqueue("job")
    [c] = q.claim(w)
    ready = threading.Event()
    thread = _finish_later(q, ready, lambda: q.complete(w, c, result={"answer": 42}))
    ready.set()
    got = q.wait(t.id, timeout=20)
    thread.join(10)
    assert (got.id, got.status, got.result) == (t.id, "completed", {"answer": 42})


@pytest.mark.parametrize("outcome", ["blocked", "needs_reconciliation", "dead", "cancelled"])
def test_wait_returns_on_every_ended_or_parked_status(q: leaseq.Queue, outcome: str) -> None:
    w = q.register_worker("w")
    t = q.enqueue("job", effect="side_effect")
    [c] = q.claim(w)
    if outcome == "blocked":
        q.fail(w, c, "no credential", block=True)
    elif outcome == "needs_reconciliation":
        q.begin_effect(w, c, "charge")
        q.fail(w, c, "lost the answer")
    elif outcome == "dead":
        q.fail(w, c, "bad", retry=False)
    else:
        q.cancel(t.id, "stop")
    assert q.wait(t.id, timeout=5).status == outcome


def test_wait_times_out_on_a_task_still_queued_or_waiting(q: leaseq.Queue) -> None:
    t = q.enqueue("job")
    waiter = q.enqueue("later", after=[t.id])
    for task_id, status in ((t.id, "queued"), (waiter.id, "waiting")):
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=f"task {task_id} is still {status} after 0.3 s"):
            q.wait(task_id, timeout=0.3)
        assert time.monotonic() - started >= 0.3
    with pytest.raises(TimeoutError):
        q.wait(t.id, timeout=0)  # one look


def test_wait_refuses_bad_input(q: leaseq.Queue) -> None:
    with pytest.raises(leaseq.NotFound):
        q.wait(999_999, timeout=1)
    for bad in (-1, "5", float("nan"), True):
        with pytest.raises(leaseq.InvalidInput) as err:
            q.wait(1, timeout=bad)
        assert err.value.field == "timeout"
    with pytest.raises(leaseq.InvalidInput) as err:
        q.wait(0, timeout=1)
    assert err.value.field == "task_id"


def test_async_wait_returns_the_completed_task(dsn: str) -> None:
    async def main() -> None:
        aq = await leaseq.connect_async(dsn)
        try:
            await aq.migrate()
            w = await aq.register_worker("w")
            t = await aq.enqueue("job")
            [c] = await aq.claim(w)

            async def finish() -> None:
                await asyncio.sleep(0.2)
                await aq.complete(w, c, result="done")

            done, got = await asyncio.gather(finish(), aq.wait(t.id, timeout=20))
            assert (got.status, got.result) == ("completed", "done")
            with pytest.raises(TimeoutError):
                await aq.wait((await aq.enqueue("idle")).id, timeout=0.2)
        finally:
            await aq.close()

    asyncio.run(main())


def _watched(dsn: str, task_id: int) -> bool:
    with own_connection(dsn) as conn:
        return conn.execute("SELECT watched FROM leaseq_tasks WHERE id = %s", (task_id,)).fetchone()[0]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_postgres_wait_is_woken_by_notify_not_by_polling(q: leaseq.Queue, dsn: str, driver: str) -> None:
    """The wait's timeout is 20 s and nothing polls on PostgreSQL: only the
    NOTIFY sent at the completion's commit can end it within a few seconds."""
    if q.dialect != "postgres":
        pytest.skip("SQLite has no notifications: its wait polls")
    if not q.capabilities.listen_notify:  # a polled wait ends within POLL_SECONDS: this could not fail
        pytest.skip("nothing notifies through this DSN (a pooler without listen_dsn, or the portable mode): "
                    "its wait polls")
    w = q.register_worker("w")
    t = q.enqueue("job")
    [c] = q.claim(w)
    returned: list[tuple[leaseq.Task, float]] = []

    def wait() -> None:
        if driver == "sync":
            task = q.wait(t.id, timeout=20)
        else:
            task = asyncio.run(leaseq.AsyncQueue(q).wait(t.id, timeout=20))
        returned.append((task, time.monotonic()))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not _watched(dsn, t.id):  # the wait is listening and has looked once
        assert time.monotonic() < deadline, "the wait never marked the task watched"
        time.sleep(0.02)
    time.sleep(0.3)  # well inside its sleep by now
    q.complete(w, c, result=1)
    committed = time.monotonic()
    thread.join(25)
    assert returned, "the wait did not return"
    task, at = returned[0]
    assert task.status == "completed"
    assert at - committed < 3.0, f"woken {at - committed:.2f} s after the commit: not by NOTIFY"
