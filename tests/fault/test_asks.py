"""Asking a person (ctx.ask) in real worker processes killed with SIGKILL.

Killed while its task waits for an answer, the worker loses nothing: the waiting task
holds no lease, a person answers meanwhile (a bad answer refused, the task still waiting),
and another process resumes it with the answer, repeating no step before the question.
Killed after the answer was consumed and before the next step, the next attempt replays
the answer from the ledger, consumes no other, and makes the next step once.
"""

from __future__ import annotations

import pytest

import leaseq
from leaseq_chaos.traces import validate_queue

from .support import wait_for
from .test_durable_waits import LEASE, Workers, _kill, queue, workers  # noqa: F401  (fixtures)


def test_killed_while_its_task_waits_for_an_answer_another_worker_resumes_it(queue: leaseq.Queue,  # noqa: F811
                                                                             workers: Workers) -> None:  # noqa: F811
    task = queue.enqueue("expense", {"amount": 480}, effect="side_effect", idempotency_key="expense-1",
                         lease_seconds=LEASE)
    first = workers.start("first")
    wait_for(lambda: queue.get(task.id).status == "waiting" or first.poll() is not None, 60, "the question was asked")
    assert first.poll() is None, workers.log("first")
    assert queue.get(task.id).lease_owner is None
    _kill(first)  # while the task waits for its answer
    [asked] = queue.asks()
    assert asked["question"] == "Pay an expense of 480 (budget 1000)?" and asked["key"] == "expense-1:ask:0"
    with pytest.raises(leaseq.InvalidInput) as refused:
        queue.answer(task.id, {"approve": "yes"}, by="ann")
    assert refused.value.field == "answer.approve" and queue.get(task.id).status == "waiting"
    queue.answer(task.id, {"approve": True, "note": "within budget"}, by="ann")
    workers.start("second")
    wait_for(lambda: queue.get(task.id).status == "completed", 60, "the task completed")
    done = queue.get(task.id)
    assert done.result == {"approve": True, "note": "within budget", "paid": 480}
    assert workers.count("looked_up", task.id) == 1  # before the question: replayed, not repeated
    assert workers.count("asking", task.id) == 2 and workers.count("answered", task.id) == 1
    assert workers.count("paid", task.id) == 1
    events = queue.events(task.id)
    assert "lease_expired" not in [e.type for e in events]  # no lease was left to expire
    assert [e.detail["by"] for e in events if e.type == "answered"] == ["ann"]
    assert done.claim_generation == 2 and done.attempts == 1
    assert validate_queue(queue) == []


def test_killed_after_the_answer_was_consumed_the_next_attempt_repeats_nothing(queue: leaseq.Queue,  # noqa: F811
                                                                               workers: Workers,  # noqa: F811
                                                                               tmp_path) -> None:
    task = queue.enqueue("expense", {"amount": 90}, effect="side_effect", idempotency_key="expense-2",
                         lease_seconds=LEASE, max_attempts=3)
    first = workers.start("first", HOLD_AFTER_ANSWER="1")
    wait_for(lambda: queue.get(task.id).status == "waiting" or first.poll() is not None, 60, "the question was asked")
    queue.answer(task.id, {"approve": True}, by="ann")
    wait_for(lambda: (tmp_path / f"held-{task.id}").exists() or first.poll() is not None, 60,
             "the answer was consumed")
    assert first.poll() is None, workers.log("first")
    _kill(first)  # between the answer's consumption and the payment
    [answer] = queue.signals(task.id)
    held = answer["consumed_generation"]
    assert answer["consumed_key"] == "expense-2:ask:0" and answer["name"] == "leaseq.answer"
    workers.start("second")
    wait_for(lambda: queue.get(task.id).status == "completed", 60, "the task completed")
    done = queue.get(task.id)
    assert done.result == {"approve": True, "note": "", "paid": 90}
    assert workers.count("paid", task.id) == 1 and workers.count("looked_up", task.id) == 1
    assert workers.count("answered", task.id) == 2  # the second attempt replayed the answer from the ledger
    [answer] = queue.signals(task.id)
    assert answer["consumed_generation"] == held  # consumed once, by the killed attempt
    events = queue.events(task.id)
    assert [e.type for e in events].count("signal_received") == 1 and "lease_expired" in [e.type for e in events]
    with pytest.raises(leaseq.InvalidTransition):
        queue.answer(task.id, {"approve": False}, by="bob")
    assert validate_queue(queue) == []
