"""Asking a person (ctx.ask) on every transport (sync, async, HTTP) and both backends: the
question is recorded with its schema and the attempt ends; an answer is checked against the
schema before it is taken, and taken once; the next attempt resumes with it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

import leaseq
from leaseq import auth
from leaseq.core.errors import Suspended
from leaseq.worker.context import TaskContext

from .support import snapshot as _snapshot
from .test_transports import TRANSPORTS, AsyncTransport

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})
DECISION = {"type": "object", "properties": {"approve": {"type": "boolean"}, "amount": {"type": "integer",
                                                                                        "minimum": 1}},
            "required": ["approve"], "additionalProperties": False}


def snapshot(dsn: str) -> dict[str, Any]:
    """Every table but the tokens' (whose last use the HTTP calls record)."""
    return {name: rows for name, rows in _snapshot(dsn).items() if name != "leaseq_tokens"}


@contextlib.contextmanager
def _sides(kind: str, q: leaseq.Queue) -> Iterator[tuple[Any, Any]]:
    """(the worker's transport, the person's queue): both ``q`` itself, an AsyncQueue, or RemoteQueues
    on one real server with a worker token and an operator token."""
    if kind == "sync":
        yield q, q
    elif kind == "async":
        t = AsyncTransport(q)
        try:
            yield t, t
        finally:
            t.close()
    else:
        pytest.importorskip("uvicorn")
        from leaseq.client import RemoteQueue
        from service.conftest import serve

        with serve(q) as (url, _app):
            worker, _ = auth.create_token(q, name="asks-worker", role="worker", created_by="test", all_queues=True)
            operator, _ = auth.create_token(q, name="asks-operator", role="operator", created_by="test")
            with RemoteQueue(url, worker, timeout=10) as w, RemoteQueue(url, operator, timeout=10) as o:
                yield w, o


@pytest.fixture(params=TRANSPORTS)
def sides(request: pytest.FixtureRequest, q: leaseq.Queue) -> Iterator[tuple[Any, Any]]:
    with _sides(request.param, q) as pair:
        yield pair


def _attempt(t: Any, w: leaseq.Worker, timeout: float = 10.0) -> TaskContext:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        claims = t.claim(w)
        if claims:
            return TaskContext(t, w, claims[0], LOG)
        time.sleep(0.05)
    raise AssertionError("nothing became claimable")


def _asked(t: Any, w: leaseq.Worker, question: str = "Refund order 7?", **options: Any) -> TaskContext:
    ctx = _attempt(t, w)
    with pytest.raises(Suspended) as ended:
        ctx.ask(question, DECISION, **options)
    assert ended.value.waiting_for == "an answer to its question" and ctx.lost
    return ctx


def test_ask_then_answer_resumes_with_the_answer(q: leaseq.Queue, sides: tuple[Any, Any]) -> None:
    t, person = sides
    w = t.register_worker("a")
    task = q.enqueue("agent", {"order": 7}, idempotency_key="refund-7", max_attempts=1)
    _asked(t, w)
    waiting = q.get(task.id)
    assert (waiting.status, waiting.lease_owner, waiting.attempts, waiting.wait_signal) == \
        ("waiting", None, 0, "leaseq.answer")  # no lease, the attempt given back
    assert t.claim(w) == []  # nothing to do until a person answers
    [open_] = person.asks()
    assert (open_["task_id"], open_["question"], open_["schema"], open_["key"]) == \
        (task.id, "Refund order 7?", DECISION, "refund-7:ask:0")
    assert open_["deadline_at"] is None
    answered = person.answer(task.id, {"approve": True, "amount": 5})
    assert answered["woke"] is True and answered["key"] == "refund-7:ask:0"
    assert q.get(task.id).status == "queued" and person.asks() == []
    again = _attempt(t, w)
    assert again.ask("Refund order 7?", DECISION) == {"approve": True, "amount": 5}
    t.complete(w, again.claim, "refunded")
    done = q.get(task.id)
    assert (done.status, done.attempts) == ("completed", 1)
    events = q.events(task.id)
    [suspended] = [e for e in events if e.type == "suspended"]
    assert (suspended.detail["waiting_for"], suspended.detail["question"]) == ("answer", "Refund order 7?")
    [by] = [e.detail["by"] for e in events if e.type == "answered"]
    assert by == answered["answered_by"]
    if hasattr(person, "url"):  # over HTTP: the operator token's principal
        assert by.startswith("asks-operator")
    [received] = [e for e in events if e.type == "signal_received"]
    assert received.detail["sent_by"] == by and received.detail["key"] == "refund-7:ask:0"
    assert [(fx.idempotency_key, fx.action) for fx in q.effects(task.id)] == \
        [("refund-7:ask:0:wait", "leaseq.ask"), ("refund-7:ask:0", "leaseq.ask")]


def test_an_answer_that_does_not_fit_is_refused_and_changes_nothing(q: leaseq.Queue, dsn: str,
                                                                     sides: tuple[Any, Any]) -> None:
    t, person = sides
    w = t.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="refund-8")
    _asked(t, w)
    before = snapshot(dsn)
    for bad, field in (({"approve": "yes"}, "answer.approve"), ({"approve": True, "amount": 0}, "answer.amount"),
                       ({}, "answer.approve"), ({"approve": True, "why": "x"}, "answer.why"), ("yes", "answer")):
        with pytest.raises(leaseq.InvalidInput) as info:
            person.answer(task.id, bad)
        assert info.value.field == field, (bad, info.value)
        assert "the question wants approve: boolean, amount?: integer" in str(info.value)
    assert snapshot(dsn) == before  # nothing written, the task still waits
    assert q.get(task.id).status == "waiting" and len(person.asks()) == 1
    person.answer(task.id, {"approve": False})
    again = _attempt(t, w)
    assert again.ask("Refund order 7?", DECISION) == {"approve": False}


def test_an_answer_is_taken_once(q: leaseq.Queue, dsn: str, sides: tuple[Any, Any]) -> None:
    t, person = sides
    w = t.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="refund-9")
    _asked(t, w)
    person.answer(task.id, {"approve": True})
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidTransition, match="answered already"):
        person.answer(task.id, {"approve": False})
    assert snapshot(dsn) == before
    again = _attempt(t, w)
    assert again.ask("Refund order 7?", DECISION) == {"approve": True}
    with pytest.raises(leaseq.InvalidTransition, match="answered already"):  # consumed, still once
        person.answer(task.id, {"approve": False})
    t.fail(w, again.claim, "crashed after the answer", delay=0)
    third = _attempt(t, w)
    assert third.ask("Refund order 7?", DECISION) == {"approve": True}  # replayed from the ledger
    with pytest.raises(Suspended):  # a second question waits for an answer of its own
        third.ask("And the receipt?", None)
    person.answer(task.id, "send it")
    fourth = _attempt(t, w)
    assert fourth.ask("Refund order 7?", DECISION) == {"approve": True}
    assert fourth.ask("And the receipt?", None) == "send it"
    t.complete(w, fourth.claim, None)
    assert [s["payload"] for s in q.signals(task.id)] == [{"approve": True}, "send it"]
    assert [e.type for e in q.events(task.id)].count("answered") == 2
    with pytest.raises(leaseq.InvalidTransition, match="completed"):
        person.answer(task.id, "late")


def test_a_deadline_passes_without_an_answer(q: leaseq.Queue, sides: tuple[Any, Any]) -> None:
    t, person = sides
    w = t.register_worker("a")
    denied = q.enqueue("agent", {}, idempotency_key="ask-late")
    defaulted = q.enqueue("agent", {}, idempotency_key="ask-default")
    for _ in range(2):
        _asked(t, w, timeout=0.4)
    assert {a["task_id"] for a in person.asks()} == {denied.id, defaulted.id}
    assert all(a["deadline_at"] is not None for a in person.asks())
    deadline = time.monotonic() + 10
    while person.asks():  # the deadline is the database's: it passes there
        assert time.monotonic() < deadline, "the deadline did not pass"
        time.sleep(0.05)
    with pytest.raises(leaseq.InvalidTransition, match="ran out"):
        person.answer(denied.id, {"approve": True})
    seen = {}
    for _ in range(2):
        ctx = _attempt(t, w)
        if ctx.task_id == denied.id:
            with pytest.raises(leaseq.WaitTimedOut, match="no answer to the question"):
                ctx.ask("Refund order 7?", DECISION, timeout=0.4)
            t.fail(w, ctx.claim, "no answer", retry=False)
        else:
            seen["default"] = ctx.ask("Refund order 7?", DECISION, timeout=0.4, default={"approve": False})
            t.complete(w, ctx.claim, seen["default"])
    assert seen["default"] == {"approve": False} and q.get(defaulted.id).result == {"approve": False}
    assert q.get(denied.id).status == "dead"
    assert "wait_timed_out" in [e.type for e in q.events(denied.id)]


def test_an_async_handler_awaits_the_answer_as_a_pydantic_model(q: leaseq.Queue, sides: tuple[Any, Any]) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Decision(pydantic.BaseModel):
        approve: bool
        note: str = ""

    t, person = sides
    w = t.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="ask-async")

    async def handler(ctx: TaskContext) -> Any:
        return await ctx.ask("Go ahead?", schema=Decision)

    ctx = _attempt(t, w)
    ctx.handler_is_async = True
    with pytest.raises(Suspended):
        asyncio.run(handler(ctx))
    [asked] = person.asks()
    assert asked["schema"] == Decision.model_json_schema()
    with pytest.raises(leaseq.InvalidInput) as info:
        person.answer(task.id, {"approve": "sure"})
    assert info.value.field == "answer.approve"
    person.answer(task.id, {"approve": True, "note": "ok"})
    again = _attempt(t, w)
    again.handler_is_async = True
    got = asyncio.run(handler(again))
    assert isinstance(got, Decision) and got == Decision(approve=True, note="ok")


def test_the_answer_signal_is_reserved_and_bad_asks_name_their_field(q: leaseq.Queue,
                                                                     sides: tuple[Any, Any]) -> None:
    t, person = sides
    w = t.register_worker("a")
    task = q.enqueue("agent", {}, idempotency_key="ask-bad")
    ctx = _attempt(t, w)
    with pytest.raises(leaseq.InvalidInput) as info:
        q.signal(task.id, "leaseq.answer", {"approve": True})  # no way around the schema
    assert info.value.field == "name" and "reserved" in str(info.value)
    with pytest.raises(leaseq.InvalidInput):
        ctx.wait_for_signal("leaseq.answer")
    with pytest.raises(leaseq.InvalidInput) as info:
        ctx.ask("Which?", {"type": "object", "propertyNames": {"maxLength": 2}})
    assert info.value.field == "schema.propertyNames"
    with pytest.raises(leaseq.InvalidInput) as info:
        ctx.ask("", DECISION)
    assert info.value.field == "question"
    with pytest.raises(leaseq.InvalidInput) as info:  # what a handler sends, checked by the queue too
        t.wait_signal(w, ctx.claim, "k", "leaseq.answer", ask={"question": "x", "schema": {"type": "text"}})
    assert info.value.field == "schema.type"
    with pytest.raises(leaseq.InvalidTransition, match="asked no question"):
        person.answer(task.id, {"approve": True})
    with pytest.raises(leaseq.NotFound):
        person.answer(10**9, {"approve": True})
