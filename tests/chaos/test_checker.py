"""The checker on hand-made histories: a clean run passes, each broken promise is named."""

from __future__ import annotations

import copy

import pytest

from leaseq_chaos.checker import INVARIANTS, Observed, check


def rec(t, op, outcome="ok", proc="w0.1", **fields):
    return {"t": t, "op": op, "outcome": outcome, "proc": proc, **fields}


def ev(i, type_, gen=None, **detail):
    return {"id": i, "type": type_, "generation": gen, "worker_id": None, "detail": detail}


def clean() -> Observed:
    """Two tasks: a side effect reclaimed before its intent, then completed by generation 2;
    an idempotent write completed first time."""
    history = [
        rec(0.0, "enqueue", proc="harness", task=1), rec(0.0, "enqueue", proc="harness", task=2),
        rec(1.0, "claim", task=1, gen=1), rec(1.1, "claim", task=2, gen=1),
        rec(1.5, "renew", task=1, gen=1, t0=1.4),
        rec(3.0, "claim", proc="w1.1", task=1, gen=2),
        rec(3.5, "renew", "refused", task=1, gen=1, t0=3.4),
        rec(4.0, "complete", proc="w1.1", task=1, gen=2, t0=3.9),
        rec(4.1, "complete", task=2, gen=1, t0=4.0),
        rec(4.2, "probe.complete", "refused", proc="harness", task=3, gen=1),
    ]
    tasks = [
        {"id": 1, "status": "completed", "claim_generation": 2, "effect": "side_effect",
         "result": {"task": 1, "generation": 2}},
        {"id": 2, "status": "completed", "claim_generation": 1, "effect": "idempotent",
         "result": {"task": 2, "generation": 1}},
    ]
    events = {
        1: [ev(1, "enqueued"), ev(2, "claimed", 1), ev(3, "lease_expired", 1, routed_to="queued", open_intents=0),
            ev(4, "claimed", 2), ev(5, "effect_intent", 2, effect_id=9), ev(6, "effect_response", 2, effect_id=9),
            ev(7, "completed", 2)],
        2: [ev(8, "enqueued"), ev(9, "claimed", 1), ev(10, "completed", 1)],
    }
    effects = {1: [{"status": "done"}], 2: []}
    ledger = [{"id": 1, "resource": "task:1", "idempotency_key": "k1", "token": 2, "task_id": 1},
              {"id": 2, "resource": "task:2", "idempotency_key": "k2", "token": 1, "task_id": 2}]
    return Observed(history=history, tasks=tasks, events=events, effects=effects, ledger=ledger,
                    fence_tokens={"task:1": 2, "task:2": 1})


def found(obs: Observed) -> set[str]:
    return {v["invariant"] for v in check(obs).violations}


def test_a_clean_history_passes_and_is_counted():
    report = check(clean())
    assert report.ok, report.violations
    assert report.by_invariant() == {name: 0 for name in INVARIANTS}
    assert report.counts["tasks enqueued"] == 2 and report.counts["completions"] == 2
    assert report.counts["stale writes refused by the queue"] == 1
    assert report.counts["probe stale writes refused"] == 1
    assert report.statuses == {"completed": 2}


@pytest.mark.parametrize("status", ["queued", "running"])
def test_a_task_left_unfinished_is_lost(status):
    obs = clean()
    obs.tasks[1]["status"] = status
    assert found(obs) == {"no_task_lost"}


def test_an_enqueued_task_missing_from_the_database_is_lost():
    obs = clean()
    obs.history.append(rec(0.1, "enqueue", proc="harness", task=77))
    assert found(obs) == {"no_task_lost"}


def test_two_completing_generations():
    obs = clean()
    obs.history.append(rec(4.5, "complete", task=1, gen=1, t0=2.0))
    assert "single_completion" in found(obs)


def test_a_result_from_another_generation():
    obs = clean()
    obs.tasks[0]["result"] = {"task": 1, "generation": 1}
    assert found(obs) == {"single_completion"}


def test_completed_by_a_generation_that_no_longer_held_the_task():
    obs = clean()
    obs.events[1][-1]["generation"] = 1
    obs.tasks[0]["result"] = {"task": 1, "generation": 1}
    assert "single_completion" in found(obs)


@pytest.mark.parametrize("op", ["renew", "begin_effect", "finish_effect", "fail", "release"])
def test_a_write_accepted_after_a_newer_claim(op):
    obs = clean()
    obs.history.append(rec(3.6, op, task=1, gen=1, t0=3.2))
    assert found(obs) == {"stale_write_refused"}


def test_a_write_sent_before_the_newer_claim_is_not_blamed():
    obs = clean()
    obs.history.append(rec(3.6, "begin_effect", task=1, gen=1, t0=2.9))  # overlapping, not after
    assert found(obs) == set()


def test_an_accepted_probe_write():
    obs = clean()
    obs.history.append(rec(5.0, "probe.complete", "ok", proc="harness", task=3, gen=1))
    assert found(obs) == {"stale_write_refused"}


def test_a_downstream_action_applied_twice():
    obs = clean()
    obs.ledger.append({"id": 3, "resource": "task:2", "idempotency_key": "k2", "token": 1, "task_id": 2})
    assert found(obs) == {"downstream_once"}


def test_an_older_token_accepted_downstream():
    obs = clean()
    obs.ledger.append({"id": 3, "resource": "task:1", "idempotency_key": "k1b", "token": 1, "task_id": 1})
    assert found(obs) == {"downstream_fenced"}


def test_a_fence_that_forgot_the_newest_token():
    obs = clean()
    obs.fence_tokens["task:1"] = 1
    assert found(obs) == {"downstream_fenced"}


def test_reconciliation_without_an_open_intent():
    obs = clean()
    obs.tasks[0]["status"] = "needs_reconciliation"
    assert found(obs) == {"reconciliation_evidence"}
    obs.effects[1] = [{"status": "pending"}]
    assert found(obs) == set()


@pytest.mark.parametrize("how", [("lease_expired", "routed_to"), ("lease_released", "routed_to"),
                                 ("failed", "next_status")])
def test_a_side_effect_requeued_with_its_intent_open(how):
    obs = clean()
    type_, field = how
    obs.events[1] = [ev(1, "enqueued"), ev(2, "claimed", 1), ev(3, "effect_intent", 1, effect_id=9),
                     ev(4, type_, 1, **{field: "queued"}), ev(5, "claimed", 2), ev(6, "completed", 2)]
    # the lease model, replaying the trail, refuses the routing to the queue as well
    assert found(obs) == {"reconciliation_evidence", "model_trace"}
    responded = copy.deepcopy(obs)
    responded.events[1].insert(3, ev(35, "effect_response", 1, effect_id=9))
    assert found(responded) == set()


def test_completed_after_cancellation():
    obs = clean()
    obs.events[2] = [ev(8, "enqueued"), ev(9, "claimed", 1), ev(10, "cancelled", 1), ev(11, "completed", 1)]
    assert "cancel_final" in found(obs)


def test_a_write_accepted_after_the_operator_cancelled():
    obs = clean()
    obs.history.append(rec(3.95, "cancel", proc="harness", task=2, t0=3.9))
    assert found(obs) == {"stale_write_refused"}


def test_a_cancelled_task_that_did_not_stay_cancelled():
    obs = clean()
    obs.events[2] = [ev(8, "enqueued"), ev(10, "cancelled", None)]
    obs.tasks[1]["status"] = "dead"
    assert found(obs) == {"cancel_final"}


# -- no_attempt_charged: a handler that returned is never charged an attempt ------------------------------


def returned_then_retried() -> Observed:
    """Task 2's handler returned under generation 1 (w0.1), its completion never landed (the worker's
    connections were dropped), and the task was claimed again and completed by generation 2."""
    obs = clean()
    obs.history = [r for r in obs.history if not (r["op"] == "complete" and r["task"] == 2)]
    obs.history += [rec(3.8, "returned", task=2, gen=1, wall=1000.0),
                    rec(3.85, "fault", proc="harness", fault="terminate", slot=0),
                    rec(3.9, "complete", "unknown", task=2, gen=1, t0=3.85),
                    rec(6.0, "claim", proc="w1.1", task=2, gen=2),
                    rec(6.2, "returned", proc="w1.1", task=2, gen=2, wall=1002.4),
                    rec(6.3, "complete", proc="w1.1", task=2, gen=2, t0=6.25)]
    obs.history.sort(key=lambda r: r["t"])
    obs.tasks[1].update(claim_generation=2, result={"task": 2, "generation": 2})
    obs.events[2] = [ev(8, "enqueued"), ev(9, "claimed", 1),
                     ev(10, "lease_expired", 1, routed_to="queued", lease_expires_at="1970-01-01T00:16:41+00:00"),
                     ev(11, "claimed", 2), ev(12, "completed", 2)]
    return obs


def test_a_returned_handler_that_was_run_again_is_flagged_with_the_fault_around_it():
    report = check(returned_then_retried())
    assert {v["invariant"] for v in report.violations} == {"no_attempt_charged"}
    [v] = report.violations
    assert v["task"] == 2 and "returned under generation 1" in v["detail"] and "terminate" in v["detail"]
    assert report.counts["attempts consumed by infrastructure faults"] == 1
    assert report.counts["charged near terminate"] == 1
    assert "terminate +0.05s" in v["detail"]
    assert report.counts["handlers returned"] == 2


def test_a_returned_handler_recorded_as_a_failure_is_flagged():
    obs = clean()
    obs.history += [rec(3.8, "returned", task=2, gen=1, wall=1000.0), rec(3.9, "fail", task=2, gen=1, t0=3.85)]
    obs.history = [r for r in obs.history if not (r["op"] == "complete" and r["task"] == 2)]
    obs.history.sort(key=lambda r: r["t"])
    obs.tasks[1].update(status="dead", result=None)
    obs.events[2] = [ev(8, "enqueued"), ev(9, "claimed", 1), ev(10, "failed", 1, next_status="dead"),
                     ev(11, "dead", 1)]
    assert found(obs) == {"no_attempt_charged"}


def test_returned_handlers_that_completed_are_not_charged():
    obs = clean()
    obs.history += [rec(3.95, "returned", proc="w1.1", task=1, gen=2), rec(4.05, "returned", task=2, gen=1)]
    obs.history.sort(key=lambda r: r["t"])
    report = check(obs)
    assert report.ok and report.counts["handlers returned"] == 2
    assert report.counts["attempts consumed by infrastructure faults"] == 0


@pytest.mark.parametrize("fault", [{"fault": "kill", "slot": 0}, {"fault": "stop", "slot": 0, "seconds": 3},
                                   {"fault": "partition", "mode": "blackhole", "slot": 0}, {"fault": "restart"},
                                   {"fault": "service"}])
def test_a_fault_that_outlasts_the_lease_may_cost_the_returned_attempt(fault):
    obs = returned_then_retried()
    obs.history.append(rec(3.87, "fault", proc="harness", **fault))
    obs.history.sort(key=lambda r: r["t"])
    report = check(obs)
    assert report.ok, report.violations
    assert report.counts["returned attempts lost to a fault that outlasted the lease"] == 1


@pytest.mark.parametrize("fault", [{"fault": "kill", "slot": 1}, {"fault": "partition", "mode": "drop", "slot": 0},
                                   {"fault": "drop_queue"}, {"fault": "drop_ledger"}, {"fault": "skew", "slot": 0}])
def test_faults_a_worker_recovers_from_excuse_nothing(fault):
    """Another worker's kill, a one-off dropped connection, a graceful stop: the success must survive."""
    obs = returned_then_retried()
    obs.history.append(rec(3.87, "fault", proc="harness", **fault))
    obs.history.sort(key=lambda r: r["t"])
    assert found(obs) == {"no_attempt_charged"}


def test_a_lease_already_lost_when_the_handler_returned_is_not_charged():
    obs = returned_then_retried()
    obs.history.append(rec(3.7, "renew", "refused", task=2, gen=1, t0=3.6))
    obs.history.sort(key=lambda r: r["t"])
    assert check(obs).ok
    by_clock = returned_then_retried()  # the deadline (database time) passed before the return
    by_clock.events[2][2]["detail"]["lease_expires_at"] = "1970-01-01T00:16:39+00:00"
    assert check(by_clock).ok


def test_a_release_begun_before_the_return_is_not_charged_one_begun_after_is():
    """A graceful stop whose grace ran out: the worker began releasing the lease
    (and stopped the attempt) just before a thread handler returned anyway."""
    def given_back(t0: float) -> Observed:
        obs = returned_then_retried()
        obs.history = [r for r in obs.history if r["op"] != "complete" or r.get("gen") != 1]
        obs.history.append(rec(3.95, "release", task=2, gen=1, t0=t0, next_status="queued"))
        obs.history.sort(key=lambda r: r["t"])
        obs.events[2][2] = ev(10, "lease_released", 1, routed_to="queued",
                              reason="worker shut down before the task finished")
        return obs

    report = check(given_back(t0=3.79))
    assert report.ok, report.violations
    assert report.counts["returned attempts whose lease had ended before the return"] == 1
    assert found(given_back(t0=3.81)) == {"no_attempt_charged"}


def test_a_revoked_or_cancelled_attempt_is_not_charged():
    obs = returned_then_retried()
    obs.events[2][2:3] = [ev(10, "lease_revoked", 1, reason="worker revoked"),
                          ev(11, "lease_expired", 1, routed_to="queued")]
    for e in obs.events[2][1:]:  # whose: the revoked worker held generation 1, another claimed generation 2
        e["worker_id"] = "w0" if e["generation"] == 1 else "w1"
    assert check(obs).ok, check(obs).violations
    assert check(obs).counts["returned attempts ended by an operator (cancel, revoke)"] == 1


def test_a_success_recorded_until_the_lease_ran_out_is_a_loss_not_a_charge():
    """The completer kept retrying through the dropped connections until the deadline (+1 s after the
    return): the lease ran out while the queue was out of reach, which the recovery policy routes."""
    obs = returned_then_retried()
    obs.history.append(rec(5.0, "complete", "refused", task=2, gen=1, t0=4.6))
    obs.history.sort(key=lambda r: r["t"])
    report = check(obs)
    assert report.ok, report.violations
    assert report.counts["returned attempts whose lease ran out while recording through a fault"] == 1
    # giving up early is not keeping on: the same history with only the first, early attempt is flagged
    assert found(returned_then_retried()) == {"no_attempt_charged"}
    # and a failure recorded for a returned handler is never excused, however long the worker tried
    failed = copy.deepcopy(obs)
    failed.history.append(rec(5.1, "fail", task=2, gen=1, t0=5.05))
    assert found(failed) == {"no_attempt_charged"}


@pytest.mark.parametrize("op", ["claim", "renew", "begin_effect", "complete"])
def test_a_call_of_a_revoked_worker_accepted_after_the_revocation(op):
    obs = clean()
    obs.history.append(rec(2.0, "fault", proc="harness", fault="revoke", slot=0, worker="wA"))
    obs.history.append(rec(2.3, op, task=2, gen=1, worker="wA", t0=2.1))
    obs.history.sort(key=lambda r: r["t"])
    assert found(obs) == {"stale_write_refused"}
    overlapping = clean()  # started before revoke_worker() returned: either order is possible
    overlapping.history += [rec(2.0, "fault", proc="harness", fault="revoke", slot=0, worker="wA"),
                            rec(2.3, op, task=2, gen=1, worker="wA", t0=1.9)]
    overlapping.history.sort(key=lambda r: r["t"])
    assert found(overlapping) == set()
