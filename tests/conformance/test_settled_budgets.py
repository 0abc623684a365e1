"""Budgets settled after the call, on both backends: ``consume`` charges what an attempt
actually used, under the lease, once (the ledger); a limit's windows (per_minute, per_hour,
per_day) are judged in the claim statement, exactly under concurrent claimers; the claim's
reservation is reconciled to the actual usage when the attempt ends; a task's budget spent
pauses it for an approval, which may raise it.

Usage is read back from the database (``limits()``, the ledger, the task's ``spent``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq.core.errors import AccessDenied, InvalidInput, LeaseLost
from leaseq.worker.context import TaskContext

from .support import WORKING_LEASE, wait_expired

TOK = "tok"


def window_row(q: leaseq.Queue, key: str = TOK) -> dict[str, Any]:
    [row] = q.limits(key)
    return row


def ledger_consumes(q: leaseq.Queue, task_id: int) -> list[leaseq.Effect]:
    return [e for e in q.effects(task_id) if e.action == "leaseq.consume"]


def same_window(q: leaseq.Queue, length: int, scenario: Any) -> Any:
    """Run ``scenario(key)`` on a fresh limit key until one run stays within one window of
    ``length`` seconds by the database's clock (a run that crossed a boundary saw two windows)."""
    for attempt in range(3):
        before = q.now().timestamp() // length
        found = scenario(f"{TOK}-{attempt}")
        if q.now().timestamp() // length == before:
            return found
    raise AssertionError("three runs in a row crossed a window boundary")


# -- bad input -------------------------------------------------------------------------

@pytest.mark.parametrize("options, field", [
    ({"per_minute": 0}, "per_minute"),
    ({"per_hour": 1.5}, "per_hour"),
    ({"per_day": True}, "per_day"),
    ({"per_day": -3, "max_running": 2}, "per_day"),
])
def test_a_bad_window_is_refused_naming_the_field_and_nothing_is_written(q: leaseq.Queue, options: dict,
                                                                         field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        q.set_limit(TOK, **options)
    assert err.value.field == field
    assert q.limits() == []


def test_a_window_alone_makes_a_limit(q: leaseq.Queue) -> None:
    row = q.set_limit(TOK, per_hour=500, counts="units")
    assert (row["per_minute"], row["per_hour"], row["per_day"], row["hour_used"]) == (None, 500, None, 0)
    assert row["max_running"] is None and row["per_second"] is None and row["spent_today"] == 0


@pytest.mark.parametrize("budget, field", [
    ("tokens", "budget"),
    ({}, "budget"),
    ({"not a key": 5}, "budget['not a key']"),
    ({"tokens": 0}, "budget['tokens']"),
    ({"tokens": 2.5}, "budget['tokens']"),
    ({f"k{i}": 1 for i in range(17)}, "budget"),
])
def test_a_bad_budget_is_refused_naming_the_field_and_nothing_is_written(q: leaseq.Queue, budget: Any,
                                                                         field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        q.enqueue("job", budget=budget)
    assert err.value.field == field
    assert q.list_tasks() == []


@pytest.mark.parametrize("limit_key, units, field", [
    ("has space", 5, "limit_key"),
    (TOK, -1, "units"),
    (TOK, 1.5, "units"),
    (TOK, "5", "units"),
])
def test_a_bad_consume_is_refused_naming_the_field_and_nothing_is_charged(q: leaseq.Queue, limit_key: Any,
                                                                          units: Any, field: str) -> None:
    q.set_limit(TOK, per_day=1000, counts="units")
    w = q.register_worker("w")
    task = q.enqueue("job", limits=[TOK], units=10, budget={TOK: 100})
    [claim] = q.claim(w)
    with pytest.raises(InvalidInput) as err:
        q.consume(w, claim, "job:consume:0", limit_key, units)
    assert err.value.field == field
    assert ledger_consumes(q, task.id) == [] and q.get(task.id).spent is None
    assert window_row(q)["day_used"] == 10 and q.limit_spend() == []


# -- windows, judged in the claim --------------------------------------------------------

@pytest.mark.parametrize("window, length", [("per_minute", 60), ("per_hour", 3600), ("per_day", 86400)])
def test_consume_charges_the_window_and_the_claim_refuses_once_it_is_spent(q: leaseq.Queue, window: str,
                                                                           length: int) -> None:
    w = q.register_worker("w")
    used = window.replace("per_", "") + "_used"

    def scenario(key: str) -> None:
        q.set_limit(key, counts="units", **{window: 1000})
        queue = f"q-{key}"
        first, *rest = [q.enqueue("call", {"n": n}, queue=queue, limits=[key], units=1).id for n in range(3)]
        [claim] = q.claim(w, queue=queue)  # reserves 1 of 1000
        assert claim.task_id == first and window_row(q, key)[used] == 1
        answer = q.consume(w, claim, f"{key}:0", key, 1200)  # the call used more than the window holds
        assert (answer["state"], answer["units"], answer["spent"], answer["budget"]) == ("charged", 1200, 1200,
                                                                                          None)
        assert window_row(q, key)[used] == 1200  # the reservation drawn down, the rest charged
        assert q.claim(w, queue=queue, limit=5) == []  # spent: nothing handed out
        assert {q.get(t).status for t in rest} == {"queued"}
        q.complete(w, claim)
        assert window_row(q, key)[used] == 1200 and q.claim(w, queue=queue, limit=5) == []

    same_window(q, length, scenario)


def test_a_window_admits_while_it_is_not_spent_and_the_last_one_in_may_pass_it_by_its_cost(q: leaseq.Queue) -> None:
    w = q.register_worker("w")

    def scenario(key: str) -> list[int]:
        q.set_limit(key, per_hour=1000, counts="units")
        queue = f"q-{key}"
        ids = [q.enqueue("call", {"n": n}, queue=queue, limits=[key], units=300).id for n in range(6)]
        claimed = q.claim(w, queue=queue, limit=10)  # 0, 300, 600, 900 used before each: four admitted
        assert [c.task_id for c in claimed] == ids[:4] and window_row(q, key)["hour_used"] == 1200
        assert q.claim(w, queue=queue, limit=10) == []
        return ids

    same_window(q, 3600, scenario)


def test_tasks_of_no_window_are_untouched_and_the_claim_passes_a_spent_window(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    q.set_limit(TOK, per_day=10, counts="units")
    held = q.enqueue("call", limits=[TOK], units=10).id
    [claim] = q.claim(w)
    assert claim.task_id == held
    behind = [q.enqueue("call", {"n": n}, limits=[TOK], units=1, priority=5).id for n in range(2)]
    free = [q.enqueue("plain", {"n": n}).id for n in range(2)]
    got = q.claim(w, limit=10)
    assert sorted(c.task_id for c in got) == sorted(free)  # the spent window holds back only its own
    assert {q.get(t).status for t in behind} == {"queued"}


# -- the reservation, reconciled when the attempt ends -----------------------------------

def test_the_reservation_is_credited_back_to_the_window_and_the_bucket_when_the_attempt_ends(
        q: leaseq.Queue) -> None:
    q.set_limit(TOK, per_day=10_000, per_second=0.001, burst=10_000, counts="units")
    w = q.register_worker("w")
    task = q.enqueue("call", limits=[TOK], units=500)
    [claim] = q.claim(w)
    row = window_row(q)
    assert row["day_used"] == 500 and row["tokens"] == pytest.approx(9500, abs=1)
    q.consume(w, claim, "call:consume:0", TOK, 120)
    q.consume(w, claim, "call:consume:1", TOK, 80)
    row = window_row(q)
    assert row["day_used"] == 500 and row["tokens"] == pytest.approx(9500, abs=1)  # drawn from the reservation
    q.complete(w, claim, "ok")
    row = window_row(q)
    assert row["day_used"] == 200 and row["tokens"] == pytest.approx(9800, abs=1)  # the actual, 300 back
    assert row["spent_today"] == 200 and q.get(task.id).spent == {TOK: 200}


def test_usage_past_the_reservation_is_charged_as_it_comes_and_stays(q: leaseq.Queue) -> None:
    q.set_limit(TOK, per_day=10_000, per_second=0.001, burst=10_000, counts="units")
    w = q.register_worker("w")
    q.enqueue("call", limits=[TOK], units=500)
    [claim] = q.claim(w)
    q.consume(w, claim, "call:consume:0", TOK, 800)
    row = window_row(q)
    assert row["day_used"] == 800 and row["tokens"] == pytest.approx(9200, abs=1)  # the difference charged now
    q.complete(w, claim)
    row = window_row(q)
    assert row["day_used"] == 800 and row["tokens"] == pytest.approx(9200, abs=1)


def test_an_attempt_that_reports_no_usage_keeps_its_reservation_as_its_charge(q: leaseq.Queue) -> None:
    q.set_limit(TOK, per_day=10_000, counts="units")
    w = q.register_worker("w")
    q.enqueue("call", limits=[TOK], units=500)
    [claim] = q.claim(w)
    q.complete(w, claim)
    assert window_row(q)["day_used"] == 500 and window_row(q)["spent_today"] == 0


def test_a_key_the_task_does_not_name_is_charged_on_top_of_its_reservations(q: leaseq.Queue) -> None:
    q.set_limit(TOK, per_day=10_000, counts="units")
    q.set_limit("calls", per_day=100)
    w = q.register_worker("w")
    task = q.enqueue("call", limits=["calls"])
    [claim] = q.claim(w)
    q.consume(w, claim, "call:consume:0", TOK, 300)
    q.consume(w, claim, "call:consume:1", "no-limit-set", 7)  # counted in the spend and the task's only
    q.complete(w, claim)
    assert window_row(q)["day_used"] == 300 and window_row(q, "calls")["day_used"] == 1
    assert q.get(task.id).spent == {TOK: 300, "no-limit-set": 7}
    assert sorted((r["key"], r["units"]) for r in q.limit_spend()) == [("no-limit-set", 7), (TOK, 300)]


def test_the_spend_is_split_by_the_tenant_of_the_task_that_consumed(q: leaseq.Queue) -> None:
    """Each consume counts in its key's spend of the day under the task's tenant (its fairness
    key; "" for a task without one): limit_spend gives the day's total and its split, and the
    limit's spent_today is the total."""
    q.set_limit(TOK, per_day=10_000, counts="units")
    w = q.register_worker("w")
    for n, (tenant, units) in enumerate((("acme", 30), ("globex", 12), (None, 5), ("acme", 3))):
        q.enqueue("call", {"n": n}, fairness_key=tenant, queue="tenants")
        [claim] = q.claim(w, queue="tenants")
        q.consume(w, claim, f"call:consume:{n}", TOK, units)
        q.complete(w, claim)
    [day] = q.limit_spend(TOK)
    assert (day["units"], day["tenants"]) == (50, {"": 5, "acme": 33, "globex": 12})
    assert window_row(q)["spent_today"] == 50


@pytest.mark.parametrize("ending", ["fail", "retry", "release", "expiry", "cancel"])
def test_every_end_of_an_attempt_reconciles_its_reservation(q: leaseq.Queue, ending: str) -> None:
    q.set_limit(TOK, per_day=10_000, counts="units")
    w = q.register_worker("w")
    task = q.enqueue("call", limits=[TOK], units=500, lease_seconds=WORKING_LEASE if ending == "expiry" else 30)
    [claim] = q.claim(w)
    q.consume(w, claim, "call:consume:0", TOK, 40)
    if ending == "fail":
        q.fail(w, claim, "boom", delay=0)
    elif ending == "retry":
        q.retry(w, claim, after=0, reason="429")
    elif ending == "release":
        q.release(w, claim, "shutdown")
    elif ending == "expiry":
        wait_expired(q, claim)
        q.sweep()
    else:
        q.cancel(task.id, "not needed")
    assert q.get(task.id).status != "running"
    assert window_row(q)["day_used"] == 40  # each way a lease ends gives the unused 460 back, once
    q.sweep()
    assert window_row(q)["day_used"] == 40


def test_a_replayed_attempt_charges_nothing_twice(q: leaseq.Queue) -> None:
    q.set_limit(TOK, per_day=10_000, counts="units")
    w = q.register_worker("w")
    task = q.enqueue("call", limits=[TOK], units=500, budget={TOK: 1000})
    [claim] = q.claim(w)
    assert q.consume(w, claim, "call:consume:0", TOK, 300)["state"] == "charged"
    q.fail(w, claim, "worker died after the call", delay=0)
    assert window_row(q)["day_used"] == 300
    [claim] = q.claim(w)  # the second attempt reserves 500 again, and replays the recorded call
    again = q.consume(w, claim, "call:consume:0", TOK, 300)
    assert (again["state"], again["units"]) == ("replayed", 300)
    q.consume(w, claim, "call:consume:1", TOK, 50)
    q.complete(w, claim)
    assert window_row(q)["day_used"] == 350 and window_row(q)["spent_today"] == 350
    assert q.get(task.id).spent == {TOK: 350}
    assert [(e.generation, e.response["units"]) for e in ledger_consumes(q, task.id)] == [(1, 300), (2, 50)]


# -- the fence -----------------------------------------------------------------------

def test_a_stale_generation_cannot_consume(q: leaseq.Queue) -> None:
    q.set_limit(TOK, per_day=10_000, counts="units")
    a, b = q.register_worker("a"), q.register_worker("b")
    task = q.enqueue("call", limits=[TOK], units=10, budget={TOK: 100}, lease_seconds=WORKING_LEASE)
    [stale] = q.claim(a)
    w = a
    q.consume(w, stale, "call:consume:0", TOK, 5)
    wait_expired(q, stale)
    [fresh] = q.claim(b)  # the expired lease is routed, and b holds generation 2
    assert fresh.generation == stale.generation + 1
    before = (window_row(q)["day_used"], q.get(task.id).spent, len(ledger_consumes(q, task.id)))
    with pytest.raises(LeaseLost):
        q.consume(w, stale, "call:consume:1", TOK, 90)
    with pytest.raises(LeaseLost):  # nor may it replay its own entry under the old generation
        q.consume(w, stale, "call:consume:0", TOK, 5)
    assert (window_row(q)["day_used"], q.get(task.id).spent, len(ledger_consumes(q, task.id))) == before
    assert q.limit_spend()[0]["units"] == 5


# -- budgets: a task paused for a person, resumed with more -------------------------------

def test_a_budget_spent_pauses_the_task_and_an_approval_with_a_raise_resumes_it(q: leaseq.Queue) -> None:
    q.set_limit(TOK, per_day=100_000, counts="units")
    w, ops = q.register_worker("w"), q.register_worker("ops")
    task = q.enqueue("agent", limits=[TOK], units=100, budget={TOK: 250})
    [claim] = q.claim(w)
    assert q.consume(w, claim, "agent:consume:0", TOK, 100)["state"] == "charged"
    assert q.consume(w, claim, "agent:consume:1", TOK, 100)["state"] == "charged"
    paused = q.consume(w, claim, "agent:consume:2", TOK, 100)  # the call was made: its usage is recorded
    assert (paused["state"], paused["spent"], paused["budget"]) == ("paused", 300, 250)
    held = q.get(task.id)
    assert (held.status, held.lease_owner, held.attempts, held.spent) == ("awaiting_approval", None, 0,
                                                                          {TOK: 300})
    with pytest.raises(LeaseLost):  # the attempt has ended
        q.consume(w, claim, "agent:consume:3", TOK, 1)
    assert q.claim(w) == [] and window_row(q)["running"] == 0
    [request] = q.approvals()
    assert (request.task_id, request.reason, request.requested_by) == (task.id, "budget", f"task:{task.id}")
    assert request.detail == {"key": TOK, "budget": 250, "spent": 300, "units": 100}
    assert request.requested_worker == w.id
    with pytest.raises(AccessDenied):  # the worker that spent it may not raise it
        q.approve(task.id, request.digest, worker=w, raise_budget={TOK: 1000})
    with pytest.raises(InvalidInput) as err:
        q.approve(task.id, request.digest, raise_budget={"other": 5})
    assert err.value.field == "raise_budget"
    with pytest.raises(InvalidInput) as err:
        q.approve(task.id, request.digest, raise_budget={TOK: 0})
    assert err.value.field.startswith("raise_budget")
    assert q.get(task.id).status == "awaiting_approval" and q.get(task.id).budget == {TOK: 250}
    approved = q.approve(task.id, request.digest, note="worth it", raise_budget={TOK: 200}, worker=ops)
    assert (approved.status, approved.budget) == ("queued", {TOK: 450})
    [claim] = q.claim(w)  # the next attempt replays the three recorded consumes, charging nothing
    for n in range(3):
        assert q.consume(w, claim, f"agent:consume:{n}", TOK, 100)["state"] == "replayed"
    assert q.consume(w, claim, "agent:consume:3", TOK, 100) == {
        "state": "charged", "limit_key": TOK, "units": 100, "key": "agent:consume:3", "spent": 400, "budget": 450}
    q.complete(w, claim, "done")
    assert q.get(task.id).spent == {TOK: 400} and window_row(q)["day_used"] == 400
    types = [e.type for e in q.events(task.id)]
    assert types == ["enqueued", "claimed", "budget_exceeded", "suspended", "approved", "claimed", "completed"]
    [approved_event] = [e for e in q.events(task.id) if e.type == "approved"]
    assert approved_event.detail["raise_budget"] == {TOK: 200} and approved_event.detail["budget"] == {TOK: 450}


def test_an_approval_without_a_raise_resumes_until_the_next_consume(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    task = q.enqueue("agent", budget={"tokens": 10})
    [claim] = q.claim(w)
    assert q.consume(w, claim, "agent:consume:0", "tokens", 11)["state"] == "paused"
    q.approve(task.id, q.approval(task.id).digest)
    [claim] = q.claim(w)
    assert q.consume(w, claim, "agent:consume:0", "tokens", 11)["state"] == "replayed"
    assert q.consume(w, claim, "agent:consume:1", "tokens", 1)["state"] == "paused"
    assert q.get(task.id).status == "awaiting_approval" and q.approval(task.id).detail["spent"] == 12
    q.deny(task.id, "too expensive")
    assert q.get(task.id).status == "denied"


def test_a_gated_task_keeps_its_gate_and_then_asks_again_for_its_budget(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    task = q.enqueue("agent", approval="required", budget={"tokens": 5})
    gate = q.approval(task.id)
    assert gate.reason is None and gate.detail is None
    q.approve(task.id, gate.digest)
    [claim] = q.claim(w)
    q.consume(w, claim, "agent:consume:0", "tokens", 6)
    request = q.approval(task.id)  # the task's one request, asked afresh
    assert (request.decision, request.reason, request.detail["spent"]) == (None, "budget", 6)
    assert [a.task_id for a in q.approvals()] == [task.id]


def test_the_budget_is_shown_on_the_task_and_a_budget_free_task_is_untouched(q: leaseq.Queue) -> None:
    task = q.enqueue("agent", budget={"b": 2, "a": 1})
    assert task.budget == {"a": 1, "b": 2} and q.get(task.id).budget == {"a": 1, "b": 2}
    plain = q.enqueue("agent")
    assert plain.budget is None and plain.spent is None
    w = q.register_worker("w")
    claims = q.claim(w, limit=2)
    for c in claims:
        q.consume(w, c, f"{c.task_id}:consume:0", "a", 1_000)
    assert q.get(plain.id).status == "running" and q.get(plain.id).spent == {"a": 1000}
    assert q.get(task.id).status == "awaiting_approval"


# -- exact under concurrent workers --------------------------------------------------------

CALL = 100  # one call's worth: each task reserves it and consumes at most it


def test_concurrent_workers_never_overshoot_a_per_minute_window_by_more_than_one_call(q: leaseq.Queue,
                                                                                       dsn: str) -> None:
    total, threads, tasks = 1000, 4, 60
    q.set_limit(TOK, per_minute=total, counts="units")
    ids = [q.enqueue("call", {"n": n}, limits=[TOK], units=CALL).id for n in range(tasks)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(n: int) -> None:
        queue = leaseq.connect(dsn)
        rng = random.Random(n)
        try:
            w = queue.register_worker(f"w{n}")
            start.wait()
            while True:
                got = queue.claim(w)
                if not got:
                    return  # the window is spent (or the queue is empty)
                [claim] = got
                time.sleep(rng.uniform(0, 0.005))  # the call
                queue.consume(w, claim, f"{claim.task_id}:consume:0", TOK, rng.randint(CALL // 2, CALL))
                queue.complete(w, claim)
        except BaseException as exc:
            errors.append(exc)
        finally:
            queue.close()

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(120)
    assert not errors, errors
    # Each task's usage counts in the window of the claim that reserved it: grouped so, no
    # window holds more than its total and one call's worth, whatever minute boundaries passed.
    by_window: dict[int, int] = {}
    done = [q.get(i) for i in ids if q.get(i).status == "completed"]
    for task in done:
        [entry] = ledger_consumes(q, task.id)
        window = int(task.claimed_at.timestamp() // 60)
        by_window[window] = by_window.get(window, 0) + entry.response["units"]
    assert done and len(done) < tasks, "the window should have held some tasks back"
    assert max(by_window.values()) <= total + CALL, by_window
    assert all(q.get(i).status == "queued" for i in ids if q.get(i).status != "completed")
    current = int(q.now().timestamp() // 60)
    if current in by_window:
        assert window_row(q)["minute_used"] == by_window[current]  # the reservations were reconciled


def test_denying_a_task_paused_for_its_budget_cancels_the_children_it_spawned(q: leaseq.Queue) -> None:
    """A task that spent its budget waits for a person; denying it ends it, and the children
    it spawned before (one running, one queued) end with it, as a cancel takes its tree."""
    q.set_limit(TOK, per_day=100_000, counts="units")
    w = q.register_worker("w")
    task = q.enqueue("agent", limits=[TOK], units=10, budget={TOK: 50})
    [claim] = q.claim(w, kinds=["agent"])
    ctx = TaskContext(q, w, claim, logging.LoggerAdapter(logging.getLogger("test"), {}))
    running, queued = ctx.spawn("step", {"n": 1}, key="one"), ctx.spawn("step", {"n": 2}, key="two")
    [child_lease] = q.claim(w, kinds=["step"])
    assert child_lease.task_id == running.id
    assert q.consume(w, claim, "agent:consume:0", TOK, 80)["state"] == "paused"
    assert q.get(task.id).status == "awaiting_approval"
    q.deny(task.id, "too expensive", by="ops")
    assert q.get(task.id).status == "denied"
    assert [q.get(c.id).status for c in (running, queued)] == ["cancelled", "cancelled"]
    with pytest.raises(LeaseLost):  # the running child's holder has lost its lease
        q.complete(w, child_lease, "late")
    [tree] = [e for e in q.events(task.id) if e.type == "tree_cancelled"]
    assert [(c["task_id"], c["disposition"]) for c in tree.detail["children"]] == \
        [(running.id, "unknown"), (queued.id, "not_started")]
