"""Enqueue, idempotency-key dedupe, and bad input: every bad value gets an
error naming the field and leaves every table exactly as it was."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import leaseq
from leaseq.core import policy

from .support import snapshot


def test_enqueue_returns_the_queued_task(q: leaseq.Queue) -> None:
    t = q.enqueue("summarize", {"doc": 1, "tags": ["a", "b"]}, effect="idempotent", priority=3,
                  max_attempts=7, lease_seconds=12.5)
    assert (t.queue, t.kind, t.payload, t.effect) == ("default", "summarize", {"doc": 1, "tags": ["a", "b"]},
                                                     "idempotent")
    assert (t.status, t.priority, t.attempts, t.max_attempts, t.claim_generation) == ("queued", 3, 0, 7, 0)
    assert (t.lease_owner, t.lease_expires_at, t.result, t.last_error) == (None, None, None, None)
    assert t.lease_seconds == 12.5 and t.idempotency_key
    assert q.get(t.id) == t
    assert [e.type for e in q.events(t.id)] == ["enqueued"]



_OPTIONS = [
    {},
    dict(payload=None),
    dict(payload=[1, 2.5, "x", None, True, {"nested": {"deep": [1e-7, 123456789012345678]}}]),
    dict(payload="text ✓ with \"quotes\""),
    dict(payload={"big": 2**62, "neg": -1.5e300, "empty": {}, "list": []}),
    dict(payload={"b": 1, "aa": 2, "a": 3}, queue="elsewhere", priority=-7, max_attempts=1, lease_seconds=0.25),
    dict(effect="side_effect", actions=["charge", "email", "charge"]),
    dict(effect="idempotent", actions=[]),
    dict(delay=3600, timeout=1.5),
    dict(deadline=timedelta(minutes=5)),
    dict(deadline=datetime(2031, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)),
    dict(limits=["tokens", "api", "tokens"], units=40),
    dict(trace_context="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    dict(idempotency_key="given-key"),
    dict(approval="required", approval_deadline=60, by="reviewer"),
]


@pytest.mark.parametrize("options", _OPTIONS, ids=[",".join(o) or "defaults" for o in _OPTIONS])
def test_the_task_enqueue_returns_is_the_row_it_stored(q: leaseq.Queue, options: dict[str, Any]) -> None:
    # The insert reads back only what the database made; the rest of the
    # returned task is filled in from what was sent, and must match the row.
    options = dict(options)
    payload = options.pop("payload", {"doc": 1})
    t = q.enqueue("summarize", payload, **options)
    assert q.get(t.id) == t
    if "approval" not in options:
        assert (t.status, t.attempts, t.claim_generation, t.open_effects) == ("queued", 0, 0, 0)


def test_the_child_task_intend_returns_is_the_row_it_stored(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    q.enqueue("parent", effect="side_effect")
    [c] = q.claim(w)
    child = q.intend(w, c, "refund", {"amount": 12.5}, key="refund-1", queue="executors", priority=2,
                     actions=["refund"], lease_seconds=9)
    assert q.get(child.id) == child and child.status == "queued"
    assert q.intend(w, c, "refund", {"amount": 12.5}, key="refund-1", queue="executors", priority=2,
                    actions=["refund"], lease_seconds=9) == child

def test_generated_keys_are_distinct(q: leaseq.Queue) -> None:
    keys = {q.enqueue("job", {"i": i}).idempotency_key for i in range(5)}
    assert len(keys) == 5


def test_same_key_in_the_same_queue_returns_the_existing_task(q: leaseq.Queue) -> None:
    first = q.enqueue("email", {"to": "x@example.com"}, idempotency_key="welcome-42")
    again = q.enqueue("email", {"to": "x@example.com"}, idempotency_key="welcome-42", priority=0)
    assert again == first
    assert len(q.list_tasks()) == 1
    assert [e.type for e in q.events(first.id)] == ["enqueued"]
    elsewhere = q.enqueue("email", {"to": "x@example.com"}, idempotency_key="welcome-42", queue="other")
    assert elsewhere.id != first.id and elsewhere.queue == "other"
    assert len(q.list_tasks()) == 2


def test_dedupe_holds_after_the_task_has_run(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    first = q.enqueue("email", idempotency_key="k-1")
    [c] = q.claim(w)
    q.complete(w, c, result={"sent": True})
    again = q.enqueue("email", idempotency_key="k-1")
    assert (again.id, again.status, again.result) == (first.id, "completed", {"sent": True})


def test_sql_text_in_values_is_stored_verbatim(q: leaseq.Queue) -> None:
    nasty = "x'); DROP TABLE leaseq_tasks; --"
    t = q.enqueue(nasty, {"q": nasty}, idempotency_key=nasty)
    got = q.get(t.id)
    assert (got.kind, got.payload, got.idempotency_key) == (nasty, {"q": nasty}, nasty)
    assert len(q.list_tasks()) == 1


BAD_ENQUEUE: list[tuple[dict[str, Any], str]] = [
    (dict(effect="write"), "effect"),
    (dict(effect=None), "effect"),
    (dict(payload={"when": object()}), "payload"),
    (dict(payload={1, 2}), "payload"),
    (dict(payload=float("nan")), "payload"),
    (dict(payload="x" * policy.MAX_PAYLOAD_BYTES), "payload"),
    (dict(kind=""), "kind"),
    (dict(kind="   "), "kind"),
    (dict(kind=None), "kind"),
    (dict(queue=""), "queue"),
    (dict(queue="two words"), "queue"),
    (dict(queue="x'; DROP TABLE leaseq_tasks; --"), "queue"),
    (dict(queue="default;--"), "queue"),
    (dict(queue="q" * 101), "queue"),
    (dict(queue=None), "queue"),
    (dict(delay=-1), "delay"),
    (dict(delay=float("nan")), "delay"),
    (dict(delay="soon"), "delay"),
    (dict(max_attempts=0), "max_attempts"),
    (dict(max_attempts=2.5), "max_attempts"),
    (dict(max_attempts=True), "max_attempts"),
    (dict(lease_seconds=0), "lease_seconds"),
    (dict(lease_seconds=-5), "lease_seconds"),
    (dict(lease_seconds=float("inf")), "lease_seconds"),
    (dict(priority="high"), "priority"),
    (dict(idempotency_key=""), "idempotency_key"),
    (dict(idempotency_key="k" * 256), "idempotency_key"),
]


@pytest.mark.parametrize("bad, field", BAD_ENQUEUE, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_ENQUEUE)])
def test_bad_enqueue_names_the_field_and_changes_nothing(q: leaseq.Queue, dsn: str, bad: dict, field: str) -> None:
    q.enqueue("existing", {"keep": True}, idempotency_key="already-there")
    before = snapshot(dsn)
    kwargs: dict[str, Any] = dict(kind="job", payload={"ok": 1})
    kwargs.update(bad)
    kind = kwargs.pop("kind")
    payload = kwargs.pop("payload")
    with pytest.raises(leaseq.InvalidInput) as info:
        q.enqueue(kind, payload, **kwargs)
    assert info.value.field == field
    assert field in str(info.value)
    assert snapshot(dsn) == before


def test_payload_at_the_limit_is_accepted(q: leaseq.Queue) -> None:
    # the limit counts the JSON encoding, quotes included
    t = q.enqueue("job", "x" * (policy.MAX_PAYLOAD_BYTES - 2))
    assert len(q.get(t.id).payload) == policy.MAX_PAYLOAD_BYTES - 2


def test_unknown_status_filter(q: leaseq.Queue) -> None:
    with pytest.raises(leaseq.InvalidInput) as info:
        q.list_tasks(status="finished")
    assert info.value.field == "status"
    assert q.list_tasks(status="queued") == []


MISSING = 10**9
OPERATOR_CALLS = {
    "get": lambda q: q.get(MISSING),
    "events": lambda q: q.events(MISSING),
    "effects": lambda q: q.effects(MISSING),
    "cancel": lambda q: q.cancel(MISSING, reason="r"),
    "reconcile": lambda q: q.reconcile(MISSING, "requeue", note="n"),
    "unblock": lambda q: q.unblock(MISSING, note="n"),
    "requeue": lambda q: q.requeue(MISSING, note="n"),
}


@pytest.mark.parametrize("call", list(OPERATOR_CALLS))
def test_task_that_does_not_exist_is_not_found(q: leaseq.Queue, dsn: str, call: str) -> None:
    q.enqueue("job")
    before = snapshot(dsn)
    with pytest.raises(leaseq.NotFound) as info:
        OPERATOR_CALLS[call](q)
    assert str(MISSING) in str(info.value)
    assert snapshot(dsn) == before


@pytest.mark.parametrize("task_id", [0, -1, "abc", None, 1.5, True, 2**63])
def test_malformed_task_id(q: leaseq.Queue, task_id: Any) -> None:
    with pytest.raises(leaseq.InvalidInput) as info:
        q.get(task_id)
    assert info.value.field == "task_id"


def test_digit_string_task_id_is_accepted(q: leaseq.Queue) -> None:
    t = q.enqueue("job")
    assert q.get(str(t.id)).id == t.id


def test_unregistered_worker(q: leaseq.Queue, dsn: str) -> None:
    q.enqueue("job")
    before = snapshot(dsn)
    with pytest.raises(leaseq.UnknownWorker):
        q.claim("ghost-000000000000")
    with pytest.raises(leaseq.InvalidInput) as info:
        q.claim("")
    assert info.value.field == "worker"
    with pytest.raises(leaseq.InvalidInput) as info:
        q.register_worker("bad name!")
    assert info.value.field == "name"
    assert snapshot(dsn) == before


@pytest.mark.parametrize("bad, field", [
    (dict(error=""), "error"), (dict(error=None), "error"), (dict(error="e", retry="no"), "retry"),
    (dict(error="e", block=1), "block"), (dict(error="e", delay=-1), "delay")])
def test_bad_fail_arguments(q: leaseq.Queue, dsn: str, bad: dict, field: str) -> None:
    w = q.register_worker("a")
    q.enqueue("job")
    [c] = q.claim(w)
    before = snapshot(dsn)
    kwargs = dict(bad)
    error = kwargs.pop("error")
    with pytest.raises(leaseq.InvalidInput) as info:
        q.fail(w, c, error, **kwargs)
    assert info.value.field == field
    assert snapshot(dsn) == before


def test_unserialisable_result_is_refused(q: leaseq.Queue, dsn: str) -> None:
    w = q.register_worker("a")
    q.enqueue("job")
    [c] = q.claim(w)
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        q.complete(w, c, result={"x": object()})
    assert info.value.field == "result"
    assert snapshot(dsn) == before


@pytest.mark.parametrize("dsn_text", [
    "", "   ", "mysql://root@127.0.0.1/db", "sqlite://", "sqlite:///", "sqlite:///:memory:",
    "leaseq.db", "postgresql://[bad", "postgresql://user@host:5432/db name"])
def test_dsn_that_does_not_parse_is_a_config_error(dsn_text: str) -> None:
    with pytest.raises(leaseq.ConfigError) as info:
        leaseq.connect(dsn_text)
    assert "dsn" in str(info.value)


def test_postgres_that_cannot_be_reached_is_unavailable_quickly() -> None:
    start = time.monotonic()
    with pytest.raises(leaseq.BackendUnavailable):
        leaseq.connect("postgresql://postgres@127.0.0.1:1/x")
    assert time.monotonic() - start < 5


def test_sqlite_file_that_cannot_be_opened_is_unavailable(tmp_path) -> None:
    with pytest.raises(leaseq.BackendUnavailable):
        leaseq.connect(f"sqlite:///{tmp_path}/no/such/folder/leaseq.db")


def test_concurrent_enqueues_with_one_key_make_one_task(q: leaseq.Queue) -> None:
    start = threading.Barrier(4)
    got: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            start.wait(timeout=10)
            got.append(q.enqueue("email", {"to": "x"}, idempotency_key="once").id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert not errors
    assert len(got) == 4 and len(set(got)) == 1
    assert len(q.list_tasks()) == 1 and len(q.events(got[0])) == 1


def test_a_generated_key_meeting_a_stored_one_never_swallows_a_payload(q: leaseq.Queue, monkeypatch) -> None:
    """Batches whose keys are all generated skip the conflict check. If a
    generated key ever met a stored one, the batch is written again under new
    keys: every payload becomes its own task, and the stored task is untouched."""
    stored = q.enqueue("job", {"old": True}, idempotency_key="f" * 32)
    real = leaseq.engine.enqueue.fresh_keys
    calls = []

    def colliding(n: int) -> list[str]:
        calls.append(n)
        return ["f" * 32] + real(n - 1) if len(calls) == 1 else real(n)

    monkeypatch.setattr(leaseq.engine.enqueue, "fresh_keys", colliding)
    ids = q.enqueue_many("job", [{"new": 1}, {"new": 2}])
    assert len(calls) == 2 and stored.id not in ids and len(set(ids)) == 2
    assert [q.get(i).payload for i in ids] == [{"new": 1}, {"new": 2}]
    assert q.get(stored.id).payload == {"old": True}
