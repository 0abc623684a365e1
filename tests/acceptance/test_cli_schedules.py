"""``leaseq schedules`` as an operator runs it: the real CLI in a subprocess."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

import leaseq
from leaseq.schedules import Schedule

from .cli_support import assert_one_error_line

APP = textwrap.dedent('''
    import leaseq

    app = leaseq.App()

    @app.task("report", queue="reports")
    def report(ctx, day=None):
        return day

    app.schedule("report", cron="0 0 1 1 *", payload={"day": "new year"}, name="yearly")
    app.schedule("report", every=3600, name="hourly", catch_up=0)
''')


@pytest.fixture
def app_dir(run_cli):
    (run_cli.cwd / "jobs.py").write_text(APP)
    return run_cli.cwd


def test_schedules_lists_next_slot_and_the_last_slots_task(dsn, run_cli, app_dir):
    with leaseq.connect(dsn) as q:
        q.migrate()
        now = q.now()
        yearly = Schedule.declare("report", cron="0 0 1 1 *", name="yearly")
        [slot] = yearly.slots_before(now, 1)
        # what a worker would have enqueued for the latest yearly slot
        task = q.enqueue("report", {"day": "new year"}, queue="reports", idempotency_key=yearly.key(slot))
    proc = run_cli("--dsn", dsn, "schedules", "jobs:app", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert list(rows) == ["yearly", "hourly"]
    y, h = rows["yearly"], rows["hourly"]
    assert (y["kind"], y["cron"], y["every"], y["queue"], y["payload"]) == \
        ("report", "0 0 1 1 *", None, "reports", {"day": "new year"})
    assert y["last_slot"].startswith(f"{slot.year}-01-01T00:00:00") and y["next_slot"].startswith(
        f"{slot.year + 1}-01-01T00:00:00")
    assert y["last_key"] == yearly.key(slot)
    assert y["last_task"] == {"id": task.id, "status": "queued"}
    assert (h["every"], h["catch_up"], h["last_task"]) == (3600.0, 0, None)
    assert h["next_slot"].endswith(":00:00+00:00")

    text = run_cli("--dsn", dsn, "schedules", "jobs:app")
    assert text.returncode == 0, text.stderr
    yearly_line = next(line for line in text.stdout.splitlines() if "yearly" in line)
    assert "0 0 1 1 *" in yearly_line and f" {task.id} " in yearly_line and "queued" in yearly_line
    hourly_line = next(line for line in text.stdout.splitlines() if "hourly" in line)
    assert "every 3600s" in hourly_line and "not enqueued" in hourly_line
    with leaseq.connect(dsn) as q:
        assert len(q.list_tasks()) == 1, "listing enqueues nothing"


def test_schedules_refuses_a_bad_app_with_one_line(run_cli, app_dir, tmp_path):
    db = f"sqlite:///{tmp_path / 'q.db'}"
    with leaseq.connect(db) as q:
        q.migrate()
    assert "module:attribute" in assert_one_error_line(run_cli("--dsn", db, "schedules", "jobs"), "app")
    (app_dir / "broken.py").write_text(APP + "\napp.schedule('report', every=-1, name='bad')\n")
    line = assert_one_error_line(run_cli("--dsn", db, "schedules", "broken:app"), "every")
    assert "seconds from" in line


def test_worker_until_idle_runs_the_due_slot_then_schedules_shows_it(dsn, run_cli, app_dir):
    with leaseq.connect(dsn) as q:
        q.migrate()
    # The hourly schedule's slots fall on the hour: a run that crossed one would rightly
    # enqueue that slot. Start clear of the next hour (a minute at most to wait).
    to_the_hour = 3600 - time.time() % 3600
    if to_the_hour < 60:
        time.sleep(to_the_hour + 1)
    proc = run_cli("--dsn", dsn, "worker", "jobs:app", "--until-idle")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(run_cli("--dsn", dsn, "schedules", "jobs:app", "--json").stdout)}
    # yearly (catch_up=1): its latest slot was enqueued and run; hourly (catch_up=0): nothing back-filled
    assert rows["yearly"]["last_task"]["status"] == "completed"
    assert rows["hourly"]["last_task"] is None
    with leaseq.connect(dsn) as q:
        [task] = q.list_tasks()
        assert (task.idempotency_key, task.queue, task.result) == (rows["yearly"]["last_key"], "reports", "new year")
    # a second run finds the slot's task by its key: still one task
    assert run_cli("--dsn", dsn, "worker", "jobs:app", "--until-idle").returncode == 0
    with leaseq.connect(dsn) as q:
        assert len(q.list_tasks()) == 1
