"""The action ledger: intents recorded under the lease, stable keys, replay."""

from __future__ import annotations

import pytest

import leaseq

from .support import snapshot


def _running(q: leaseq.Queue, effect: str = "side_effect", **kw: object) -> tuple[leaseq.Worker, leaseq.Claim]:
    w = q.register_worker("a")
    q.enqueue("job", {"n": 1}, effect=effect, max_attempts=10, **kw)
    [c] = q.claim(w)
    return w, c


def test_begin_effect_records_the_intent_under_the_lease(q: leaseq.Queue) -> None:
    w, c = _running(q)
    fx = q.begin_effect(w, c, "email.send")
    assert (fx.task_id, fx.generation, fx.fencing_token, fx.worker_id) == (c.task_id, c.generation, c.generation, w.id)
    assert (fx.action, fx.status, fx.response, fx.replayed) == ("email.send", "pending", None, False)
    assert q.get(c.task_id).open_effects == 1
    assert [e.id for e in q.effects(c.task_id)] == [fx.id]
    [intent] = [e for e in q.events(c.task_id) if e.type == "effect_intent"]
    assert intent.detail["action"] == "email.send" and intent.detail["idempotency_key"] == fx.idempotency_key
    assert (intent.generation, intent.worker_id) == (c.generation, w.id)


def test_finish_effect_records_the_response(q: leaseq.Queue) -> None:
    w, c = _running(q)
    fx = q.begin_effect(w, c, "email.send")
    done = q.finish_effect(w, c, fx, response={"message_id": "m-1"})
    assert (done.id, done.status, done.response) == (fx.id, "done", {"message_id": "m-1"})
    assert done.response_at is not None
    assert q.get(c.task_id).open_effects == 0
    assert [e.type for e in q.events(c.task_id)][-2:] == ["effect_intent", "effect_response"]
    with pytest.raises(leaseq.InvalidTransition):
        q.finish_effect(w, c, fx, response={"again": True})  # a response is recorded once


def test_default_key_comes_from_the_task_key_and_the_action(q: leaseq.Queue) -> None:
    w, c = _running(q, idempotency_key="invoice-17")
    send = q.begin_effect(w, c, "email.send")
    charge = q.begin_effect(w, c, "payments.charge")
    assert send.idempotency_key != charge.idempotency_key
    assert "invoice-17" in send.idempotency_key and "email.send" in send.idempotency_key
    # asking again in the same attempt returns the same open intent, not a second one
    assert q.begin_effect(w, c, "email.send").id == send.id
    assert q.get(c.task_id).open_effects == 2
    explicit = q.begin_effect(w, c, "email.send", key="custom-key-1")
    assert explicit.idempotency_key == "custom-key-1" and explicit.id != send.id


def test_a_later_attempt_replays_a_recorded_response(q: leaseq.Queue, dsn: str) -> None:
    w, c1 = _running(q, idempotency_key="order-5")
    fx1 = q.begin_effect(w, c1, "email.send")
    q.finish_effect(w, c1, fx1, response={"message_id": "m-5"})
    q.fail(w, c1, "crashed after sending", delay=0)
    [c2] = q.claim(w)
    assert c2.generation == c1.generation + 1
    before = snapshot(dsn)
    fx2 = q.begin_effect(w, c2, "email.send")
    assert fx2.replayed is True
    assert (fx2.id, fx2.idempotency_key, fx2.response) == (fx1.id, fx1.idempotency_key, {"message_id": "m-5"})
    assert snapshot(dsn) == before  # a replay records nothing new
    assert q.finish_effect(w, c2, fx2, response={"ignored": True}) == fx2
    q.complete(w, c2, result={"sent": "m-5"})
    assert [e.status for e in q.effects(c2.task_id)] == ["done"]


def test_the_same_key_is_used_again_after_reconciliation_requeues(q: leaseq.Queue) -> None:
    w, c1 = _running(q, idempotency_key="order-6")
    fx1 = q.begin_effect(w, c1, "email.send")
    q.fail(w, c1, "timed out waiting for the provider", delay=0)
    assert q.get(c1.task_id).status == "needs_reconciliation"
    q.reconcile(c1.task_id, "requeue", note="provider has no such message")
    [c2] = q.claim(w)
    fx2 = q.begin_effect(w, c2, "email.send")
    assert fx2.idempotency_key == fx1.idempotency_key
    assert (fx2.status, fx2.generation, fx2.replayed) == ("pending", c2.generation, False)
    assert q.get(c2.task_id).open_effects == 1
    done = q.finish_effect(w, c2, fx2, response={"message_id": "m-6"})
    assert done.status == "done"


def test_finish_effect_of_another_tasks_effect_is_invalid(q: leaseq.Queue, dsn: str) -> None:
    w = q.register_worker("a")
    q.enqueue("job", effect="side_effect")
    q.enqueue("job", effect="side_effect")
    c1, c2 = q.claim(w, limit=2)
    fx1 = q.begin_effect(w, c1, "email.send")
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        q.finish_effect(w, c2, fx1, response={})
    assert info.value.field == "effect"
    with pytest.raises(leaseq.InvalidInput) as info:
        q.finish_effect(w, c1, {"id": fx1.id}, response={})
    assert info.value.field == "effect"
    assert snapshot(dsn) == before


def test_paused_queue_refuses_new_effects(q: leaseq.Queue, dsn: str) -> None:
    w, c = _running(q)
    open_fx = q.begin_effect(w, c, "email.send")
    q.pause("default")
    before = snapshot(dsn)
    with pytest.raises(leaseq.QueuePaused):
        q.begin_effect(w, c, "payments.charge")
    assert snapshot(dsn) == before
    # an action already in flight may still record what happened
    assert q.finish_effect(w, c, open_fx, response={"ok": True}).status == "done"
    q.resume("default")
    assert q.begin_effect(w, c, "payments.charge").status == "pending"


@pytest.mark.parametrize("kwargs, field", [
    (dict(action=""), "action"), (dict(action="email.send", key=""), "key"),
    (dict(action="email.send", key="k" * 256), "key")])
def test_bad_effect_arguments(q: leaseq.Queue, dsn: str, kwargs: dict, field: str) -> None:
    w, c = _running(q)
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        q.begin_effect(w, c, **kwargs)
    assert info.value.field == field
    assert snapshot(dsn) == before


def test_unserialisable_response_is_refused(q: leaseq.Queue, dsn: str) -> None:
    w, c = _running(q)
    fx = q.begin_effect(w, c, "email.send")
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        q.finish_effect(w, c, fx, response={"when": object()})
    assert info.value.field == "response"
    assert snapshot(dsn) == before
