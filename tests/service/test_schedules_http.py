"""Schedules over HTTP: workers reaching the service through RemoteQueue fire one task per slot."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from datetime import datetime

import leaseq

FIRED = re.compile(r"schedule tick: slot schedule:tick:(\S+) -> task (\d+)")


def test_two_http_workers_enqueue_one_task_per_slot(svc, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="leaseq.worker.schedules")
    app = leaseq.App(f"sqlite:///{tmp_path / 'never-used.db'}")

    @app.task("tick")
    def tick(ctx, n=0):
        return n

    app.schedule("tick", every=0.5, payload={"n": 1})
    runtimes = [app.worker(transport=svc.remote(svc.token("worker", name=f"w{i}", all_queues=True)),
                           poll_interval=0.05, name=f"http-{i}") for i in range(2)]
    threads = [threading.Thread(target=asyncio.run, args=(r.run(),), daemon=True) for r in runtimes]
    for t in threads:
        t.start()
    time.sleep(3.2)
    for r in runtimes:
        r.stop()
    for t in threads:
        t.join(15)
        assert not t.is_alive()
    assert app._queue is None, "the workers used the HTTP transport only"
    tasks = [t for t in svc.q.list_tasks(limit=1000) if t.kind == "tick"]
    slots = sorted(datetime.fromisoformat(t.idempotency_key.split(":", 2)[2]) for t in tasks)
    assert len(slots) >= 4 and len(set(slots)) == len(tasks)
    assert all((b - a).total_seconds() == 0.5 for a, b in zip(slots, slots[1:])), slots
    fired = [FIRED.search(r.getMessage()).groups() for r in caplog.records if FIRED.search(r.getMessage())]
    by_key = {t.idempotency_key.split(":", 2)[2]: t.id for t in tasks}
    assert all(by_key[slot] == int(tid) for slot, tid in fired)
    # both workers fired the slots: more enqueues than tasks, collapsed on the key
    assert len(fired) >= len(tasks) + 3, (len(fired), len(tasks))
