"""Retry on request, attempt timeouts and start deadlines, on both backends.

``Queue.retry`` (what a handler's ``leaseq.Retry`` sends) ends an attempt
without counting it as a failure and makes the task claimable ``after``
seconds later by the database's clock; it is guarded by the lease (the guard
matrices in test_guards.py and test_transports.py try it after every way of
losing one). A deadline keeps a task from starting once it has passed, and
the sweep ends such a task ``expired``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import leaseq

from .support import seconds_between, snapshot, wait_until


def _claim_one(q: leaseq.Queue, w: leaseq.Worker, **options) -> leaseq.Claim:
    [claim] = q.claim(w, **options)
    return claim


# -- Retry on request ----------------------------------------------------------------------

def test_retry_queues_the_task_after_the_delay_by_the_database_clock(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    task = q.enqueue("call.llm", {"prompt": "hi"})
    claim = _claim_one(q, w)
    asked_at = q.now()
    after = q.retry(w, claim, after=1.0, reason="provider said 429, Retry-After: 1")
    assert (after.status, after.attempts, after.snoozes, after.lease_owner) == ("queued", 0, 1, None)
    # claimable no earlier than `after` seconds from the request, by the database's clock
    assert seconds_between(after.available_at, asked_at) >= 1.0
    assert q.claim(w) == []
    wait_until(q, after.available_at)
    again = _claim_one(q, w)
    assert (again.task_id, again.generation, again.task.attempts) == (task.id, claim.generation + 1, 1)
    [event] = [e for e in q.events(task.id) if e.type == "retry_requested"]
    assert (event.generation, event.worker_id) == (claim.generation, w.id)
    assert event.detail["reason"] == "provider said 429, Retry-After: 1"
    assert (event.detail["after"], event.detail["snoozes"], event.detail["next_status"]) == (1.0, 1, "queued")


def test_retry_neither_burns_an_attempt_nor_feeds_the_same_error_quarantine(q: leaseq.Queue, dsn: str) -> None:
    """(q: the schema, migrated; this test opens its own connection with its own limits.)"""
    q = leaseq.connect(dsn, max_same_error=2)  # noqa: F811 - the limits under test
    try:
        w = q.register_worker("w")
        task = q.enqueue("job", max_attempts=2)
        failed = q.fail(w, _claim_one(q, w), "boom", delay=0)
        assert (failed.status, failed.attempts, failed.error_streak) == ("queued", 1, 1)
        for n in range(5):  # many more requests than attempts or the streak allow
            snoozed = q.retry(w, _claim_one(q, w), after=0, reason=f"busy {n}")
            assert (snoozed.status, snoozed.attempts, snoozed.error_streak, snoozed.error_fingerprint) == (
                "queued", 1, 1, failed.error_fingerprint)
        assert q.get(task.id).snoozes == 5
        q.complete(w, _claim_one(q, w), "done")  # the second attempt is still there to use
        assert q.get(task.id).status == "completed"
    finally:
        q.close()


def test_past_max_snoozes_a_retry_request_is_recorded_as_a_failure(q: leaseq.Queue, dsn: str) -> None:
    """(q: the schema, migrated; this test opens its own connection with its own limits.)"""
    q = leaseq.connect(dsn, max_snoozes=2)  # noqa: F811 - the limit under test
    try:
        w = q.register_worker("w")
        task = q.enqueue("job", max_attempts=1)
        for _ in range(2):
            assert q.retry(w, _claim_one(q, w), after=0, reason="later").status == "queued"
        ended = q.retry(w, _claim_one(q, w), after=0, reason="later again")
        assert (ended.status, ended.snoozes, ended.attempts) == ("dead", 2, 1)  # one attempt, now used
        assert "max_snoozes=2" in ended.last_error and "later again" in ended.last_error
        types = [e.type for e in q.events(task.id)]
        assert types.count("retry_requested") == 2 and types[-2:] == ["failed", "dead"]
    finally:
        q.close()


def test_retry_with_an_open_side_effect_intent_goes_to_reconciliation(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    task = q.enqueue("pay", effect="side_effect")
    claim = _claim_one(q, w)
    q.begin_effect(w, claim, "orders.pay")  # the call may have gone out: running it again could repeat it
    parked = q.retry(w, claim, after=0, reason="gateway busy")
    assert parked.status == "needs_reconciliation"
    assert [e.type for e in q.events(task.id)][-2:] == ["retry_requested", "needs_reconciliation"]


@pytest.mark.parametrize("field, after, reason", [("after", -1, "x"), ("after", float("nan"), "x"),
                                                   ("after", "soon", "x"), ("reason", 1, ""), ("reason", 1, None)])
def test_retry_with_bad_input_is_refused_and_writes_nothing(q: leaseq.Queue, dsn: str, field: str, after, reason):
    w = q.register_worker("w")
    q.enqueue("job")
    claim = _claim_one(q, w)
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        q.retry(w, claim, after=after, reason=reason)
    assert info.value.field == field
    assert snapshot(dsn) == before


def test_the_retry_exception_checks_its_arguments() -> None:
    assert leaseq.Retry(after=2, reason="429").after == 2.0
    for after in (-1, float("inf"), "1", True):
        with pytest.raises(leaseq.InvalidInput) as info:
            leaseq.Retry(after=after)
        assert info.value.field == "after"
    with pytest.raises(leaseq.InvalidInput):
        leaseq.Retry(1, reason="  ")


# -- timeout and deadline at enqueue ---------------------------------------------------------

def test_enqueue_writes_timeout_and_deadline(q: leaseq.Queue) -> None:
    now = q.now()
    at = now + timedelta(hours=1)
    one = q.enqueue("job", timeout=2.5, deadline=at)
    assert (one.timeout_seconds, one.deadline_at, one.snoozes) == (2.5, at, 0)
    relative = q.enqueue("job", deadline=timedelta(minutes=10))
    assert abs(seconds_between(relative.deadline_at, relative.created_at) - 600) < 1
    plain = q.enqueue("job")
    assert (plain.timeout_seconds, plain.deadline_at) == (None, None)
    ids = q.enqueue_many("job", [1, 2], timeout=1.5, deadline=at)
    assert {(t.timeout_seconds, t.deadline_at) for t in map(q.get, ids)} == {(1.5, at)}


@pytest.mark.parametrize("options, field", [
    ({"timeout": 0}, "timeout"), ({"timeout": -1}, "timeout"), ({"timeout": "1"}, "timeout"),
    ({"deadline": datetime(2030, 1, 1)}, "deadline"),  # no offset: ambiguous
    ({"deadline": datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1)))}, "deadline"),  # out of range
    ({"deadline": "2030-01-01T00:00:00Z"}, "deadline"), ({"deadline": 60}, "deadline"),
    ({"deadline": timedelta(seconds=-5)}, "deadline"),
])
def test_enqueue_with_bad_budgets_is_refused_and_writes_nothing(q: leaseq.Queue, dsn: str, options, field) -> None:
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        q.enqueue("job", **options)
    assert info.value.field == field
    with pytest.raises(leaseq.InvalidInput):
        q.enqueue_many("job", [1], **options)
    assert snapshot(dsn) == before


# -- deadlines -------------------------------------------------------------------------------

def test_a_task_past_its_deadline_is_never_started_and_the_sweep_expires_it(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    now = q.now()
    late = q.enqueue("job", {"n": "late"}, deadline=now - timedelta(seconds=1), priority=10)
    soon = q.enqueue("job", {"n": "soon"}, deadline=now + timedelta(seconds=0.5), priority=5)
    free = q.enqueue("job", {"n": "free"})
    wait_until(q, soon.deadline_at)
    # both overdue tasks are skipped though they rank first: only the one without a deadline is claimed
    assert [c.task_id for c in q.claim(w, limit=10)] == [free.id]
    assert q.get(late.id).status == q.get(soon.id).status == "queued"
    q.sweep()
    for task in (late, soon):
        expired = q.get(task.id)
        assert (expired.status, expired.attempts, expired.lease_owner) == ("expired", 0, None)
        [event] = [e for e in q.events(task.id) if e.type == "deadline_passed"]
        assert event.detail["previous_status"] == "queued"
        assert event.detail["deadline_at"] == task.deadline_at.isoformat()
        assert event.detail["reason"] == expired.last_error == "deadline passed before the task started"
    q.sweep()  # nothing left to expire: no second event
    assert [e.type for e in q.events(late.id)] == ["enqueued", "deadline_passed"]


def test_a_deadline_ends_retries_too_but_never_a_running_attempt(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    retried = q.enqueue("job", {"n": 1}, deadline=timedelta(seconds=0.5))
    running = q.enqueue("job", {"n": 2}, deadline=timedelta(seconds=0.5))
    first = _claim_one(q, w, limit=1)
    second = _claim_one(q, w, limit=1)
    by_id = {first.task_id: first, second.task_id: second}
    q.fail(w, by_id[retried.id], "flaky", delay=0.1)  # queued again for its retry
    wait_until(q, q.get(retried.id).deadline_at)
    assert q.claim(w) == []
    q.sweep()
    expired = q.get(retried.id)
    assert (expired.status, expired.last_error) == ("expired", "deadline passed before its next attempt")
    assert q.get(running.id).status == "running"  # started in time: the deadline no longer applies
    q.complete(w, by_id[running.id], "ok")
    assert q.get(running.id).status == "completed"


def test_expired_is_final_for_the_operator_actions(q: leaseq.Queue) -> None:
    task = q.enqueue("job", deadline=datetime.now(timezone.utc) - timedelta(minutes=1))
    q.sweep()
    for action in (lambda: q.requeue(task.id, "again"), lambda: q.unblock(task.id, "fixed")):
        with pytest.raises(leaseq.InvalidTransition):
            action()
    assert q.get(task.id).status == "expired"
