"""The guard matrix on every transport: the sync Queue, the AsyncQueue and
the HTTP service (``RemoteQueue`` against a real uvicorn server), on both backends.

Every lease-backed operation is tried after every way of losing the lease;
each must be refused with :class:`leaseq.LeaseLost` and leave every table
exactly as it was. The operations are written once (``leaseq.engine``), so
the sync and async drivers share their logic, and the HTTP transport ends in
the same code on the server: this suite proves the three agree. A
transport that lacks a capability (``capabilities``) skips what needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import leaseq
from leaseq import auth
from leaseq.core import checks
from leaseq.core.model import Ending
from leaseq.worker.transport import Capabilities

from .support import run_out, snapshot

TRANSPORTS = ["sync", "async", "http"]


class AsyncTransport:
    """An :class:`leaseq.AsyncQueue` called from test code: each call awaited on one event loop of its own."""

    def __init__(self, q: leaseq.Queue):
        self._loop = asyncio.new_event_loop()
        self._aq = leaseq.AsyncQueue(q)
        self.capabilities = q.capabilities

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._aq, name)
        return lambda *args, **kwargs: self._loop.run_until_complete(method(*args, **kwargs))

    def close(self) -> None:
        self._loop.run_until_complete(self._aq.sync.close_async())  # this loop's connections only
        self._loop.close()


@contextlib.contextmanager
def over(kind: str, q: leaseq.Queue, role: str) -> Iterator[Any]:
    """``q`` reached ``kind`` way: itself (sync), an AsyncQueue on a loop of its own (async), or
    a RemoteQueue through the service's real uvicorn server with a ``role`` token (http)."""
    if kind == "sync":
        yield q
    elif kind == "async":
        t = AsyncTransport(q)
        try:
            yield t
        finally:
            t.close()
    else:
        pytest.importorskip("uvicorn")
        from leaseq.client import RemoteQueue
        from service.conftest import serve  # the service tests' real uvicorn server, on a free port

        with serve(q) as (url, _app):
            token, _ = auth.create_token(q, name=f"matrix-{role}", role=role, created_by="test", all_queues=True)
            with RemoteQueue(url, token, timeout=10) as remote:
                yield remote


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest, q: leaseq.Queue) -> Iterator[Any]:
    """A worker-side transport onto the test's queue ``q``."""
    with over(request.param, q, "worker") as t:
        yield t


GUARDED: dict[str, Callable[[Any, Any, leaseq.Claim, Any], Any]] = {
    "heartbeat": lambda t, w, c, fx: t.heartbeat(w, c),
    "renew_leases": lambda t, w, c, fx: _lost_if_missing(c, t.renew_leases(w, [c])),
    "complete": lambda t, w, c, fx: t.complete(w, c, result={"stale": True}),
    "complete_many": lambda t, w, c, fx: _lost_if_missing(c, t.complete_many(w, [(c, {"stale": True})])),
    "fail": lambda t, w, c, fx: t.fail(w, c, "boom", delay=0),
    "fail_with_backoff": lambda t, w, c, fx: t.fail(w, c, "boom"),
    "release": lambda t, w, c, fx: t.release(w, c),
    "release_unstarted": lambda t, w, c, fx: t.release(w, c, "never started", started=False),
    "retry": lambda t, w, c, fx: t.retry(w, c, after=0, reason="told to come back"),
    "begin_effect": lambda t, w, c, fx: t.begin_effect(w, c, "email.send"),
    "finish_effect": lambda t, w, c, fx: t.finish_effect(w, c, fx, response={"sent": True}),
    "sleep": lambda t, w, c, fx: t.sleep(w, c, "job:sleep:0", seconds=60),
    "wait_signal": lambda t, w, c, fx: t.wait_signal(w, c, "job:signal:go:0", "go", timeout=60),
    "ask": lambda t, w, c, fx: t.wait_signal(w, c, "job:ask:0", "leaseq.answer", timeout=60,
                                             ask={"question": "go ahead?", "schema": {"type": "boolean"}}),
    "spawn": lambda t, w, c, fx: t.spawn(w, c, "job.child", {"n": 1}, key="child-1"),
    "wait_children": lambda t, w, c, fx: t.wait_children(w, c, "job:children:0", [c.task_id]),
}
#: what a transport must declare to be asked an operation (batch calls answer with what they did)
NEEDS: dict[str, Callable[[Capabilities], bool]] = {"complete_many": lambda caps: caps.batched_completion}
LOSSES = ["expired", "reclaimed", "cancelled", "revoked", "newer_generation", "older_generation"]


def _lost_if_missing(claim: leaseq.Claim, answered: Any) -> None:
    """A batch call leaves a lost lease out of its answer; the matrix treats that as a refusal."""
    if claim.task_id not in answered:
        raise leaseq.LeaseLost(claim.task_id, claim.generation, "missing from the batch's answer")


def _lose(kind: str, q: leaseq.Queue, t: Any) -> tuple[Any, leaseq.Claim, Any, int]:
    """Worker A (on transport ``t``) claims a side-effect task and records an intent;
    then the lease is lost as ``kind`` says. Returns (worker, claim to try, effect, task id)."""
    a = t.register_worker("a")
    task = q.enqueue("job", {"x": 1}, effect="side_effect", max_attempts=5)
    short = kind in ("expired", "reclaimed")
    [claim] = t.claim(a)
    fx = t.begin_effect(a, claim, "crm.update")
    if short:  # the deadline moved into the past, as the clock would: what follows is the subject here
        run_out(q, a, claim)
    if kind == "reclaimed":  # another worker takes the task over once its lease has run out
        b = q.register_worker("b")
        q.sweep()
        q.reconcile(task.id, "requeue", "checked: never sent", by="ops")  # the open intent parks it first
        [taken] = q.claim(b)
        assert taken.generation == claim.generation + 1
    elif kind == "cancelled":
        q.cancel(task.id, reason="operator said so", by="ops")
    elif kind == "revoked":
        q.revoke_worker(a.id, by="ops")
    elif kind == "newer_generation":
        claim = dataclasses.replace(claim, generation=claim.generation + 1)
    elif kind == "older_generation":
        claim = dataclasses.replace(claim, generation=claim.generation - 1)
    return a, claim, fx, task.id


@pytest.mark.parametrize("op", list(GUARDED))
@pytest.mark.parametrize("loss", LOSSES)
def test_every_transport_refuses_a_lost_lease_and_changes_nothing(q: leaseq.Queue, dsn: str, transport: Any,
                                                                  op: str, loss: str) -> None:
    needs = NEEDS.get(op)
    if needs is not None and not needs(transport.capabilities):
        pytest.skip(f"{type(transport).__name__} does not declare what {op} needs")
    worker, claim, fx, task_id = _lose(loss, q, transport)
    before = snapshot(dsn)
    with pytest.raises(leaseq.LeaseLost) as info:
        GUARDED[op](transport, worker, claim, fx)
    assert (info.value.task_id, info.value.generation) == (task_id, claim.generation)
    assert snapshot(dsn) == before


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_every_transport_gives_an_unstarted_lease_back_with_its_attempt(q: leaseq.Queue, transport: Any,
                                                                         max_attempts: int) -> None:
    """A lease given back unstarted (``started=False``: a stopping worker never began its
    handler) gives back the attempt its claim counted: a task on its last attempt is queued
    again, not ended dead, and the event says the handler never started. Given back after
    a start, the attempt stays counted and the last one ends the task."""
    a = transport.register_worker("a")
    task = q.enqueue("job", max_attempts=max_attempts)
    [claim] = transport.claim(a)
    assert q.get(task.id).attempts == 1
    back = transport.release(a, claim, "worker stopping: never started", started=False)
    assert back.status == "queued" and back.attempts == 0 and back.lease_owner is None
    [event] = [e for e in q.events(task.id) if e.type == "lease_released"]
    assert event.detail["started"] is False and event.detail["routed_to"] == "queued"
    assert event.detail["reason"] == "worker stopping: never started"
    [again] = transport.claim(a)
    assert again.generation == claim.generation + 1 and q.get(task.id).attempts == 1  # fenced as ever
    ended = transport.release(a, again, "worker shut down before the task finished")
    assert (ended.status, ended.attempts) == (("dead", 1) if max_attempts == 1 else ("queued", 1))
    last = [e for e in q.events(task.id) if e.type == "lease_released"][-1]
    assert "started" not in last.detail


def test_every_transport_refuses_a_started_that_is_not_a_boolean(q: leaseq.Queue, dsn: str, transport: Any) -> None:
    """``started`` gives an attempt back: only True or False says so. Anything else (truthy
    or not) is refused naming the field, and nothing changes; the lease is still held."""
    a = transport.register_worker("a")
    q.enqueue("job", max_attempts=1)
    [claim] = transport.claim(a)
    before = snapshot(dsn)
    for hostile in ("no", "false", 0, 1, None, [False]):
        with pytest.raises(leaseq.InvalidInput) as info:
            transport.release(a, claim, "stopping", started=hostile)
        assert "started" in info.value.field or "started" in str(info.value), (hostile, info.value)
        assert snapshot(dsn) == before, hostile
    assert transport.release(a, claim, "stopping", started=False).attempts == 0


@pytest.mark.parametrize("attempts", [1, 4])
def test_every_transport_fails_with_the_default_backoff(q: leaseq.Queue, transport: Any, attempts: int) -> None:
    """A failure with no delay waits the default backoff for the attempt that failed:
    between half and all of ``min(cap, base * 2**(attempts-1))``, computed by the guarded
    statement from the row (over HTTP, with no read of the task before it)."""
    a = transport.register_worker("a")
    task = q.enqueue("job", max_attempts=10)
    for n in range(1, attempts):
        [claim] = transport.claim(a)
        transport.fail(a, claim, "flaky " + "x" * n, delay=0)
    [claim] = transport.claim(a)
    failed = transport.fail(a, claim, "flaky at last")
    ceiling = min(checks.BACKOFF_CAP_SECONDS, checks.BACKOFF_BASE_SECONDS * 2 ** (attempts - 1))
    assert (failed.id, failed.status, failed.attempts) == (task.id, "queued", attempts)
    waited = (failed.available_at - failed.updated_at).total_seconds()
    assert ceiling / 2 - 1e-5 <= waited <= ceiling + 1e-5
    [*_, event] = [e for e in q.events(task.id) if e.type == "failed"]
    assert event.detail["retry_at"] == failed.available_at.isoformat()


def test_every_transport_ends_attempts_each_its_own_way(q: leaseq.Queue, dsn: str, transport: Any) -> None:
    """``end_attempts`` (over HTTP, ``POST /v1/workers/{id}/end``): one call completes, fails,
    retries and releases, leaves a refused attempt out, and refuses bad input whole."""
    a = transport.register_worker("a")
    for i in range(5):
        q.enqueue("job", {"n": i}, max_attempts=3)
    done, failed, retried, released, stale = transport.claim(a, limit=5)
    q.cancel(stale.task_id, "operator stopped it", by="ops")
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as bad:
        transport.end_attempts(a, [Ending(done, "complete"), Ending(failed, "fail", error="")])
    assert bad.value.field == "endings.1.error" and snapshot(dsn) == before
    ended, refused = transport.end_attempts(a, [
        Ending(done, "complete", result={"ok": 1}), Ending(failed, "fail", error="boom"),
        Ending(retried, "retry", after=60, reason="rate limited"),
        Ending(released, "release", reason="stopping", started=False), Ending(stale, "complete")])
    assert [(e.task_id, e.outcome) for e in ended] == [
        (done.task_id, "complete"), (failed.task_id, "fail"), (retried.task_id, "retry"),
        (released.task_id, "release")]
    assert ended[0].task is None and [e.task.status for e in ended[1:]] == ["queued"] * 3
    assert [(r.task_id, r.generation) for r in refused] == [(stale.task_id, stale.generation)]
    assert q.get(done.task_id).result == {"ok": 1} and q.get(failed.task_id).last_error == "boom"
    assert (q.get(retried.task_id).snoozes, q.get(released.task_id).attempts) == (1, 0)


@pytest.mark.parametrize("op", ["heartbeat", "begin_effect", "complete"])
def test_every_transport_accepts_a_live_lease(q: leaseq.Queue, transport: Any, op: str) -> None:
    """The matrix's refusals are the guard's doing: the same calls on a live lease go through."""
    a = transport.register_worker("a")
    task = q.enqueue("job", {"x": 1}, effect="side_effect")
    [claim] = transport.claim(a)
    fx = transport.begin_effect(a, claim, "crm.update")
    GUARDED[op](transport, a, claim, fx)
    if op == "complete":
        assert q.get(task.id).status == "completed"


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_enqueue_many_adds_the_same_tasks_on_every_transport(q: leaseq.Queue, kind: str) -> None:
    """``enqueue_many`` on the sync Queue, the AsyncQueue and over HTTP (``POST /v1/tasks/batch``):
    the same tasks, the same dedupe by key, the same refusal naming the field, nothing written."""
    with over(kind, q, "operator") as t:
        ids = t.enqueue_many("job", [{"n": 0}, {"n": 1}], queue="many", idempotency_keys=["k0", None],
                             budget={"tok": 5}, fairness_key="tenant", priority=2)
        assert t.enqueue_many("job", [{"n": 0}], queue="many", idempotency_keys=["k0"], budget={"tok": 5},
                              fairness_key="tenant", priority=2) == ids[:1]
        with pytest.raises(leaseq.InvalidInput) as refused:  # the first item fine, the second not: neither added
            t.enqueue_many("job", [1, 2], queue="many", idempotency_keys=["a", "b" * 300])
        assert refused.value.field == "idempotency_keys[1]"
    tasks = [q.get(task_id) for task_id in ids]
    assert [(t.payload, t.queue, t.budget, t.fairness_key, t.priority) for t in tasks] == [
        ({"n": n}, "many", {"tok": 5}, "tenant", 2) for n in range(2)]
    assert len(q.list_tasks(queue="many")) == 2
