"""A pydantic-ai agent that waits for a person's answer (ctx.ask inside a tool), its worker
SIGKILLed while the task waits.

The agent looks the order up, asks the manager, and refunds only if the manager approves
(``tests/fault/ask_agent_app.py``). The question ends the run: the task waits holding no
lease, and the worker is killed meanwhile. A person answers (a bad answer is refused,
naming the field); another worker process resumes the run from the ledger: the model
requests and the lookup before the question are replayed, not made again, the answer
comes back as the pydantic model, and the refund is made once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import leaseq
from leaseq_chaos.traces import validate_queue

from .support import AppWorkers, wait_for
from .test_durable_waits import _kill

LEASE = 2.0

pytest.importorskip("pydantic_ai")


Workers = AppWorkers


@pytest.fixture
def queue(dsn: str) -> Iterator[leaseq.Queue]:
    q = leaseq.connect(dsn)
    q.migrate()
    yield q
    q.close()


@pytest.fixture
def workers(dsn: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers("ask_agent_app", dsn, tmp_path)
    yield w
    w.close()


def test_an_agent_waiting_for_a_person_survives_a_sigkill_and_resumes_with_the_answer(
        queue: leaseq.Queue, workers: Workers) -> None:
    task = queue.enqueue("support.refund", {}, effect="side_effect", idempotency_key="refund-7",
                         lease_seconds=LEASE)
    first = workers.start("first")
    wait_for(lambda: queue.get(task.id).status == "waiting" or first.poll() is not None, 60,
             "the agent asked the manager")
    assert first.poll() is None, workers.log("first")
    waiting = queue.get(task.id)
    assert waiting.lease_owner is None and waiting.attempts == 0  # no lease, the attempt given back
    # the ledger so far: two model requests, the lookup, the question (the ask tool's call left open)
    assert [(e.action, e.status) for e in queue.effects(task.id)] == [
        ("llm.request", "done"), ("lookup_order", "done"), ("llm.request", "done"), ("ask_manager", "pending"),
        ("leaseq.ask", "done")]
    _kill(first)  # while the task waits for the answer
    [asked] = queue.asks()
    assert asked["question"] == "Refund the 5 paid on order 7?"
    assert asked["schema"]["required"] == ["approve", "amount"]
    with pytest.raises(leaseq.InvalidInput) as refused:
        queue.answer(task.id, {"approve": True, "amount": "five"}, by="manager")
    assert refused.value.field == "answer.amount" and queue.get(task.id).status == "waiting"
    queue.answer(task.id, {"approve": True, "amount": 5, "note": "loyal customer"}, by="manager")
    workers.start("second")
    wait_for(lambda: queue.get(task.id).status == "completed", 90, "the agent finished")
    done = queue.get(task.id)
    assert done.result == "refunded 5: loyal customer"
    assert workers.count("refund", task.id) == 1 and workers.count("lookup_order", task.id) == 1
    assert workers.count("asked", task.id) == 2 and workers.count("approval", task.id) == 1
    # the two model requests before the question were replayed; two more after the answer
    assert workers.count("model", task.id) == 4
    trail = queue.events(task.id)
    replayed = [e.detail["action"] for e in trail if e.type == "tool_replayed"]
    assert replayed == ["llm.request", "lookup_order", "llm.request"], replayed
    assert "lease_expired" not in [e.type for e in trail]  # the killed worker held nothing
    assert [e.detail["by"] for e in trail if e.type == "answered"] == ["manager"]
    assert validate_queue(queue) == []
