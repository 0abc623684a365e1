"""The lease guard: every write made on the strength of a lease is a
compare-and-set on status running + owner + generation + live lease.

Each guarded call is refused in each way a lease can be lost, and a refused
call must leave every table exactly as it was.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

import leaseq

from pg_modes import own_connection

from .support import WORKING_LEASE, seconds_between, snapshot, wait_expired, wait_until

GUARDED: dict[str, Callable[[leaseq.Queue, Any, leaseq.Claim, Any], Any]] = {
    "heartbeat": lambda q, w, c, fx: q.heartbeat(w, c),
    "complete": lambda q, w, c, fx: q.complete(w, c, result={"stale": True}),
    "fail": lambda q, w, c, fx: q.fail(w, c, "boom", delay=0),
    "release": lambda q, w, c, fx: q.release(w, c),
    "retry": lambda q, w, c, fx: q.retry(w, c, after=0, reason="told to come back"),
    "begin_effect": lambda q, w, c, fx: q.begin_effect(w, c, "email.send"),
    "finish_effect": lambda q, w, c, fx: q.finish_effect(w, c, fx, response={"sent": True}),
}


class Story:
    """Worker A holds a lease on a side-effect task; worker B is registered too."""

    def __init__(self, q: leaseq.Queue, lease_seconds: float | None = None):
        self.q = q
        self.a = q.register_worker("a")
        self.b = q.register_worker("b")
        self.task = q.enqueue("job", {"x": 1}, effect="side_effect")
        [self.claim] = q.claim(self.a, lease_seconds=lease_seconds)
        # an intent recorded while the lease was live, for finish_effect to try to close
        self.fx = q.begin_effect(self.a, self.claim, "crm.update")


def _lose(kind: str, q: leaseq.Queue) -> tuple[Story, Any, leaseq.Claim]:
    """Set up a lease lost in the way ``kind`` names; returns (story, worker, claim to try)."""
    if kind == "expired":
        s = Story(q, lease_seconds=WORKING_LEASE)
        wait_expired(q, s.claim)
        return s, s.a, s.claim
    s = Story(q)
    if kind == "newer_generation":
        return s, s.a, dataclasses.replace(s.claim, generation=s.claim.generation + 1)
    if kind == "older_generation":
        return s, s.a, dataclasses.replace(s.claim, generation=s.claim.generation - 1)
    if kind == "forged_owner":
        return s, s.b, dataclasses.replace(s.claim, worker_id=s.b.id)
    if kind == "completed":
        q.finish_effect(s.a, s.claim, s.fx, response={"ok": 1})
        s.fx = q.begin_effect(s.a, s.claim, "crm.note")
        q.complete(s.a, s.claim, result={"first": True})
        return s, s.a, s.claim
    if kind == "cancelled":
        q.cancel(s.task.id, reason="operator said so", by="ops")
        return s, s.a, s.claim
    raise AssertionError(kind)


LOSSES = ["newer_generation", "older_generation", "forged_owner", "expired", "completed", "cancelled"]


@pytest.mark.parametrize("op", list(GUARDED))
@pytest.mark.parametrize("loss", LOSSES)
def test_guarded_call_is_refused_and_changes_nothing(q: leaseq.Queue, dsn: str, op: str, loss: str) -> None:
    s, worker, claim = _lose(loss, q)
    before = snapshot(dsn)
    with pytest.raises(leaseq.LeaseLost) as info:
        GUARDED[op](q, worker, claim, s.fx)
    assert info.value.task_id == s.task.id
    assert info.value.generation == claim.generation
    assert snapshot(dsn) == before


@pytest.mark.parametrize("op", list(GUARDED))
def test_claim_of_another_worker_is_invalid_input(q: leaseq.Queue, dsn: str, op: str) -> None:
    s = Story(q)
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        GUARDED[op](q, s.b, s.claim, s.fx)
    assert info.value.field == "claim"
    assert snapshot(dsn) == before


@pytest.mark.parametrize("op", list(GUARDED))
def test_guarded_call_succeeds_with_the_live_lease(q: leaseq.Queue, op: str) -> None:
    """The control case: the same calls are accepted from the real holder."""
    s = Story(q)
    GUARDED[op](q, s.a, s.claim, s.fx)


def test_stalled_worker_is_refused_after_another_recovers_the_task(q: leaseq.Queue) -> None:
    """The design note's operational test: pause A, let B recover, resume A."""
    a, b = q.register_worker("a"), q.register_worker("b")
    t = q.enqueue("summarize", {"doc": 7}, effect="idempotent")
    [ca] = q.claim(a, lease_seconds=0.2)
    wait_expired(q, ca)  # A stalls past its deadline
    [cb] = q.claim(b)
    assert cb.task_id == t.id and cb.generation == ca.generation + 1

    refused = []
    for name, call in [
        ("heartbeat", lambda: q.heartbeat(a, ca)),
        ("complete", lambda: q.complete(a, ca, result={"by": "A"})),
        ("fail", lambda: q.fail(a, ca, "A gave up", delay=0)),
        ("begin_effect", lambda: q.begin_effect(a, ca, "email.send")),
    ]:
        with pytest.raises(leaseq.LeaseLost):
            call()
        refused.append(name)
    assert refused == ["heartbeat", "complete", "fail", "begin_effect"]

    q.complete(b, cb, result={"by": "B"})
    with pytest.raises(leaseq.LeaseLost):
        q.complete(a, ca, result={"by": "A"})  # not even after B is done
    final = q.get(t.id)
    assert (final.status, final.result, final.claim_generation) == ("completed", {"by": "B"}, cb.generation)
    completed = [e for e in q.events(t.id) if e.type == "completed"]
    assert [(e.worker_id, e.generation) for e in completed] == [(b.id, cb.generation)]


def test_forged_claim_cannot_write_a_later_deadline(q: leaseq.Queue, dsn: str) -> None:
    a = q.register_worker("a")
    q.enqueue("job")
    [c] = q.claim(a, lease_seconds=0.2)
    wait_expired(q, c)
    before = snapshot(dsn)
    # neither the same generation after expiry nor a made-up newer one renews
    assert q.renew_leases(a, [c, dataclasses.replace(c, generation=c.generation + 1)]) == {}
    assert snapshot(dsn) == before


def test_renew_leases_renews_many_and_reports_the_lost(q: leaseq.Queue) -> None:
    a = q.register_worker("a")
    for i in range(3):
        q.enqueue("job", {"i": i})
    held = q.claim(a, limit=3)
    q.enqueue("job", {"i": "short"}, lease_seconds=0.2)
    [short] = q.claim(a)
    q.cancel(held[1].task_id, reason="not needed")
    wait_expired(q, short)
    renewed = q.renew_leases(a, [*held, short])
    assert set(renewed) == {held[0].task_id, held[2].task_id}
    for c in (held[0], held[2]):
        assert renewed[c.task_id] > c.expires_at
        assert q.get(c.task_id).heartbeat_count == 1
    assert q.get(held[1].task_id).status == "cancelled"
    assert q.get(short.task_id).heartbeat_count == 0
    assert q.renew_leases(a, []) == {}


def test_heartbeat_moves_the_deadline_by_the_database_clock(q: leaseq.Queue) -> None:
    lease = 0.6
    a = q.register_worker("a")
    t = q.enqueue("job", lease_seconds=lease)
    [c] = q.claim(a)
    wait_until(q, c.task.claimed_at + (c.expires_at - c.task.claimed_at) / 4)
    before = q.now()
    new_deadline = q.heartbeat(a, c)
    after = q.now()
    assert new_deadline > c.expires_at
    # renewed to "database now + lease", where the renewal ran between before and after
    assert seconds_between(new_deadline, before) >= lease - 0.001
    assert seconds_between(new_deadline, after) <= lease + 0.001
    row = q.get(t.id)
    assert row.lease_expires_at == new_deadline
    assert row.heartbeat_count == 1 and row.last_heartbeat_at is not None
    assert row.longest_heartbeat_gap >= lease / 4 - 0.01
    # heartbeating keeps a short lease alive well past its first deadline
    for _ in range(3):
        wait_until(q, q.get(t.id).last_heartbeat_at + (new_deadline - before) / 3)
        new_deadline = q.heartbeat(a, c)
    assert q.now() > c.expires_at
    assert q.get(t.id).heartbeat_count == 4
    q.complete(a, c, result="done")
    assert q.get(t.id).status == "completed"


def test_revoked_worker_cannot_renew(q: leaseq.Queue, dsn: str) -> None:
    a = q.register_worker("a")
    q.enqueue("job")
    [c] = q.claim(a)
    q.revoke_worker(a)
    before = snapshot(dsn)
    with pytest.raises(leaseq.LeaseLost):
        q.heartbeat(a, c)
    assert snapshot(dsn) == before


@pytest.mark.parametrize("bad", [None, {"task_id": 1, "generation": 1}, "1:1"])
def test_guarded_calls_reject_things_that_are_not_claims(q: leaseq.Queue, bad: Any) -> None:
    s = Story(q)
    with pytest.raises(leaseq.InvalidInput) as info:
        q.complete(s.a, bad)
    assert info.value.field == "claim"
    assert q.get(s.task.id).status == "running"


def test_only_the_worker_that_held_a_generation_can_report_its_loss(q) -> None:
    import dataclasses

    a, b = q.register_worker("a"), q.register_worker("b")
    task = q.enqueue("job")
    [claim] = q.claim(a)
    q.report_loss(a, claim, "heartbeat refused")
    forged = dataclasses.replace(claim, worker_id=b.id)
    with pytest.raises(leaseq.InvalidInput):
        q.report_loss(b, forged, "not mine")
    lost = [e for e in q.events(task.id) if e.type == "lease_lost"]
    assert [(e.worker_id, e.generation) for e in lost] == [(a.id, 1)]


def test_revoking_a_worker_ends_its_leases_at_once(q: leaseq.Queue, dsn: str) -> None:
    """Revocation does not wait for the leases to run out: from the moment it
    commits, no guarded write of the revoked worker is accepted, and the next
    claim routes its tasks by the recovery policy."""
    a, b = q.register_worker("a"), q.register_worker("b")
    plain = q.enqueue("job", {"i": 1}, lease_seconds=300)
    paying = q.enqueue("pay", effect="side_effect", lease_seconds=300)
    claims = {c.task_id: c for c in q.claim(a, limit=2)}
    q.begin_effect(a, claims[paying.id], "bank.transfer")  # unanswered when the worker is revoked
    q.revoke_worker(a)
    before = snapshot(dsn)
    for call in (lambda: q.complete(a, claims[plain.id], "late"), lambda: q.heartbeat(a, claims[plain.id]),
                 lambda: q.fail(a, claims[plain.id], "late"), lambda: q.begin_effect(a, claims[plain.id], "x")):
        with pytest.raises(leaseq.LeaseLost):
            call()
    assert q.complete_many(a, [(claims[plain.id], "late")]) == set()
    assert snapshot(dsn) == before
    [again] = q.claim(b)
    assert (again.task_id, again.generation) == (plain.id, claims[plain.id].generation + 1)
    assert q.get(paying.id).status == "needs_reconciliation"
    types = [e.type for e in q.events(plain.id)]
    assert types == ["enqueued", "claimed", "lease_revoked", "lease_expired", "claimed"], types
    q.revoke_worker(a)  # again: nothing more happens
    assert [e.type for e in q.events(plain.id)].count("lease_revoked") == 1


def test_revocation_beats_a_write_already_on_its_way(q: leaseq.Queue, dsn: str) -> None:
    """A transaction that began before the revocation, and writes after it,
    is refused too: the revoked deadline is one no write carrying that
    generation can meet, whatever instant its transaction started at."""
    if q.dialect != "postgres":
        pytest.skip("SQLite runs one write transaction at a time: none is in flight beside a revocation")
    from leaseq.store.base import load_queries
    from leaseq.store.postgres import _encode

    a = q.register_worker("a")
    task = q.enqueue("job", lease_seconds=300)
    [c] = q.claim(a)
    with own_connection(dsn) as early:  # not autocommit: its transaction, and its now(), start here
        early.execute("SELECT now()")
        time.sleep(0.05)
        q.revoke_worker(a)
        done = early.execute(load_queries("postgres")["complete_batch"], _encode(dict(
            worker_id=a.id, items=[{"task_id": c.task_id, "generation": c.generation, "result": "late"}],
            compact=False, with_dependents=False, lock_worker=False, task_ids=[c.task_id]))).fetchall()
        early.commit()
    assert done == []
    assert q.get(task.id).status == "running"  # until the next claim routes it


def test_a_statement_in_a_transaction_begun_before_the_deadline_is_judged_when_it_runs(q: leaseq.Queue) -> None:
    """The guard reads the clock as it judges the row, not when the transaction began: a
    renewal or completion that runs after the deadline is refused even if its transaction
    (a long renewal, a service request with its token check first) started before it."""
    w = q.register_worker("w")
    q.enqueue("job", effect="read_only")
    [claim] = q.claim(w, lease_seconds=0.5)
    with q.joined() as (view, tx):
        tx.row("db_now")  # the transaction has begun, well inside the lease
        time.sleep(0.8)   # the lease runs out while it is open
        with pytest.raises(leaseq.LeaseLost):
            view.heartbeat(w, claim)
        with pytest.raises(leaseq.LeaseLost):
            view.complete(w, claim, result=1)
    assert q.get(claim.task_id).status == "running"  # expired, waiting to be routed; nothing written
