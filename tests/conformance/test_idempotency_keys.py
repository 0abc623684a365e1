"""One idempotency rule for every enqueue, on both backends and every transport.

A key names one task in its queue. An enqueue whose key is taken returns
that task when it asks for the same kind, payload and options (a default
passed or left out alike; a later ``delay`` or the same relative deadline
asked for later alike), and is refused with
:class:`leaseq.IdempotencyKeyConflict` otherwise: the error names each field
that differs and the existing task, and no table changes. The producers are
the sync :class:`leaseq.Queue`, the :class:`leaseq.AsyncQueue` and the HTTP
service (:class:`leaseq.client.RemoteQueue` against a real server); the
typed enqueue of an :class:`leaseq.App`, ``enqueue_many`` and intents go
through the same rule. The CLI's rendering is in
tests/acceptance/test_cli_daily_use.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import leaseq

from .support import snapshot
from .test_transports import over

PRODUCERS = ["sync", "async", "http"]
#: Tables a served request may write without enqueueing anything (the token's record of use).
_NOT_TASKS = ("leaseq_tokens", "leaseq_leader")


@pytest.fixture(params=PRODUCERS)
def producer(request: pytest.FixtureRequest, q: leaseq.Queue) -> Iterator[Any]:
    """Something that enqueues onto the test's queue ``q``: the queue itself, an AsyncQueue, or
    a RemoteQueue over HTTP (which sends a datetime or timedelta deadline as the API takes it)."""
    with over(request.param, q, "operator") as p:
        yield p


def tables(dsn: str) -> dict[str, Any]:
    """Every row of every table a refused enqueue must leave alone."""
    return {name: rows for name, rows in snapshot(dsn).items() if name not in _NOT_TASKS}


def refused(call: Any, dsn: str) -> leaseq.IdempotencyKeyConflict:
    """Run ``call``, which must be refused with IdempotencyKeyConflict and write nothing."""
    before = tables(dsn)
    with pytest.raises(leaseq.IdempotencyKeyConflict) as info:
        call()
    assert tables(dsn) == before, "a refused enqueue wrote something"
    return info.value


DEADLINE = datetime(2031, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)


def base_options(upstream: int) -> dict[str, Any]:
    """An enqueue that sets every compared option to something other than its default."""
    return dict(effect="idempotent", priority=3, max_attempts=4, lease_seconds=20.0, actions=["index", "notify"],
                timeout=60.0, deadline=DEADLINE, limits=["api"], units=2, after=[upstream],
                on_dependency_failure="block")


#: One difference per case: (case, the field named, changes to the base enqueue). A value of None
#: for a key the base sets, where the default is None, leaves the option out (its default).
DIFFERENCES: list[tuple[str, str, dict[str, Any]]] = [
    ("kind", "kind", {"kind": "send_welcome"}),
    ("payload", "payload", {"payload": {"doc_id": 3, "tags": ["a", "b"]}}),
    ("payload-order-of-list", "payload", {"payload": {"doc_id": 2, "tags": ["b", "a"]}}),
    ("payload-text-for-number", "payload", {"payload": {"doc_id": "2", "tags": ["a", "b"]}}),
    ("payload-key-added", "payload", {"payload": {"doc_id": 2, "tags": ["a", "b"], "flag": None}}),
    ("effect", "effect", {"effect": "side_effect"}),
    ("priority", "priority", {"priority": 4}),
    ("priority-default", "priority", {"priority": None}),
    ("max_attempts", "max_attempts", {"max_attempts": 5}),
    ("lease_seconds", "lease_seconds", {"lease_seconds": 21.0}),
    ("actions", "actions", {"actions": ["index"]}),
    ("actions-undeclared", "actions", {"actions": None}),
    ("timeout", "timeout", {"timeout": 61.0}),
    ("timeout-none", "timeout", {"timeout": None}),
    ("deadline", "deadline", {"deadline": DEADLINE + timedelta(seconds=1)}),
    ("deadline-none", "deadline", {"deadline": None}),
    ("limits", "limits", {"limits": ["api", "tokens"]}),
    ("limits-none", "limits", {"limits": None}),
    ("units", "units", {"units": 1}),
    ("after", "after", {"after": "other"}),
    ("after-none", "after", {"after": None, "on_dependency_failure": None}),
    ("on_dependency_failure", "on_dependency_failure", {"on_dependency_failure": "cancel"}),
]


def _enqueue(producer: Any, key: str, kind: str, payload: Any, options: dict[str, Any]) -> leaseq.Task:
    return producer.enqueue(kind, payload, idempotency_key=key,
                            **{k: v for k, v in options.items() if v is not None})


def test_the_same_enqueue_returns_the_existing_task(q: leaseq.Queue, dsn: str, producer: Any) -> None:
    upstream = q.enqueue("fetch", {"doc_id": 2})
    options = base_options(upstream.id)
    first = _enqueue(producer, "doc-2", "summarize", {"doc_id": 2, "tags": ["a", "b"], "n": 1.5}, options)
    before = tables(dsn)
    # the same enqueue, with its payload's keys in another order, the lists of names in another
    # order and with a repeat, numbers spelled otherwise, and a delay: the same task, nothing written
    again = _enqueue(producer, "doc-2", "summarize", {"n": 1.50, "tags": ["a", "b"], "doc_id": 2.0},
                     {**options, "actions": ["notify", "index", "index"], "limits": ["api", "api"], "delay": 30})
    assert again.id == first.id and again.payload == first.payload and again.available_at == first.available_at
    assert tables(dsn) == before
    # every default passed or left out is the same enqueue
    plain = producer.enqueue("mail", None, idempotency_key="plain")
    explicit = producer.enqueue("mail", None, idempotency_key="plain", effect="read_only", queue="default",
                                priority=0, max_attempts=5, lease_seconds=30.0, actions=None, timeout=None,
                                deadline=None, limits=None, units=1, on_dependency_failure="cancel")
    assert explicit.id == plain.id
    assert [t.id for t in q.list_tasks()] == [plain.id, first.id, upstream.id]
    # and the same, but for one number of the payload, is not
    err = refused(lambda: _enqueue(producer, "doc-2", "summarize", {"doc_id": 2, "tags": ["a", "b"], "n": 1.6},
                                   options), dsn)
    assert (err.fields, err.task_id) == (("payload",), first.id)


@pytest.mark.parametrize("case", DIFFERENCES, ids=[c[0] for c in DIFFERENCES])
def test_each_difference_is_refused_naming_the_field(q: leaseq.Queue, dsn: str, case: tuple[str, str, dict]) -> None:
    _, field, change = case
    upstream, other = q.enqueue("fetch", {"doc_id": 2}), q.enqueue("fetch", {"doc_id": 3})
    options = base_options(upstream.id)
    kind, payload = "summarize", {"doc_id": 2, "tags": ["a", "b"]}
    first = _enqueue(q, "doc-2", kind, payload, options)
    change = dict(change)
    kind = change.pop("kind", kind)
    payload = change.pop("payload", payload)
    if change.get("after") == "other":
        change["after"] = [other.id]
    err = refused(lambda: _enqueue(q, "doc-2", kind, payload, {**options, **change}), dsn)
    assert err.fields == (field,), str(err)
    assert (err.task_id, err.idempotency_key, err.queue) == (first.id, "doc-2", "default")
    assert f"task {first.id}" in str(err) and field in str(err)
    assert len(q.list_tasks()) == 3


def test_every_difference_is_refused_on_every_transport(q: leaseq.Queue, dsn: str, producer: Any) -> None:
    upstream, other = q.enqueue("fetch", {"doc_id": 2}), q.enqueue("fetch", {"doc_id": 3})
    options = base_options(upstream.id)
    first = _enqueue(producer, "doc-2", "summarize", {"doc_id": 2, "tags": ["a", "b"]}, options)
    for name, field, change in DIFFERENCES:
        change = dict(change)
        kind = change.pop("kind", "summarize")
        payload = change.pop("payload", {"doc_id": 2, "tags": ["a", "b"]})
        if change.get("after") == "other":
            change["after"] = [other.id]
        err = refused(lambda: _enqueue(producer, "doc-2", kind, payload, {**options, **change}), dsn)
        assert (err.fields, err.task_id, err.idempotency_key) == ((field,), first.id, "doc-2"), (name, str(err))
    # several at once: each is named, in the order of the enqueue's parameters
    err = refused(lambda: producer.enqueue("send_welcome", {"user_id": 99}, effect="side_effect",
                                           idempotency_key="doc-2"), dsn)
    assert err.fields == ("kind", "payload", "effect", "priority", "max_attempts", "lease_seconds", "actions",
                          "timeout", "deadline", "limits", "units", "after"), str(err)
    assert "its kind is 'summarize', not 'send_welcome'" in str(err)
    assert len(q.list_tasks()) == 3


def test_the_issue_case_a_reused_key_is_not_another_task(dsn: str, producer: Any) -> None:
    first = producer.enqueue("summarize", {"doc_id": 2}, idempotency_key="doc-2")
    err = refused(lambda: producer.enqueue("send_welcome", {"user_id": 99}, effect="side_effect",
                                           idempotency_key="doc-2"), dsn)
    assert err.fields == ("kind", "payload", "effect") and err.task_id == first.id
    assert err.differences["effect"] == "its effect is read_only, not side_effect"
    # another queue is another key space
    elsewhere = producer.enqueue("send_welcome", {"user_id": 99}, effect="side_effect", idempotency_key="doc-2",
                                 queue="mail")
    assert elsewhere.id != first.id


def test_a_gated_enqueue_does_not_return_an_ungated_task(q: leaseq.Queue, dsn: str, producer: Any) -> None:
    ungated = producer.enqueue("refund", {"order": 7}, effect="side_effect", idempotency_key="refund-7")
    err = refused(lambda: producer.enqueue("refund", {"order": 7}, effect="side_effect",
                                           idempotency_key="refund-7", approval="required"), dsn)
    assert (err.fields, err.task_id) == (("approval",), ungated.id)
    assert err.differences["approval"] == "its approval is none, not required"
    # and the other way round; a gated repeat with the same approval deadline is the same task
    gated = producer.enqueue("refund", {"order": 8}, effect="side_effect", idempotency_key="refund-8",
                             approval="required", approval_deadline=3600)
    assert gated.status == "awaiting_approval"
    err = refused(lambda: producer.enqueue("refund", {"order": 8}, effect="side_effect",
                                           idempotency_key="refund-8"), dsn)
    assert (err.fields, err.task_id) == (("approval",), gated.id)
    err = refused(lambda: producer.enqueue("refund", {"order": 8}, effect="side_effect", idempotency_key="refund-8",
                                           approval="required"), dsn)
    assert err.fields == ("approval_deadline",)
    time.sleep(0.2)
    again = producer.enqueue("refund", {"order": 8}, effect="side_effect", idempotency_key="refund-8",
                             approval="required", approval_deadline=3600)
    assert again.id == gated.id and q.approval(gated.id).decision is None
    # approved and run since, the task stays what the key names
    q.approve(gated.id, q.approval(gated.id).digest, by="ops")
    assert producer.enqueue("refund", {"order": 8}, effect="side_effect", idempotency_key="refund-8",
                            approval="required", approval_deadline=3600).status == "queued"
    assert refused(lambda: producer.enqueue("refund", {"order": 8}, effect="side_effect",
                                            idempotency_key="refund-8"), dsn).fields == ("approval",)


def test_a_relative_deadline_compares_by_its_length(q: leaseq.Queue, dsn: str, producer: Any) -> None:
    first = producer.enqueue("digest", {"team": 7}, idempotency_key="digest-7", deadline=timedelta(minutes=10))
    time.sleep(0.3)  # a repeat a moment later asks for the same length, not the same time
    assert producer.enqueue("digest", {"team": 7}, idempotency_key="digest-7",
                            deadline=timedelta(minutes=10), delay=5).id == first.id
    err = refused(lambda: producer.enqueue("digest", {"team": 7}, idempotency_key="digest-7",
                                           deadline=timedelta(minutes=20)), dsn)
    # (on PostgreSQL a task's created_at is the clock at its insert, its deadline is counted from
    # the transaction's start: a moment earlier)
    assert err.fields == ("deadline",)
    assert re.search(r"its deadline is (600|599\.\d+) s after its enqueue, not 1200 s after the enqueue", str(err))
    assert refused(lambda: producer.enqueue("digest", {"team": 7}, idempotency_key="digest-7",
                                            deadline=first.deadline_at + timedelta(hours=1)), dsn).fields == (
        "deadline",)
    assert refused(lambda: producer.enqueue("digest", {"team": 7}, idempotency_key="digest-7"),
                   dsn).fields == ("deadline",)


@pytest.mark.parametrize("producer", ["sync", "async"], indirect=True)
def test_enqueue_many_keeps_the_rule(q: leaseq.Queue, dsn: str, producer: Any) -> None:
    ids = producer.enqueue_many("index", [{"doc": 1}, {"doc": 2}], idempotency_keys=["doc-1", "doc-2"],
                                priority=2)
    before = tables(dsn)
    assert producer.enqueue_many("index", [{"doc": 2}, {"doc": 1}], idempotency_keys=["doc-2", "doc-1"],
                                 priority=2, delay=10) == ids[::-1]
    assert tables(dsn) == before
    # a new key beside a taken one whose payload differs: refused, the new task not written either
    err = refused(lambda: producer.enqueue_many("index", [{"doc": 3}, {"doc": 9}],
                                                idempotency_keys=["doc-3", "doc-2"], priority=2), dsn)
    assert (err.fields, err.task_id, err.idempotency_key) == (("payload",), ids[1], "doc-2")
    err = refused(lambda: producer.enqueue_many("index", [{"doc": 1}], idempotency_keys=["doc-1"]), dsn)
    assert err.fields == ("priority",)
    # a single enqueue meets the rule on a task enqueue_many wrote, and the other way round
    assert refused(lambda: producer.enqueue("index", {"doc": 1}, idempotency_key="doc-1"), dsn).fields == (
        "priority",)
    single = producer.enqueue("index", {"doc": 5}, idempotency_key="doc-5", approval="required")
    err = refused(lambda: producer.enqueue_many("index", [{"doc": 5}], idempotency_keys=["doc-5"]), dsn)
    assert (err.fields, err.task_id) == (("approval",), single.id)
    # one key given twice in a call names one task: the same payload twice is one task, two are refused
    assert len(set(producer.enqueue_many("index", [{"doc": 6}, {"doc": 6.0}], idempotency_keys=["d6", "d6"]))) == 1
    before = tables(dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        producer.enqueue_many("index", [{"doc": 7}, {"doc": 8}], idempotency_keys=["d7", "d7"])
    assert info.value.field == "idempotency_keys[1]" and tables(dsn) == before


def test_typed_enqueue_through_an_app_keeps_the_rule(q: leaseq.Queue, dsn: str) -> None:
    app = leaseq.App(queue=q, name="keys")

    @app.task("summarize")
    def summarize(ctx: Any, doc_id: int) -> int:
        return doc_id

    @app.task("send_welcome", effect="side_effect")
    def send_welcome(ctx: Any, user_id: int) -> int:
        return user_id

    first = summarize.options(key="doc-2").enqueue(doc_id=2)
    assert summarize.options(key="doc-2", delay=5).enqueue(doc_id=2).id == first.id
    err = refused(lambda: summarize.options(key="doc-2").enqueue(doc_id=3), dsn)
    assert (err.fields, err.task_id) == (("payload",), first.id)
    err = refused(lambda: summarize.options(key="doc-2", priority=9).enqueue(doc_id=2), dsn)
    assert err.fields == ("priority",)
    err = refused(lambda: send_welcome.options(key="doc-2").enqueue(user_id=99), dsn)
    assert err.fields == ("kind", "payload", "effect") and err.task_id == first.id
    assert len(q.list_tasks()) == 1


def test_an_intent_keeps_the_rule(q: leaseq.Queue, dsn: str) -> None:
    w = q.register_worker("agent")
    q.enqueue("agent.run", {"ticket": 1}, effect="idempotent")
    [claim] = q.claim(w)
    child = q.intend(w, claim, "refund", {"cents": 500}, key="refund-1", queue="payments", approval="required")
    # a retry that intends the same thing gets the same child, from the ledger
    assert q.intend(w, claim, "refund", {"cents": 500}, key="refund-1", queue="payments",
                    approval="required").id == child.id
    err = refused(lambda: q.intend(w, claim, "refund", {"cents": 900}, key="refund-1", queue="payments",
                                   approval="required"), dsn)
    assert (err.fields, err.task_id) == (("payload",), child.id)
    err = refused(lambda: q.intend(w, claim, "refund", {"cents": 500}, key="refund-1", queue="payments"), dsn)
    assert err.fields == ("approval",)
    err = refused(lambda: q.intend(w, claim, "refund", {"cents": 500}, key="refund-1", queue="other",
                                   approval="required"), dsn)
    assert err.fields == ("queue",)
    # an enqueue of the child's own key meets the same rule
    err = refused(lambda: q.enqueue("refund", {"cents": 900}, queue="payments", effect="side_effect",
                                    idempotency_key=child.idempotency_key, approval="required"), dsn)
    assert (err.fields, err.task_id) == (("payload",), child.id)


@pytest.mark.parametrize("a, b, same", [
    ({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}, True),
    ([1, 2.5, 1e300, 10**30], [1.0, 2.50, 10**300, 1e30], True),  # numbers as written in JSON, by value
    ([1, 2.5, 1e-7, 123456789012345678], [1.0, 2.50, 0.0000001, 123456789012345678], True),
    ({"n": -1.5e300}, {"n": -15 * 10**299}, True),  # how PostgreSQL's jsonb hands a large number back
    ([True, False, None], [1, 0, None], False),
    ([True], [True], True),
    ("2", 2, False),
    ([1, 2], [2, 1], False),
    ({"a": None}, {}, False),
    (None, None, True),
])
def test_payloads_compare_as_json_values(a: Any, b: Any, same: bool) -> None:
    from leaseq.engine.enqueue import same_json

    assert same_json(a, b) is same and same_json(b, a) is same


def test_deep_payloads_compare_without_recursion() -> None:
    from leaseq.core.checks import MAX_JSON_DEPTH
    from leaseq.engine.enqueue import same_json

    def deep(leaf: Any) -> Any:
        value = leaf
        for _ in range(MAX_JSON_DEPTH - 1):
            value = [value]
        return value

    assert same_json(deep(1), deep(1.0)) and not same_json(deep(1), deep(2))
