"""The recovery policy: an expired lease allows reassignment, not a retry.

One test per row of the policy table, plus failure routing, cancellation,
reconciliation, requeue, release and retry backoff.
"""

from __future__ import annotations

import random

import pytest

import leaseq
from leaseq.core import checks

from .support import WORKING_LEASE, seconds_between, snapshot, wait_expired, wait_until


def _expire(q: leaseq.Queue, worker: leaseq.Worker, **enqueue: object) -> tuple[leaseq.Task, leaseq.Claim]:
    """Enqueue a task, claim it with a sub-second lease and let that lease run out."""
    t = q.enqueue("job", {"n": 1}, **enqueue)
    [c] = q.claim(worker, lease_seconds=0.2)
    assert c.task_id == t.id
    wait_expired(q, c)
    return t, c


@pytest.mark.parametrize("effect", ["read_only", "idempotent"])
def test_expired_read_only_and_idempotent_tasks_are_reclaimed_with_the_same_key(q: leaseq.Queue, effect: str) -> None:
    a, b = q.register_worker("a"), q.register_worker("b")
    t, ca = _expire(q, a, effect=effect, idempotency_key=f"order-42-{effect}")
    [cb] = q.claim(b)
    assert (cb.task_id, cb.generation, cb.task.attempts) == (t.id, 2, 2)
    assert cb.task.idempotency_key == f"order-42-{effect}"
    [expired] = [e for e in q.events(t.id) if e.type == "lease_expired"]
    assert (expired.generation, expired.worker_id) == (ca.generation, a.id)
    assert expired.detail["routed_to"] == "queued"


def test_side_effect_with_an_open_intent_waits_for_reconciliation(q: leaseq.Queue) -> None:
    a, b = q.register_worker("a"), q.register_worker("b")
    t = q.enqueue("refund", {"order": 9}, effect="side_effect")
    [ca] = q.claim(a, lease_seconds=WORKING_LEASE)
    q.begin_effect(a, ca, "payments.refund")
    wait_expired(q, ca)
    assert q.claim(b) == []
    assert q.get(t.id).status == "needs_reconciliation"
    assert q.claim(b) == [] and q.sweep() == 0  # never claimed again until reconciled
    q.reconcile(t.id, "requeue", note="refund not found at the provider")
    [cb] = q.claim(b)
    assert (cb.task_id, cb.generation) == (t.id, 2)


def test_sweep_routes_expired_leases_without_a_claim(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    t = q.enqueue("refund", effect="side_effect")
    [c] = q.claim(a, lease_seconds=WORKING_LEASE)
    q.begin_effect(a, c, "payments.refund")
    wait_expired(q, c)
    assert q.sweep() == 1
    assert q.get(t.id).status == "needs_reconciliation"


@pytest.mark.parametrize("intent", ["none", "answered"])
def test_side_effect_without_an_open_intent_is_reclaimable(q: leaseq.Queue, intent: str) -> None:
    a, b = q.register_worker("a"), q.register_worker("b")
    t = q.enqueue("notify", effect="side_effect")
    [ca] = q.claim(a, lease_seconds=WORKING_LEASE)
    if intent == "answered":
        fx = q.begin_effect(a, ca, "email.send")
        q.finish_effect(a, ca, fx, response={"message_id": "m1"})
    wait_expired(q, ca)
    [cb] = q.claim(b)
    assert (cb.task_id, cb.generation) == (t.id, 2)


def test_expiry_with_attempts_exhausted_is_dead(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    t, _ = _expire(q, a, max_attempts=1)
    assert q.claim(a) == []
    assert q.get(t.id).status == "dead"
    types = [e.type for e in q.events(t.id)]
    assert types[-2:] == ["lease_expired", "dead"]


def test_failures_until_attempts_are_exhausted_is_dead(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    t = q.enqueue("job", max_attempts=2)
    [c1] = q.claim(a)
    assert q.fail(a, c1, "disk full", delay=0).status == "queued"
    [c2] = q.claim(a)
    dead = q.fail(a, c2, "network down", delay=0)
    assert (dead.status, dead.attempts, dead.last_error) == ("dead", 2, "network down")
    assert q.claim(a) == []
    assert q.get(t.id).status == "dead"


def test_the_same_error_three_times_is_dead_before_attempts_run_out(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    t = q.enqueue("job", max_attempts=10)
    statuses = []
    for seconds in (31, 45, 12):  # the same error quoting different numbers
        [c] = q.claim(a)
        statuses.append(q.fail(a, c, f"timeout after {seconds}s calling api", delay=0).status)
    assert statuses == ["queued", "queued", "dead"]
    final = q.get(t.id)
    assert final.attempts == 3 < final.max_attempts
    assert final.error_streak == 3


def test_different_errors_do_not_count_as_repeated(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    q.enqueue("job", max_attempts=10)
    statuses = []
    for error in ("timeout", "refused", "timeout", "refused"):
        [c] = q.claim(a)
        statuses.append(q.fail(a, c, error, delay=0).status)
    assert statuses == ["queued"] * 4


def test_blocked_until_unblocked(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    t = q.enqueue("sync", max_attempts=10)
    [c] = q.claim(a)
    assert q.fail(a, c, "token revoked", block=True).status == "blocked"
    assert q.claim(a) == []
    with pytest.raises(leaseq.InvalidTransition):
        q.requeue(t.id, note="not dead")
    assert q.unblock(t.id, note="token rotated").status == "queued"
    [c2] = q.claim(a)
    assert (c2.task_id, c2.generation) == (t.id, 2)
    with pytest.raises(leaseq.InvalidTransition):
        q.unblock(t.id, note="not blocked")


def test_fail_without_retry_is_dead_and_requeue_revives_it(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    t = q.enqueue("job", max_attempts=10)
    [c] = q.claim(a)
    assert q.fail(a, c, "malformed input", retry=False).status == "dead"
    assert q.claim(a) == []
    revived = q.requeue(t.id, note="input fixed")
    assert (revived.status, revived.attempts) == ("queued", 0)
    [c2] = q.claim(a)
    assert (c2.task_id, c2.generation, c2.task.attempts) == (t.id, 2, 1)
    with pytest.raises(leaseq.InvalidTransition):
        q.requeue(t.id, note="running, not dead")


def test_fail_with_an_open_intent_needs_reconciliation(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    t = q.enqueue("charge", effect="side_effect", max_attempts=10)
    [c] = q.claim(a)
    q.begin_effect(a, c, "payments.charge")
    assert q.fail(a, c, "socket closed mid-request", delay=0).status == "needs_reconciliation"
    assert q.claim(a) == []
    assert q.get(t.id).status == "needs_reconciliation"


def test_credential_failure_with_an_open_intent_still_needs_reconciliation(q: leaseq.Queue) -> None:
    """An unanswered intent outranks a credential block: unblocking must not
    make the task claimable while nobody has settled what the call did."""
    a = q.register_worker("a")
    t = q.enqueue("charge", effect="side_effect", max_attempts=10)
    [c] = q.claim(a)
    q.begin_effect(a, c, "payments.charge")
    assert q.fail(a, c, "401 token revoked mid-call", block=True).status == "needs_reconciliation"
    with pytest.raises(leaseq.InvalidTransition):
        q.unblock(t.id, note="token rotated")
    assert q.claim(a) == []


def test_cancel_stays_cancelled_and_the_holder_loses_its_lease(q: leaseq.Queue) -> None:
    a, b = q.register_worker("a"), q.register_worker("b")
    t = q.enqueue("job", effect="idempotent")
    [c] = q.claim(a, lease_seconds=0.2)
    q.cancel(t.id, reason="customer withdrew", by="ops")
    with pytest.raises(leaseq.LeaseLost):
        q.heartbeat(a, c)
    wait_expired(q, c)  # expiry must not revive it
    assert q.claim(b) == [] and q.sweep() == 0
    final = q.get(t.id)
    assert (final.status, final.lease_owner, final.lease_expires_at) == ("cancelled", None, None)
    with pytest.raises(leaseq.InvalidTransition):
        q.cancel(t.id, reason="again")


def test_queued_and_completed_tasks_under_cancel(q: leaseq.Queue, dsn: str) -> None:
    a = q.register_worker("a")
    queued = q.enqueue("job")
    assert q.cancel(queued.id, reason="not needed").status == "cancelled"
    assert q.claim(a) == []
    done = q.enqueue("job")
    [c] = q.claim(a)
    q.complete(a, c, result=1)
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidTransition):
        q.cancel(done.id, reason="too late")
    assert snapshot(dsn) == before


def _needs_reconciliation(q: leaseq.Queue) -> tuple[leaseq.Task, leaseq.Effect]:
    a = q.register_worker("a")
    t = q.enqueue("email", effect="side_effect")
    [c] = q.claim(a)
    fx = q.begin_effect(a, c, "email.send")
    q.fail(a, c, "crashed", delay=0)
    assert q.get(t.id).status == "needs_reconciliation"
    return t, fx


def test_reconcile_completed_stores_the_result_and_settles_intents(q: leaseq.Queue) -> None:
    t, fx = _needs_reconciliation(q)
    done = q.reconcile(t.id, "completed", note="provider shows it sent", result={"message_id": "m9"})
    assert (done.status, done.result, done.open_effects) == ("completed", {"message_id": "m9"}, 0)
    assert [e.status for e in q.effects(t.id)] == ["reconciled"]
    assert q.claim(q.register_worker("b")) == []


def test_reconcile_requeue_runs_again_with_the_same_key(q: leaseq.Queue) -> None:
    t, _ = _needs_reconciliation(q)
    assert q.reconcile(t.id, "requeue", note="never sent").status == "queued"
    [c] = q.claim(q.register_worker("b"))
    assert (c.task_id, c.task.idempotency_key, c.generation) == (t.id, t.idempotency_key, 2)


def test_reconcile_cancel(q: leaseq.Queue) -> None:
    t, _ = _needs_reconciliation(q)
    assert q.reconcile(t.id, "cancel", note="no longer wanted").status == "cancelled"
    assert q.claim(q.register_worker("b")) == []


def test_reconcile_refuses_the_wrong_state_and_bad_outcomes(q: leaseq.Queue, dsn: str) -> None:
    t, _ = _needs_reconciliation(q)
    queued = q.enqueue("job")
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidTransition):
        q.reconcile(queued.id, "completed", note="not waiting for reconciliation")
    with pytest.raises(leaseq.InvalidInput) as info:
        q.reconcile(t.id, "retry", note="no such outcome")
    assert info.value.field == "outcome"
    with pytest.raises(leaseq.InvalidInput) as info:
        q.reconcile(t.id, "requeue", note="")
    assert info.value.field == "note"
    with pytest.raises(leaseq.NotFound):
        q.reconcile(10**9, "requeue", note="missing")
    assert snapshot(dsn) == before
    q.reconcile(t.id, "requeue", note="fine")
    with pytest.raises(leaseq.InvalidTransition):
        q.reconcile(t.id, "requeue", note="twice")


@pytest.mark.parametrize("case, expected", [
    ("read_only", "queued"), ("open_intent", "needs_reconciliation"), ("last_attempt", "dead")])
def test_release_goes_through_the_same_policy(q: leaseq.Queue, case: str, expected: str) -> None:
    a = q.register_worker("a")
    t = q.enqueue("job", effect="read_only" if case == "read_only" else "side_effect",
                  max_attempts=1 if case == "last_attempt" else 5)
    [c] = q.claim(a)
    if case == "open_intent":
        q.begin_effect(a, c, "email.send")
    released = q.release(a, c, reason="worker shutting down")
    assert released.status == expected and released.lease_owner is None
    [event] = [e for e in q.events(t.id) if e.type == "lease_released"]
    assert event.detail["routed_to"] == expected and event.detail["reason"] == "worker shutting down"
    claims = q.claim(a)
    assert [c.task_id for c in claims] == ([t.id] if expected == "queued" else [])
    with pytest.raises(leaseq.LeaseLost):
        q.release(a, c)


def test_retry_waits_for_its_backoff(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    t = q.enqueue("job", max_attempts=10)
    [c] = q.claim(a)
    before = q.now()
    retried = q.fail(a, c, "rate limited", delay=0.4)
    assert retried.status == "queued"
    assert retried.available_at > t.available_at
    assert 0.39 < seconds_between(retried.available_at, before) < 0.8
    assert q.claim(a) == []
    wait_until(q, retried.available_at)
    [c2] = q.claim(a)
    assert (c2.task_id, c2.generation) == (t.id, 2)
    [failed] = [e for e in q.events(t.id) if e.type == "failed"]
    assert failed.detail["retry_at"]


def test_default_backoff_grows_with_attempts(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    t = q.enqueue("job", max_attempts=10)
    [c] = q.claim(a)
    before = q.now()
    first = q.fail(a, c, "flaky one")
    # attempt 1 waits between half and all of the 1 s base
    assert 0.5 <= seconds_between(first.available_at, before) <= 1.2
    assert q.claim(a) == []
    assert q.get(t.id).available_at == first.available_at


@pytest.mark.parametrize("attempts", [1, 2, 5, 12, 13, 40])
def test_default_backoff_is_the_python_rule_to_the_number(q: leaseq.Queue, attempts: int) -> None:
    # fail_task computes the default backoff from the row's attempts, in SQL; for the same
    # random draw it is core.checks.backoff_seconds's number (12 and 13 straddle the cap)
    a = q.register_worker("a")
    t = q.enqueue("job", max_attempts=100)
    for n in range(1, attempts):  # earlier attempts fail at once, each with its own error
        [c] = q.claim(a)
        q.fail(a, c, "flaky " + "x" * n, delay=0)
    [c] = q.claim(a)
    assert c.task.attempts == attempts
    random.seed(attempts)
    failed = q.fail(a, c, "flaky at last")
    expected = checks.backoff_seconds(attempts, rng=random.Random(attempts))
    assert failed.status == "queued" and failed.updated_at is not None
    # the statement's clock stamps both: their difference is the delay
    assert seconds_between(failed.available_at, failed.updated_at) == pytest.approx(expected, abs=2e-5)
    assert q.get(t.id).available_at == failed.available_at
