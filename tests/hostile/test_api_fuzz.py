"""Fuzzing the Python API with malformed, oversized and adversarial values, on both backends.

Every call must either succeed or raise a :class:`leaseq.LeaseqError`
(an :class:`leaseq.InvalidInput` naming the argument it refuses); a refused
call must leave every leaseq table exactly as it was, which is checked by a
snapshot of the tables before and after, read on the test's own connection.
Forged claims and effects (a real one with its generation, worker or task
changed) must be refused the same way.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

import leaseq
from leaseq.core.errors import InvalidInput, LeaseqError

from .support import ANY, TEXT, fuzz_settings, snapshot

FUZZ = fuzz_settings(40)
VALID = {"kind": "job", "payload": {"n": 1}, "effect": "idempotent", "queue": "fuzz", "idempotency_key": None,
         "priority": 0, "delay": 0, "max_attempts": 3, "lease_seconds": 30.0}


class World:
    """A queue with a worker holding a live lease, a queued task and a finished one."""

    def __init__(self, q: leaseq.Queue, dsn: str):
        self.q, self.dsn = q, dsn
        self.worker = q.register_worker("fuzz")
        self.other = q.register_worker("other")
        self.fresh_lease()
        self.queued = q.enqueue("job", queue="fuzz-idle")
        done = q.enqueue("job", queue="fuzz-done")
        q.complete(self.worker, q.claim(self.worker, queue="fuzz-done")[0], {"ok": True})
        self.done = done

    def fresh_lease(self) -> None:
        """A new running side-effect task with an open intent (a valid call may have ended the last one)."""
        self.running = self.q.enqueue("job", {"n": 0}, effect="side_effect", queue="fuzz", lease_seconds=600)
        self.claim = self.q.claim(self.worker, queue="fuzz", lease_seconds=600)[0]
        self.effect = self.q.begin_effect(self.worker, self.claim, "email.send")

    def refused_or_ok(self, fields: set[str], call, *args, **kwargs) -> str:
        """Run ``call``; a refusal must be a LeaseqError naming one of ``fields`` and change nothing."""
        before = snapshot(self.dsn)
        try:
            call(*args, **kwargs)
        except InvalidInput as exc:
            assert exc.field.split("[")[0] in fields, f"{exc.field!r} is not one of {sorted(fields)}: {exc}"
            assert snapshot(self.dsn) == before, f"refused ({exc}) but the tables changed"
            return "invalid"
        except LeaseqError as exc:
            assert snapshot(self.dsn) == before, f"refused ({exc}) but the tables changed"
            return exc.code
        return "ok"


@pytest.fixture
def world(q, dsn) -> World:
    return World(q, dsn)


def hostile_kwargs(data, valid: dict, *, at_least: int = 1) -> tuple[dict, set[str]]:
    """``valid`` with a drawn subset of its arguments replaced by hostile values."""
    names = [] if not valid else data.draw(st.lists(st.sampled_from(sorted(valid)), min_size=at_least, unique=True),
                                           label="hostile")
    kwargs = dict(valid)
    for name in names:
        kwargs[name] = data.draw(ANY, label=name)
    return kwargs, set(names)


@FUZZ
@given(data=st.data())
def test_enqueue(world, data):
    kwargs, fields = hostile_kwargs(data, VALID)
    kind = kwargs.pop("kind")
    payload = kwargs.pop("payload")
    world.refused_or_ok(fields, world.q.enqueue, kind, payload, **kwargs)


@FUZZ
@given(data=st.data())
def test_claim(world, data):
    kwargs, fields = hostile_kwargs(data, {"queue": "fuzz-idle", "limit": 1, "lease_seconds": 30.0})
    if data.draw(st.booleans(), label="hostile worker"):
        worker, fields = data.draw(ANY, label="worker"), fields | {"worker"}
    else:
        worker = world.other
    world.refused_or_ok(fields, world.q.claim, worker, **kwargs)


@FUZZ
@given(data=st.data(), op=st.sampled_from(["complete", "fail", "release", "heartbeat", "begin_effect"]))
def test_lease_calls_with_hostile_arguments(world, data, op):
    q = world.q
    valid = {"complete": {"result": {"ok": 1}}, "fail": {"error": "boom", "retry": True, "block": False, "delay": 0},
             "release": {"reason": "stop", "started": True}, "heartbeat": {}, "begin_effect": {"action": "crm.update", "key": None}}[op]
    kwargs, fields = hostile_kwargs(data, valid, at_least=0)
    if not fields:  # then forge the claim instead: another generation, worker or task
        change = data.draw(st.sampled_from(["generation", "worker_id", "task_id"]))
        value = data.draw(st.one_of(st.integers(-(2**63), 2**63 - 1),  # beyond: test_forged_claims_out_of_range
                                    st.just(world.claim.generation - 1), st.just(world.queued.id),
                                    st.just(world.other.id), TEXT), label=change)
        if change != "worker_id" and not isinstance(value, int):
            value = 0
        claim, fields = dataclasses.replace(world.claim, **{change: value}), {"claim"}
    else:
        claim = world.claim
    if op == "begin_effect":
        fields |= {"kind"} if "action" in fields else set()  # see test_begin_effect_names_the_action_field
    outcome = world.refused_or_ok(fields, getattr(q, op), world.worker, claim, **kwargs)
    if outcome == "ok":
        assert claim == world.claim, f"{op} accepted a forged claim {claim}"
        if op in ("complete", "fail", "release"):  # valid after all: the lease ended
            world.fresh_lease()
    assert q.get(world.running.id).status == "running"


@FUZZ
@given(data=st.data())
def test_finish_effect_with_forged_effects(world, data):
    change = data.draw(st.sampled_from(["id", "task_id", "generation", "status"]))
    value = data.draw(st.one_of(st.integers(-(2**63), 2**63 - 1), TEXT), label=change)
    if change != "status" and not isinstance(value, int):
        value = -1
    forged = dataclasses.replace(world.effect, **{change: value})
    response = data.draw(ANY, label="response")
    outcome = world.refused_or_ok({"effect", "response"}, world.q.finish_effect, world.worker, world.claim,
                                  forged, response)
    if outcome == "ok":  # authority comes from the claim: the effect's own generation and status are not trusted
        assert change in ("status", "generation") or value == getattr(world.effect, change)
        world.fresh_lease()


@FUZZ
@given(data=st.data(), op=st.sampled_from(["cancel", "reconcile", "unblock", "requeue"]))
def test_operator_actions(world, data, op):
    q = world.q
    valid = {"cancel": {"task_id": world.queued.id, "reason": "r", "by": "ops"},
             "reconcile": {"task_id": world.running.id, "outcome": "requeue", "note": "n", "result": None, "by": "ops"},
             "unblock": {"task_id": world.queued.id, "note": "n", "by": "ops"},
             "requeue": {"task_id": world.done.id, "note": "n", "by": "ops"}}[op]
    # Left valid: `by` (test_the_actor_name_is_checked) and reconcile's `outcome` (test_reconcile_outcome_type).
    fixed = {name: valid.pop(name) for name in ("by", "outcome") if name in valid}
    kwargs, fields = hostile_kwargs(data, valid)
    kwargs.update(fixed)
    task_id = kwargs.pop("task_id")
    outcome = world.refused_or_ok(fields | {"task_id"}, getattr(q, op), task_id, **kwargs)
    if outcome == "ok":
        assert op == "cancel" and task_id == world.queued.id


@FUZZ
@given(data=st.data(), op=st.sampled_from(["get", "events", "effects", "list", "pause", "register_worker",
                                           "revoke_worker", "prune"]))
def test_reads_switches_and_housekeeping(world, data, op):
    q = world.q
    value = data.draw(ANY, label="value")
    calls = {"get": (q.get, (value,), {"task_id"}), "events": (q.events, (value,), {"task_id"}),
             "effects": (q.effects, (value,), {"task_id"}),
             "list": (q.list, (), {"status", "queue", "limit"}),
             "pause": (q.pause, (value,), {"queue", "by"}),
             "register_worker": (q.register_worker, (value,), {"name", "token_id"}),
             "revoke_worker": (q.revoke_worker, (value,), {"worker"}),
             "prune": (q.prune, (value,), {"older_than_seconds", "payloads_older_than_seconds", "batch"})}
    call, args, fields = calls[op]
    kwargs = {}
    if op == "list":
        kwargs = {data.draw(st.sampled_from(["status", "queue", "limit"])): value}
    world.refused_or_ok(fields, call, *args, **kwargs)


@FUZZ
@given(data=st.data(), op=st.sampled_from(["emit", "stream"]))
def test_streams_with_hostile_arguments(world, data, op):
    q = world.q
    if op == "emit":  # an item or a ledger key the stream cannot take: refused, nothing written
        kwargs, fields = hostile_kwargs(data, {"item": {"progress": 1}, "key": None})
        world.refused_or_ok(fields, q.emit, world.worker, world.claim, **kwargs)
        assert q.get(world.running.id).status == "running"
        return
    # a read of a completed task's stream: following ends at once, whatever was asked
    kwargs, fields = hostile_kwargs(data, {"after": 0, "follow": False, "timeout": None})
    world.refused_or_ok(fields, lambda **kw: list(q.stream(world.done.id, **kw)), **kwargs)


def test_begin_effect_names_the_action_field(world):
    with pytest.raises(InvalidInput) as info:
        world.q.begin_effect(world.worker, world.claim, "")
    assert info.value.field == "action"


NUL_CASES = {
    "kind": lambda q: q.enqueue("a\x00b"),
    "idempotency_key": lambda q: q.enqueue("job", idempotency_key="k\x00"),
    "payload": lambda q: q.enqueue("job", {"note": "a\x00b"}),
    "reason": lambda q: q.cancel(q.list_tasks(limit=1)[0].id, "r\x00"),
}
SURROGATE_CASES = {
    "kind": lambda q: q.enqueue("k\ud800"),
    "idempotency_key": lambda q: q.enqueue("job", idempotency_key="\udc00"),
    "reason": lambda q: q.cancel(q.list_tasks(limit=1)[0].id, "r\udc00"),
}


def _text_cases():
    for backend in ("sqlite", "postgres"):
        for field in NUL_CASES:
            yield pytest.param(backend, "nul", field, id=f"{backend}-nul-{field}")
        for field in SURROGATE_CASES:
            yield pytest.param(backend, "surrogate", field, id=f"{backend}-surrogate-{field}")
    yield pytest.param("postgres", "surrogate", "payload", id="postgres-surrogate-payload")


@pytest.mark.parametrize("backend, kind, field", list(_text_cases()))
def test_text_the_database_cannot_store(request, tmp_path, backend, kind, field):
    dsn = f"sqlite:///{tmp_path / 'q.db'}" if backend == "sqlite" else request.getfixturevalue("pg_schema_dsn")
    with leaseq.connect(dsn) as q:
        q.migrate()
        q.enqueue("job")
        cases = dict(NUL_CASES if kind == "nul" else SURROGATE_CASES, payload=lambda q: q.enqueue("job", "\ud800"))
        before = snapshot(dsn)
        try:
            cases[field](q)
        except InvalidInput as exc:
            assert exc.field == field
            assert snapshot(dsn) == before


@pytest.mark.parametrize("by", [object(), b"ops", "x" * 20_000], ids=["object", "bytes", "20k-chars"])
def test_the_actor_name_is_checked(world, by):
    before = snapshot(world.dsn)
    with pytest.raises(InvalidInput) as info:
        world.q.cancel(world.queued.id, "r", by=by)
    assert info.value.field == "by"
    assert snapshot(world.dsn) == before


def test_reconcile_outcome_type(world):
    with pytest.raises(InvalidInput) as info:
        world.q.reconcile(world.running.id, ["completed"], "checked")
    assert info.value.field == "outcome"


def test_forged_claims_out_of_range(world):
    calls = [("complete", ({"x": 1},)), ("heartbeat", ()), ("begin_effect", ("act",)), ("fail", ("e",)),
             ("release", ())]
    for field in ("generation", "task_id"):
        for value in (2**63, 2**70):
            forged = dataclasses.replace(world.claim, **{field: value})
            for op, args in calls:
                before = snapshot(world.dsn)
                with pytest.raises(LeaseqError):
                    getattr(world.q, op)(world.worker, forged, *args)
                assert snapshot(world.dsn) == before
