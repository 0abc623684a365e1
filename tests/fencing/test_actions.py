"""Declared actions and lease-bound, resource-bound action tokens, on both backends."""

from __future__ import annotations

import time

import pytest

import leaseq
from leaseq.fencing import ActionSigner, InvalidActionToken, fencing_token

SIGNER = ActionSigner({"k1": bytes(range(32))}, "k1")


@pytest.fixture
def sq(dsn):
    queue = leaseq.connect(dsn, signer=SIGNER)
    queue.migrate()
    try:
        yield queue
    finally:
        queue.close()


def claim_one(q, **enqueue):
    task = q.enqueue("job", {}, **enqueue)
    worker = q.register_worker("w")
    [claim] = q.claim(worker, lease_seconds=enqueue.get("lease_seconds"))
    assert claim.task_id == task.id
    return task, worker, claim


def test_an_undeclared_action_is_refused_and_nothing_is_recorded(sq):
    task, w, claim = claim_one(sq, effect="side_effect", actions=["orders.pay", "email.send"])
    assert sq.get(task.id).actions == ["orders.pay", "email.send"]
    with pytest.raises(leaseq.InvalidInput, match="'orders.refund' is not an action task") as info:
        sq.begin_effect(w, claim, "orders.refund")
    assert info.value.field == "action" and "orders.pay" in str(info.value)
    assert sq.effects(task.id) == [] and sq.get(task.id).open_effects == 0
    assert sq.begin_effect(w, claim, "orders.pay").action == "orders.pay"


def test_a_read_only_task_may_begin_no_action(sq):
    task, w, claim = claim_one(sq, effect="read_only")
    with pytest.raises(leaseq.InvalidInput, match="read_only"):
        sq.begin_effect(w, claim, "orders.pay")
    assert sq.effects(task.id) == []
    with pytest.raises(leaseq.InvalidInput, match="actions"):
        sq.enqueue("job", {}, effect="read_only", actions=["orders.pay"])


def test_undeclared_actions_allow_any_action_of_a_writing_task(sq):
    _, w, claim = claim_one(sq, effect="idempotent")
    assert sq.begin_effect(w, claim, "anything.at.all").action == "anything.at.all"


def test_a_stale_worker_hears_lease_lost_before_any_action_check(sq):
    task, w, claim = claim_one(sq, effect="side_effect", actions=["orders.pay"], lease_seconds=30)
    sq.release(w, claim)
    with pytest.raises(leaseq.LeaseLost):
        sq.begin_effect(w, claim, "orders.refund")


@pytest.mark.parametrize("bad", ["orders.pay", ["", "x"], [1], ["x" * 201], [f"a{i}" for i in range(101)]])
def test_bad_actions_are_refused_on_enqueue_and_enqueue_many(sq, bad):
    with pytest.raises(leaseq.InvalidInput, match="actions"):
        sq.enqueue("job", {}, effect="idempotent", actions=bad)
    with pytest.raises(leaseq.InvalidInput, match="actions"):
        sq.enqueue_many("job", [{}, {}], effect="idempotent", actions=bad)
    assert sq.list_tasks() == []


def test_enqueue_many_stores_the_declared_actions(sq):
    ids = sq.enqueue_many("job", [{}, {}], effect="idempotent", actions=["a.b"])
    assert [sq.get(i).actions for i in ids] == [["a.b"], ["a.b"]]
    ids = sq.enqueue_many("job", [{}], effect="idempotent", idempotency_keys=["k"], actions=["c.d"])
    assert sq.get(ids[0]).actions == ["c.d"]


def test_an_app_task_declares_its_actions(dsn):
    app = leaseq.App(dsn)

    @app.task("pay", effect="side_effect", actions=["orders.pay"])
    def pay(ctx):
        pass

    assert app.queue.get(pay.enqueue().id).actions == ["orders.pay"]
    with pytest.raises(leaseq.InvalidInput, match="actions"):
        app.task("read", actions=["orders.pay"])
    app.queue.close()


def test_the_token_is_bound_to_task_generation_action_and_resource_and_ends_with_the_lease(sq):
    task, w, claim = claim_one(sq, effect="idempotent", actions=["orders.pay"], lease_seconds=30,
                              resources=["order:17"])
    fx = sq.begin_effect(w, claim, "orders.pay", "pay:17", resource="order:17")
    claims = SIGNER.verify(fx.token, action="orders.pay", resource="order:17", task_id=task.id, generation=1)
    deadline = sq.get(task.id).lease_expires_at.timestamp()
    assert deadline - 0.002 <= claims.expires_at <= deadline     # the lease deadline, not the 300 s TTL
    assert claims.fencing_token == claim.fencing_token == fencing_token(task.id, 1, claim.epoch)
    for scope, reason in ((dict(resource="order:18"), "wrong_resource"), (dict(task_id=task.id + 1), "wrong_task")):
        with pytest.raises(leaseq.fencing.InvalidActionToken) as info:
            SIGNER.verify(fx.token, **scope)
        assert info.value.reason == reason
    # Renewed: asking again for the pending effect re-issues the token from the new deadline, writing nothing.
    time.sleep(0.05)
    new_deadline = sq.heartbeat(w, claim).timestamp()
    again = sq.begin_effect(w, claim, "orders.pay", "pay:17", resource="order:17")
    assert again.id == fx.id and len(sq.effects(task.id)) == 1
    renewed = SIGNER.verify(again.token).expires_at
    assert renewed == pytest.approx(new_deadline, abs=0.002) and renewed > claims.expires_at
    assert [e.type for e in sq.events(task.id)].count("effect_intent") == 1


def test_the_runtime_hands_the_handler_a_current_token_after_each_renewal(dsn):
    app = leaseq.App(dsn, signer=SIGNER)
    seen: list[tuple[float, float]] = []

    @app.task("slow_pay", effect="idempotent", lease_seconds=1.0, actions=["orders.pay"])
    def slow_pay(ctx):
        with ctx.effect("orders.pay", resource="order:1") as fx:
            first = SIGNER.verify(fx.token).expires_at
            ctx.pause(2.5)                           # several renewals; the first token has run out
            now = time.time()
            later = SIGNER.verify(fx.token, now=now).expires_at   # would raise "expired" if stale
            seen.append((first, later, now))

    task = slow_pay.options(resources=["order:1"]).enqueue()
    app.run_worker(until_idle=True, install_signals=False, concurrency=1)
    assert app.queue.get(task.id).status == "completed"
    [(first, later, now)] = seen
    assert first < now < later
    app.queue.close()


@pytest.mark.parametrize("skew", [-3600.0, 3600.0])
def test_a_token_is_issued_on_the_database_clock_whatever_the_signers_clock(sq, monkeypatch, skew):
    """A direct worker signs its own tokens. With its clock an hour off either
    way, the token it mints still carries the database's issue time and the
    lease's deadline, so a downstream with a right clock accepts it now and
    refuses it once the lease is over."""
    import types

    from leaseq.fencing import tokens

    task, worker, claim = claim_one(sq, effect="side_effect", lease_seconds=30)
    real = time.time
    monkeypatch.setattr(tokens, "time", types.SimpleNamespace(time=lambda: real() + skew))
    fx = sq.begin_effect(worker, claim, "orders.pay")
    monkeypatch.undo()
    db_now = sq.now().timestamp()
    claims = SIGNER.verify(fx.token, now=real())             # accepted by a right clock
    assert abs(claims.issued_at - db_now) < 5
    assert claims.expires_at == pytest.approx(claim.expires_at.timestamp(), abs=0.002)
    with pytest.raises(InvalidActionToken, match="expired"):
        SIGNER.verify(fx.token, now=claim.expires_at.timestamp() + 1)
