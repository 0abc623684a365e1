"""Schedule slots, keys, catch-up and declaration checks: pure computation, UTC (no DST)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import leaseq
from leaseq.schedules import Schedule

UTC = timezone.utc


def at(*parts: int, us: int = 0) -> datetime:
    return datetime(*parts, microsecond=us, tzinfo=UTC)


def test_every_slots_sit_on_a_grid_from_the_epoch():
    s = Schedule.declare("poll", every=30)
    now = at(2026, 3, 1, 12, 0, 47, us=500)
    assert s.slots_before(now, 3) == [at(2026, 3, 1, 11, 59, 30), at(2026, 3, 1, 12, 0, 0), at(2026, 3, 1, 12, 0, 30)]
    assert s.next_slot(now) == at(2026, 3, 1, 12, 1, 0)
    # a slot starting exactly now is due now, and the next one is one period later
    assert s.slots_before(at(2026, 3, 1, 12, 1), 1) == [at(2026, 3, 1, 12, 1)]
    assert s.next_slot(at(2026, 3, 1, 12, 1)) == at(2026, 3, 1, 12, 1, 30)
    # another timezone's view of the same instant gives the same slots and keys
    local = now.astimezone(timezone(timedelta(hours=5, minutes=30)))
    assert s.slots_before(local, 2) == s.slots_before(now, 2)
    assert s.key(at(2026, 3, 1, 12, 0, 30)) == "schedule:poll:2026-03-01T12:00:30+00:00"


def test_sub_second_every_keys_are_exact():
    s = Schedule.declare("fast", every=0.1)
    slots = s.slots_before(at(2026, 3, 1, 0, 0, 1, us=250_000), 4)
    assert slots == [at(2026, 3, 1, 0, 0, 0, us=900_000), at(2026, 3, 1, 0, 0, 1),
                     at(2026, 3, 1, 0, 0, 1, us=100_000), at(2026, 3, 1, 0, 0, 1, us=200_000)]
    assert len({s.key(x) for x in slots}) == 4


def test_cron_slots_and_next_slot():
    s = Schedule.declare("digest", cron="*/5 * * * *")
    now = at(2026, 3, 1, 12, 7, 13, us=1)
    assert s.slots_before(now, 2) == [at(2026, 3, 1, 12, 0), at(2026, 3, 1, 12, 5)]
    assert s.next_slot(now) == at(2026, 3, 1, 12, 10)
    assert s.slots_before(at(2026, 3, 1, 12, 10), 1) == [at(2026, 3, 1, 12, 10)]  # at the slot: due
    assert s.next_slot(at(2026, 3, 1, 12, 10)) == at(2026, 3, 1, 12, 15)
    daily = Schedule.declare("nightly", cron="30 2 * * *")
    assert daily.slots_before(at(2026, 3, 1, 1, 0), 2) == [at(2026, 2, 27, 2, 30), at(2026, 2, 28, 2, 30)]
    assert daily.next_slot(at(2026, 3, 1, 1, 0)) == at(2026, 3, 1, 2, 30)
    assert s.key(at(2026, 3, 1, 12, 5)) == "schedule:digest:2026-03-01T12:05:00+00:00"


def test_due_fires_new_slots_and_bounds_catch_up():
    s = Schedule.declare("poll", every=10)  # catch_up=1
    # first tick after downtime: only the most recent missed slot
    assert s.due(None, at(2026, 1, 1, 0, 1, 5)) == [at(2026, 1, 1, 0, 1, 0)]
    # a tick in the same slot fires nothing new; crossing a boundary fires the new slot
    assert s.due(at(2026, 1, 1, 0, 1, 5), at(2026, 1, 1, 0, 1, 9)) == []
    assert s.due(at(2026, 1, 1, 0, 1, 9), at(2026, 1, 1, 0, 1, 10)) == [at(2026, 1, 1, 0, 1, 10)]
    # a pause spanning many slots is not back-filled beyond catch_up
    assert s.due(at(2026, 1, 1, 0, 1, 9), at(2026, 1, 1, 0, 5, 1)) == [at(2026, 1, 1, 0, 5, 0)]
    three = Schedule.declare("poll", every=10, catch_up=3)
    assert three.due(None, at(2026, 1, 1, 0, 1, 5)) == [at(2026, 1, 1, 0, 0, 40), at(2026, 1, 1, 0, 0, 50),
                                                        at(2026, 1, 1, 0, 1, 0)]
    assert three.due(at(2026, 1, 1, 0, 0, 55), at(2026, 1, 1, 0, 1, 5)) == [at(2026, 1, 1, 0, 1, 0)]
    none = Schedule.declare("poll", every=10, catch_up=0)
    assert none.due(None, at(2026, 1, 1, 0, 1, 5)) == []  # start with the next slot
    assert none.due(at(2026, 1, 1, 0, 1, 5), at(2026, 1, 1, 0, 1, 10)) == [at(2026, 1, 1, 0, 1, 10)]


@pytest.mark.parametrize("kwargs, field", [
    (dict(kind="", every=5), "kind"),
    (dict(kind=7, every=5), "kind"),
    (dict(kind="k"), "cron"),
    (dict(kind="k", cron="* * * * *", every=5), "every"),
    (dict(kind="k", cron="not a cron"), "cron"),
    (dict(kind="k", cron="61 * * * *"), "cron"),
    (dict(kind="k", cron=""), "cron"),
    (dict(kind="k", every=0), "every"),
    (dict(kind="k", every=-1), "every"),
    (dict(kind="k", every="5"), "every"),
    (dict(kind="k", every=True), "every"),
    (dict(kind="k", every=float("inf")), "every"),
    (dict(kind="k", every=1e12), "every"),
    (dict(kind="k", cron="0 0 30 2 *"), "cron"),
    (dict(kind="k", every=5, payload={"x": object()}), "payload"),
    (dict(kind="k", every=5, catch_up=-1), "catch_up"),
    (dict(kind="k", every=5, catch_up=1.5), "catch_up"),
    (dict(kind="k", every=5, name=""), "name"),
    (dict(kind="k", every=5, queue=""), "queue"),
])
def test_bad_declarations_name_the_field(kwargs, field):
    app = leaseq.App("sqlite:///unused-never-connected.db")
    kind = kwargs.pop("kind")
    with pytest.raises(leaseq.InvalidInput) as err:
        app.schedule(kind, **kwargs)
    assert err.value.field == field, err.value
    assert app.schedules == []  # nothing declared
    assert app._queue is None  # declaring never connects


def test_schedule_names_are_unique_and_take_the_task_options():
    app = leaseq.App("sqlite:///unused-never-connected.db")

    @app.task("report", effect="idempotent", queue="reports", max_attempts=2)
    def report(ctx, day=None):
        return day

    s = app.schedule("report", cron="0 6 * * *", payload={"day": "today"})
    assert (s.name, s.options["queue"], s.options["effect"], s.options["max_attempts"]) == \
        ("report", "reports", "idempotent", 2)
    with pytest.raises(leaseq.InvalidInput) as err:
        app.schedule("report", every=60)
    assert err.value.field == "name"
    other = app.schedule("report", every=60, name="report-hourly", queue="other")
    assert other.options["queue"] == "other"
    assert [x.name for x in app.schedules] == ["report", "report-hourly"]
