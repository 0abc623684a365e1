"""Schedules under real workers: one task per slot across processes, bounded back-fill."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from datetime import datetime

import pytest

import leaseq
from leaseq.schedules import Schedule, run_schedules

from .conftest import wait_for

KEY = re.compile(r"^schedule:tick:(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\+00:00)$")
FIRED = re.compile(r"schedule tick: slot (\S+) -> task (\d+)")
SLOT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\+00:00")

APP = textwrap.dedent('''
    import leaseq

    app = leaseq.App()

    @app.task("tick")
    def tick(ctx, n=0):
        return n

    app.schedule("tick", every=1, payload={"n": 1})
''')


def _tasks(dsn: str) -> list[leaseq.Task]:
    with leaseq.connect(dsn) as q:
        return [t for t in q.list_tasks(limit=10_000) if t.kind == "tick"]


def _fired(path) -> dict[datetime, tuple[str, int]]:
    """What one worker's log says it fired: slot -> (key, task id)."""
    return {datetime.fromisoformat(SLOT.search(key).group(0)): (key, int(tid))
            for key, tid in FIRED.findall(path.read_text())}


@pytest.mark.timeout(120)
def test_three_worker_processes_enqueue_one_task_per_slot(dsn, tmp_path):
    (tmp_path / "sched_app.py").write_text(APP)
    with leaseq.connect(dsn) as q:
        q.migrate()
    logs = [tmp_path / f"worker-{i}.log" for i in range(3)]
    procs = []
    try:
        for log in logs:
            with open(log, "w") as fh:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "leaseq.cli.main", "--dsn", dsn, "worker", "sched_app:app",
                     "--log-level", "info", "--concurrency", "2"], cwd=tmp_path, stdout=fh, stderr=fh))
        samples = []

        def five_slots_fired_by_all() -> bool:
            # sample the database while they run: never more tasks than distinct slot keys
            tasks = _tasks(dsn)
            samples.append((len(tasks), len({t.idempotency_key for t in tasks})))
            assert all(p.poll() is None for p in procs), [log.read_text() for log in logs]
            common = set.intersection(*(set(_fired(log)) for log in logs))
            return len(common) >= 5

        wait_for(five_slots_fired_by_all, timeout=60, interval=0.2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)
    tasks = _tasks(dsn)
    by_slot = defaultdict(list)
    for t in tasks:
        match = KEY.match(t.idempotency_key)
        assert match, f"not a per-slot key: {t.idempotency_key!r}"
        by_slot[datetime.fromisoformat(match.group(1))].append(t.id)
    assert all(len(ids) == 1 for ids in by_slot.values()), by_slot
    assert len(tasks) == len(by_slot)
    # every worker that fired a slot got the one task of that slot
    key_to_id = {t.idempotency_key: t.id for t in tasks}
    fired = [_fired(log) for log in logs]
    for per_worker in fired:
        for key, tid in per_worker.values():
            assert key_to_id[key] == tid, (key, tid)
    slots = sorted(set.intersection(*(set(f) for f in fired)))
    assert len(slots) >= 5
    # slots fired by all three: consecutive seconds, one task each, the same in every worker
    assert all((b - a).total_seconds() == 1 for a, b in zip(slots, slots[1:])), slots
    for slot in slots:
        assert len({f[slot] for f in fired}) == 1 and by_slot[slot] == [fired[0][slot][1]]
    # and no slot was skipped from the first task to the last
    all_slots = sorted(by_slot)
    assert all((b - a).total_seconds() == 1 for a, b in zip(all_slots, all_slots[1:])), all_slots
    assert all(n == distinct for n, distinct in samples), samples
    # the tasks ran (the workers claimed what the schedule enqueued)
    assert sum(t.status == "completed" for t in tasks) >= len(slots) - 1


def _run(schedule: Schedule, q: leaseq.Queue, seconds: float) -> tuple[list[datetime], list[datetime]]:
    """Run one scheduler against ``q`` for ``seconds``; returns (clock reads, slots fired)."""
    reads: list[datetime] = []
    fired: list[datetime] = []

    port = leaseq.AsyncQueue(q)

    async def clock() -> datetime:
        now = await port.now()
        reads.append(now)
        return now

    async def main() -> None:
        task = asyncio.create_task(run_schedules([schedule], port, clock=clock,
                                                 on_fire=lambda s, slot, t: fired.append(slot)))
        await asyncio.sleep(seconds)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await port.close_async()

    asyncio.run(main())
    return reads, fired


def _stored_slots(q: leaseq.Queue, schedule: Schedule) -> set[datetime]:
    # the database's view: a cancelled scheduler may have written a slot it did not report
    keys = [t.idempotency_key for t in q.list_tasks(limit=10_000)]
    slots = {datetime.fromisoformat(k.split(":", 2)[2]) for k in keys}  # schedule:tick:<slot>
    assert sorted(keys) == sorted(schedule.key(s) for s in slots)
    return slots


@pytest.mark.parametrize("catch_up", [0, 2])
def test_back_fill_after_a_pause_is_bounded_by_catch_up(q, catch_up):
    schedule = Schedule.declare("tick", every=0.2, catch_up=catch_up)
    _run(schedule, q, 1.0)
    first = _stored_slots(q, schedule)
    assert len(first) >= 3
    time.sleep(1.6)  # nothing runs: about eight slots go by
    reads, _ = _run(schedule, q, 0.7)
    second = sorted(_stored_slots(q, schedule) - first)
    restart = reads[0]
    missed = [s for s in schedule.slots_before(restart, 100) if s > max(first)]
    assert len(missed) >= 6, "the pause spans many slots"
    # after the pause: only the catch_up most recent missed slots, then the new ones
    expected = missed[len(missed) - catch_up:] if catch_up else []
    assert [s for s in second if s <= restart] == expected
    assert [s for s in second if s > restart], "new slots fire after the restart"


def test_a_repeated_slot_returns_the_same_task(q):
    """Two schedulers firing the same slots (two workers) leave one task per slot."""
    schedule = Schedule.declare("tick", every=0.25, catch_up=3)

    port = leaseq.AsyncQueue(q)
    fired: dict[str, set[int]] = defaultdict(set)

    async def main() -> None:
        runs = [asyncio.create_task(run_schedules([schedule], port, on_fire=lambda s, slot, t: fired[
            s.key(slot)].add(t.id))) for _ in range(2)]
        # at least five slots, however slowly a loaded machine lets them fire (about 1.2 s idle)
        deadline = time.monotonic() + 15
        while len(fired) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # the other scheduler's fire of the last slot, if it is behind
        for r in runs:
            r.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        await port.close_async()

    asyncio.run(main())
    assert len(fired) >= 5 and all(len(ids) == 1 for ids in fired.values()), fired
    assert len(q.list_tasks(limit=1000)) == len(fired)


def test_a_slot_fired_with_other_options_is_passed_over(q, caplog):
    """A worker whose declaration of a schedule differs (a deploy changed its payload) meets the
    slot's key taken by another task: it logs that and goes on, without stalling its other schedules."""
    from leaseq.schedules import Scheduler

    now = q.now()
    old = Schedule.declare("tick", every=3600, payload={"n": 1})
    new = Schedule.declare("tick", every=3600, payload={"n": 2})
    other = Schedule.declare("tock", every=3600)

    async def clock() -> datetime:
        return now

    async def tick(scheduler: Scheduler) -> None:
        await scheduler.tick()
        await scheduler.transport.close_async()

    fired: list[tuple[str, int]] = []
    asyncio.run(tick(Scheduler([old], leaseq.AsyncQueue(q), clock=clock)))
    [first] = q.list_tasks()
    scheduler = Scheduler([new, other], leaseq.AsyncQueue(q), clock=clock,
                          on_fire=lambda s, slot, t: fired.append((s.name, t.id)))
    with caplog.at_level("WARNING", logger="leaseq.worker.schedules"):
        asyncio.run(tick(scheduler))
    assert [name for name, _ in fired] == ["tock"]
    assert scheduler.previous == {"tick": now, "tock": now}
    assert f"as task {first.id} with another payload" in caplog.text
    assert {t.kind: t.payload for t in q.list_tasks()} == {"tick": {"n": 1}, "tock": None}
