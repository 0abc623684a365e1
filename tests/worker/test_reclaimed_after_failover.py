"""A worker handed back a task it still runs, under the same generation of a new lease epoch.

After an asynchronous failover lost a claim, the promoted database can hand
the task out again under the same generation, to the very worker still
running the old attempt. The worker tells the two attempts apart by their
lease epoch: the old one is lost, the new one is held and renewed as any
other. (Before, both were (task, generation) to the worker: the old
attempt's end dropped the new one from the leases it renews.)

The failover is simulated on SQLite, whose claims keep the task row's
epoch: the row is put back to "queued at generation 0" with another epoch,
as the promoted standby has it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import leaseq

from .conftest import RunningWorker, wait_for


def test_the_same_generation_of_a_new_epoch_is_another_attempt(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    app = leaseq.App(f"sqlite:///{path}")
    old_may_return = threading.Event()
    started: list[tuple[int, int]] = []

    @app.task("job", lease_seconds=0.5, max_attempts=3)
    def job(ctx: leaseq.TaskContext) -> str:
        started.append((ctx.claim.epoch, ctx.generation))
        if ctx.claim.epoch == 0:
            old_may_return.wait(10)
            return "old"
        time.sleep(1.5)  # three lease lengths: only renewals keep it
        return "new"

    task = job.enqueue()
    running = RunningWorker(app.worker(concurrency=2, poll_interval=0.05))
    try:
        wait_for(lambda: started == [(0, 1)])
        with sqlite3.connect(path) as db:  # the promoted standby never saw the claim
            db.execute("UPDATE leaseq_tasks SET status = 'queued', claim_generation = 0, claim_epoch = 5, "
                       "lease_owner = NULL, lease_expires_at = NULL, attempts = 0 WHERE id = ?", (task.id,))
        wait_for(lambda: started == [(0, 1), (5, 1)])
        old_may_return.set()          # the old attempt ends while the new one runs
        wait_for(lambda: app.queue.get(task.id).status == "completed", timeout=10)
        done = app.queue.get(task.id)
        assert (done.result, done.claim_generation) == ("new", 1)
        # the worker counts a completion once its write has answered: a moment after the row shows it
        wait_for(lambda: running.runtime.stats.completed == 1, timeout=10)
        assert running.runtime.stats.lost == 1
    finally:
        old_may_return.set()
        running.stop()
        app.queue.close()
