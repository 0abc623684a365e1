"""Child tasks on every transport (sync, async, HTTP) and both backends: a handler spawns
children under its lease (a retried attempt gets the same child), waits for them holding
no lease, is woken by the end of the last one and gets their results from the ledger; a
child's failure reaches it as leaseq.ChildFailed; a cancel takes the tree and reports each
disposition."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq.core.errors import Suspended
from leaseq.worker.context import TaskContext
from leaseq_chaos.traces import validate_queue

from .support import snapshot
from .test_transports import over, transport  # noqa: F401  (the fixture: sync, async and HTTP transports)

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def _attempt(t: Any, w: leaseq.Worker, kinds: list[str] | None = None) -> TaskContext:
    [claim] = t.claim(w, kinds=kinds)
    return TaskContext(t, w, claim, LOG)


def test_a_retried_parent_gets_the_same_child(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    parent = q.enqueue("plan", {}, idempotency_key="plan-1", max_attempts=3)

    def handler(ctx: TaskContext) -> list[int]:
        first = ctx.spawn("step", {"n": 1}, key="first")
        second = ctx.spawn("step", {"n": 2})  # keyed by kind and position: step:0
        return [first.id, second.id]

    ctx = _attempt(transport, w, ["plan"])
    made = handler(ctx)
    transport.fail(w, ctx.claim, "crashed after the spawns", delay=0)
    again = _attempt(transport, w, ["plan"])
    assert handler(again) == made  # the same children, from the ledger
    children = [t for t in q.list_tasks(limit=100) if t.kind == "step"]
    assert sorted(t.id for t in children) == sorted(made)  # no second child
    assert {t.parent_id for t in children} == {parent.id} and {t.queue for t in children} == {"default"}
    assert [q.get(i).idempotency_key for i in made] == ["plan-1/child/first", "plan-1/child/step:0"]
    assert [q.get(i).payload for i in made] == [{"n": 1}, {"n": 2}]
    spawned = [e for e in q.events(parent.id) if e.type == "child_spawned"]
    assert [(e.detail["child_task_id"], e.generation) for e in spawned] == [(made[0], 1), (made[1], 1)]
    ledger = [(e.idempotency_key, e.action, e.response["task_id"]) for e in q.effects(parent.id)]
    assert ledger == [("spawn:first", "leaseq.spawn", made[0]), ("spawn:step:0", "leaseq.spawn", made[1])]
    # the same key with another payload is not the same child
    with pytest.raises(leaseq.IdempotencyKeyConflict):
        again.spawn("step", {"n": 99}, key="first")
    assert validate_queue(q) == []


def test_a_stale_generation_cannot_spawn(q: leaseq.Queue, dsn: str, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    q.enqueue("plan", {}, idempotency_key="plan-2", max_attempts=3)
    ctx = _attempt(transport, w)
    transport.fail(w, ctx.claim, "lost it", delay=0)
    newer = _attempt(transport, w)
    before = snapshot(dsn)
    with pytest.raises(leaseq.LeaseLost):
        ctx.spawn("step", {"n": 1}, key="late")  # the first attempt's generation is stale
    assert snapshot(dsn) == before and ctx.lost
    newer.spawn("step", {"n": 1}, key="late")
    assert len([t for t in q.list_tasks(limit=100) if t.kind == "step"]) == 1


def test_fan_in_of_three_children_returns_their_results_in_order(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    parent = q.enqueue("fan", {"docs": ["a", "b", "c"]}, idempotency_key="fan-1", max_attempts=1)

    def handler(ctx: TaskContext) -> Any:
        handles = [ctx.spawn("summarize", {"doc": d}, key=d) for d in ctx.task.payload["docs"]]
        return {"summaries": ctx.wait_for_all(handles)}

    ctx = _attempt(transport, w, ["fan"])
    with pytest.raises(Suspended) as ended:
        handler(ctx)
    assert ended.value.waiting_for.startswith("child tasks")
    waiting = q.get(parent.id)
    assert (waiting.status, waiting.lease_owner, waiting.lease_expires_at, waiting.attempts) == \
        ("waiting", None, None, 0)
    kids = sorted(t.id for t in q.list_tasks(limit=100) if t.kind == "summarize")
    assert waiting.wait_children == kids and waiting.wake_at is None
    assert transport.claim(w, kinds=["fan"]) == []  # nothing to claim while the children run
    leases = {c.task_id: c for c in transport.claim(w, kinds=["summarize"], limit=10)}
    assert sorted(leases) == kids
    for n, child in enumerate(reversed(kids)):  # the last spawned ends first
        transport.complete(w, leases[child], {"summary": f"s{child}"})
        assert q.get(parent.id).status == ("queued" if n == 2 else "waiting")  # woken by the last one only
    again = _attempt(transport, w, ["fan"])
    result = handler(again)
    assert result == {"summaries": [{"summary": f"s{c}"} for c in kids]}  # in the order waited for
    transport.complete(w, again.claim, result)
    assert len([t for t in q.list_tasks(limit=100) if t.kind == "summarize"]) == 3  # none spawned twice
    types = [e.type for e in q.events(parent.id)]
    assert types == ["enqueued", "claimed", "child_spawned", "child_spawned", "child_spawned", "suspended", "woke",
                     "claimed", "children_awaited", "completed"]
    events = q.events(parent.id)
    suspended = next(e for e in events if e.type == "suspended")
    assert suspended.detail["waiting_for"] == "children" and suspended.detail["children"] == kids
    woke = next(e for e in events if e.type == "woke")
    assert woke.detail["reason"] == "children" and woke.detail["ended"] == [kids[0]]
    awaited = next(e for e in events if e.type == "children_awaited")
    assert awaited.detail["children"] == kids and awaited.detail["outcome"] == "completed"
    assert awaited.detail["waited_seconds"] >= 0
    [outcome] = [e for e in q.effects(parent.id) if e.idempotency_key == "fan-1:children:0"]
    assert outcome.response["results"] == result["summaries"] and outcome.action == "leaseq.children"
    assert validate_queue(q) == []


def test_a_wait_for_children_that_ended_answers_at_once(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    q.enqueue("lead", {}, idempotency_key="lead-1")
    ctx = _attempt(transport, w, ["lead"])
    handle = ctx.spawn("part", {"n": 1})
    [child] = transport.claim(w, kinds=["part"])
    transport.complete(w, child, 42)
    assert ctx.wait_for(handle) == 42  # no suspension: the child had ended
    assert ctx.wait_for(handle) == 42  # a second wait, recorded at the next position
    assert [e.idempotency_key for e in q.effects(ctx.task_id)] == ["spawn:part:0", "lead-1:children:0",
                                                                   "lead-1:children:1"]


def test_an_async_handler_spawns_and_waits(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    q.enqueue("lead", {}, idempotency_key="lead-2")

    async def handler(ctx: TaskContext) -> Any:
        first = await ctx.aspawn("part", {"n": 1})  # off the event loop (ctx.spawn: see tests/worker)
        second = await ctx.aspawn("part", {"n": 2}, key="second")
        third = await ctx.aspawn("part", {"n": 3})
        return await ctx.wait_for(first), await ctx.wait_for_all([second, third])

    ctx = _attempt(transport, w, ["lead"])
    ctx.handler_is_async = True
    with pytest.raises(Suspended):
        asyncio.run(handler(ctx))
    for c in transport.claim(w, kinds=["part"], limit=10):
        transport.complete(w, c, c.task.payload["n"] * 10)
    again = _attempt(transport, w, ["lead"])
    again.handler_is_async = True
    assert asyncio.run(handler(again)) == (10, [20, 30])


def test_a_childs_failure_is_caught_by_the_parent(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    parent = q.enqueue("guard", {}, idempotency_key="guard-1", max_attempts=1)

    def handler(ctx: TaskContext) -> Any:
        ok = ctx.spawn("check", {"n": 1}, key="ok")
        bad = ctx.spawn("check", {"n": 2}, key="bad", max_attempts=1)
        try:
            return {"results": ctx.wait_for_all([ok, bad])}
        except leaseq.ChildFailed as failed:
            return {"failed": failed.child_id, "status": failed.status, "error": failed.error}

    ctx = _attempt(transport, w, ["guard"])
    with pytest.raises(Suspended):
        handler(ctx)
    leases = {c.task.payload["n"]: c for c in transport.claim(w, kinds=["check"], limit=10)}
    transport.fail(w, leases[2], "the API said no", retry=False)
    assert q.get(parent.id).status == "waiting"  # still waiting for the other one
    transport.complete(w, leases[1], "fine")
    again = _attempt(transport, w, ["guard"])
    answer = handler(again)
    assert answer == {"failed": leases[2].task_id, "status": "dead", "error": "the API said no"}
    # the outcome is in the ledger: the handler run again from the top raises the same failure
    assert handler(TaskContext(transport, w, again.claim, LOG)) == answer
    assert [e.detail["outcome"] for e in q.events(parent.id) if e.type == "children_awaited"] == ["failed"]
    # uncaught, it fails the attempt with its code on every transport
    q.enqueue("guard", {}, idempotency_key="guard-2", max_attempts=1)
    plain = _attempt(transport, w, ["guard"])
    bad = plain.spawn("check", {"n": 3}, key="bad", max_attempts=1)
    [lease] = transport.claim(w, kinds=["check"])
    transport.fail(w, lease, "no", retry=False)
    with pytest.raises(leaseq.ChildFailed) as info:
        plain.wait_for(bad)
    assert (info.value.child_id, info.value.status, info.value.error, info.value.code) == \
        (bad.id, "dead", "no", "child_failed")


def test_a_cancelled_child_reaches_the_waiting_parent(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    parent = q.enqueue("boss", {}, idempotency_key="boss-1")
    ctx = _attempt(transport, w, ["boss"])
    handle = ctx.spawn("sub", {})
    with pytest.raises(Suspended):
        ctx.wait_for(handle)
    q.cancel(handle.id, reason="not needed", by="ops")  # the operator cancels the child alone
    assert q.get(parent.id).status == "queued"  # its end woke the parent, in the same transaction
    again = _attempt(transport, w, ["boss"])
    with pytest.raises(leaseq.ChildFailed) as info:
        again.wait_for(again.spawn("sub", {}))
    assert (info.value.child_id, info.value.status) == (handle.id, "cancelled")


def test_a_wait_names_only_children_of_the_task(q: leaseq.Queue, dsn: str, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    stranger = q.enqueue("other", {})
    q.enqueue("lead", {}, idempotency_key="lead-3")
    ctx = _attempt(transport, w, ["lead"])
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        ctx.wait_for(stranger.id)
    assert info.value.field == "children" and snapshot(dsn) == before
    for bad in ([], "abc", [True]):
        with pytest.raises(leaseq.InvalidInput):
            ctx.wait_for_all(bad)
    with pytest.raises(leaseq.InvalidInput):
        ctx.spawn("", {})
    assert snapshot(dsn) == before and not ctx.lost


def test_a_cancel_tree_three_levels_deep_reports_each_disposition(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    root = q.enqueue("root", {}, idempotency_key="root-1")
    top = _attempt(transport, w, ["root"])
    done = top.spawn("leaf", {"n": 1}, key="done")           # completes before the cancel
    busy = top.spawn("mid", {"n": 2}, key="busy", effect="side_effect")  # running, a side effect in flight
    [leaf] = transport.claim(w, kinds=["leaf"])
    transport.complete(w, leaf, "ok")
    [mid] = transport.claim(w, kinds=["mid"])
    mid_ctx = TaskContext(transport, w, mid, LOG)
    queued = mid_ctx.spawn("leaf", {"n": 3}, key="later")    # a grandchild that never started
    fx = transport.begin_effect(w, mid, "crm.update")       # begun, no response: in flight
    with pytest.raises(Suspended):
        top.wait_for_all([done, busy])
    report = q.cancel(root.id, reason="wrong plan", by="ops", tree=True)
    assert (report["task_id"], report["status"], report["previous_status"]) == (root.id, "cancelled", "waiting")
    got = {c["task_id"]: (c["depth"], c["parent_id"], c["previous_status"], c["status"], c["disposition"])
           for c in report["children"]}
    assert got == {done.id: (1, root.id, "completed", "completed", "completed"),
                   busy.id: (1, root.id, "running", "cancelled", "unknown"),
                   queued.id: (2, busy.id, "queued", "cancelled", "not_started")}
    assert [(e["task_id"], e["effect_id"], e["action"], e["disposition"]) for e in report["effects"]] == \
        [(busy.id, fx.id, "crm.update", "unknown")]
    assert report["waits"] == [{"task_id": root.id, "waiting_for": "children", "children": [busy.id]}]
    assert {q.get(i).status for i in (busy.id, queued.id)} == {"cancelled"}
    with pytest.raises(leaseq.LeaseLost):  # the running child's holder is fenced off
        transport.finish_effect(w, mid, fx, {"sent": True})
    [kept] = [e for e in q.events(root.id) if e.type == "tree_cancelled"]
    assert {c["task_id"]: c["disposition"] for c in kept.detail["children"]} == \
        {done.id: "completed", busy.id: "unknown", queued.id: "not_started"}
    assert [e["disposition"] for e in kept.detail["effects"]] == ["unknown"]
    [child_cancel] = [e for e in q.events(queued.id) if e.type == "cancelled"]
    assert child_cancel.detail["parent_task_id"] == busy.id and child_cancel.detail["disposition"] == "not_started"
    assert validate_queue(q) == []


def test_cancel_without_tree_still_takes_the_children(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    root = q.enqueue("root", {}, idempotency_key="root-2")
    top = _attempt(transport, w, ["root"])
    child = top.spawn("leaf", {})
    task = q.cancel(root.id, reason="stop", by="ops")
    assert isinstance(task, leaseq.Task) and task.status == "cancelled"
    assert q.get(child.id).status == "cancelled"
    assert [e.type for e in q.events(root.id)][-2:] == ["cancelled", "tree_cancelled"]
    with pytest.raises(leaseq.InvalidInput) as info:
        q.cancel(child.id, reason="again", tree="yes")  # type: ignore[call-overload]
    assert info.value.field == "tree"


def test_cancel_tree_over_http(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    root = q.enqueue("root", {}, idempotency_key="root-3")
    [claim] = q.claim(w)
    top = TaskContext(q, w, claim, LOG)
    child = top.spawn("leaf", {})
    with over("http", q, "operator") as remote:
        report = remote.cancel(root.id, "over the wire", tree=True)
        assert isinstance(report, dict)
        assert [(c["task_id"], c["disposition"]) for c in report["children"]] == [(child.id, "not_started")]
        other = q.enqueue("root", {})
        assert remote.cancel(other.id, "plain").status == "cancelled"
    assert q.get(child.id).status == "cancelled"
    [kept] = [e for e in q.events(root.id) if e.type == "cancelled"]
    assert kept.detail["by"].startswith("matrix-operator")  # the token's principal


ROUNDS = 25


def test_children_ending_together_wake_their_parent(q: leaseq.Queue, dsn: str) -> None:
    """Two children of one waiting parent end in two transactions at once: whichever commits
    last sees the other's end and wakes the parent. Real threads on separate connections."""
    a, b = leaseq.connect(dsn), leaseq.connect(dsn)
    try:
        w = q.register_worker("w")
        for round_ in range(ROUNDS):
            parent = q.enqueue(f"race-{round_}", {})
            [claim] = q.claim(w, kinds=[f"race-{round_}"])
            ctx = TaskContext(q, w, claim, LOG)
            one, two = ctx.spawn("twin", {}, key="one"), ctx.spawn("twin", {}, key="two")
            with pytest.raises(Suspended):
                ctx.wait_for_all([one, two])
            leases = {c.task_id: c for c in q.claim(w, kinds=["twin"], limit=2)}
            start = threading.Barrier(2)
            errors: list[BaseException] = []

            def end(conn: leaseq.Queue, lease: leaseq.Claim) -> None:
                start.wait(timeout=30)
                try:
                    conn.complete(w, lease, "done")
                except BaseException as exc:  # noqa: BLE001 - reported to the test thread
                    errors.append(exc)

            threads = [threading.Thread(target=end, args=(conn, leases[c.id])) for conn, c in ((a, one), (b, two))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert errors == [], errors
            assert q.get(parent.id).status == "queued", f"round {round_}: the parent was left waiting"
    finally:
        a.close()
        b.close()


def test_a_wait_racing_its_childs_end_never_misses_it(q: leaseq.Queue, dsn: str) -> None:
    """The parent begins its wait while its child ends, at once: either the wait sees the child
    ended and answers, or it suspends and the child's end wakes it. Never left waiting."""
    other = leaseq.connect(dsn)
    try:
        w = q.register_worker("w")
        for round_ in range(ROUNDS):
            parent = q.enqueue(f"lone-{round_}", {})
            [claim] = q.claim(w, kinds=[f"lone-{round_}"])
            ctx = TaskContext(q, w, claim, LOG)
            child = ctx.spawn("kid", {})
            [lease] = q.claim(w, kinds=["kid"])
            start = threading.Barrier(2)
            answers: list[Any] = []

            def wait() -> None:
                start.wait(timeout=30)
                try:
                    answers.append(ctx.wait_for(child))
                except Suspended:
                    answers.append("suspended")

            def end() -> None:
                start.wait(timeout=30)
                other.complete(w, lease, "r")

            threads = [threading.Thread(target=wait), threading.Thread(target=end)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            status = q.get(parent.id).status
            assert (answers, status) in ((["r"], "running"), (["suspended"], "queued")), (round_, answers, status)
            if status == "running":
                q.complete(w, claim, None)
    finally:
        other.close()


def test_a_cancel_racing_the_last_childs_end_always_succeeds(q: leaseq.Queue, dsn: str) -> None:
    """An operator cancels a waiting parent while its child's worker completes the child, at
    once. The cancel locks the parent and then its children; the child's end locks the child
    and then wakes its parent: on PostgreSQL the two can close a lock cycle, which the
    database breaks by rolling one of them back. Whichever it is, nothing of it was written,
    and it runs again: the cancel always succeeds and takes the tree, and the child's
    completion either came first (the child completed) or is refused as a lost lease (it was
    cancelled). Real threads on separate connections, many rounds (most of them meet the
    cycle on PostgreSQL, each costing the database's deadlock_timeout, a second)."""
    operator, worker_conn = leaseq.connect(dsn), leaseq.connect(dsn)
    try:
        w = q.register_worker("w")
        for round_ in range(10):
            parent = q.enqueue(f"tree-{round_}", {})
            [claim] = q.claim(w, kinds=[f"tree-{round_}"])
            ctx = TaskContext(q, w, claim, LOG)
            child = ctx.spawn("leaf", {}, key="leaf")
            with pytest.raises(Suspended):
                ctx.wait_for(child)
            [lease] = q.claim(w, kinds=["leaf"])
            start = threading.Barrier(2)
            outcomes: dict[str, Any] = {}

            def cancel() -> None:
                start.wait(timeout=30)
                try:
                    outcomes["cancel"] = operator.cancel(parent.id, reason="stop", by="ops", tree=True)
                except BaseException as exc:  # noqa: BLE001 - reported to the test thread
                    outcomes["cancel"] = exc

            def end() -> None:  # as the worker's completer does: a call in transit is made again
                start.wait(timeout=30)
                for _ in range(5):
                    try:
                        worker_conn.complete(w, lease, "leaf done")
                        outcomes["end"] = "completed"
                    except leaseq.LeaseLost:
                        outcomes["end"] = "refused"
                    except leaseq.BackendUnavailable as exc:  # rolled back to break the lock cycle
                        outcomes["end"] = exc
                        continue
                    except BaseException as exc:  # noqa: BLE001 - reported to the test thread
                        outcomes["end"] = exc
                    return

            threads = [threading.Thread(target=cancel), threading.Thread(target=end)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert not isinstance(outcomes["cancel"], BaseException), (round_, outcomes)
            assert outcomes["end"] in ("completed", "refused"), (round_, outcomes)
            assert q.get(parent.id).status == "cancelled", round_
            assert q.get(child.id).status == {"completed": "completed", "refused": "cancelled"}[outcomes["end"]]
            [reported] = outcomes["cancel"]["children"]
            assert reported["disposition"] == ("completed" if outcomes["end"] == "completed" else "unknown"), round_
    finally:
        operator.close()
        worker_conn.close()


def test_a_wait_for_children_times_out_and_a_retry_times_out_again(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    parent = q.enqueue("plan", {}, idempotency_key="plan-t", max_attempts=3)

    def handler(ctx: TaskContext) -> dict[str, Any]:
        child = ctx.spawn("step", {"n": 1}, key="slow")  # never claimed here: it does not end
        try:
            return {"result": ctx.wait_for(child, timeout=0.3)}
        except leaseq.WaitTimedOut as exc:
            return {"timed_out": exc.name, "late": ctx.wait_for_all([child], timeout=0, default="late")}

    ctx = _attempt(transport, w, ["plan"])
    with pytest.raises(Suspended):
        handler(ctx)
    waiting = q.get(parent.id)
    assert waiting.status == "waiting" and waiting.lease_owner is None and waiting.wake_at is not None
    time.sleep(0.4)  # its timeout passes: the claim routes it as a due sleeper
    again = _attempt(transport, w, ["plan"])
    assert q.get(parent.id).wait_children is None  # woken by its timeout, not by its children
    assert handler(again) == {"timed_out": "children", "late": "late"}
    # recorded: an attempt after a failure times out again at the same place, waiting for nothing
    transport.fail(w, again.claim, "crashed after the timeout", delay=0)
    third = _attempt(transport, w, ["plan"])
    assert handler(third) == {"timed_out": "children", "late": "late"}
    [child] = [t for t in q.list_tasks(limit=100) if t.kind == "step"]  # no second child
    assert child.status == "queued"  # the child runs on: only the wait ended
    timed_out = [e for e in q.events(parent.id) if e.type == "wait_timed_out"]
    assert [(e.generation, e.detail["children"], e.detail["pending"]) for e in timed_out] == \
        [(2, [child.id], [child.id])] * 2
    entries = [e for e in q.effects(parent.id) if e.response.get("state") == "timed_out"]
    assert [(e.idempotency_key, e.generation) for e in entries] == [("plan-t:children:0", 2), ("plan-t:children:1", 2)]
    with pytest.raises(leaseq.InvalidInput) as bad:
        third.wait_for(child, timeout=-1)
    assert bad.value.field == "timeout"
    transport.complete(w, third.claim, None)
    assert validate_queue(q) == []


def test_only_a_transaction_the_database_rolled_back_is_run_again_and_never_inside_a_joined_block(
        q: leaseq.Queue) -> None:
    """The rule behind the cancel's second run (Queue._run_again), on its own: an operation rolled
    back to break a lock cycle runs again, up to a bound; any other unavailability is the caller's
    at once; and inside a joined() block, whose transaction is the caller's, it is never run again."""
    import psycopg

    from leaseq.queue.base import ROLLED_BACK_ATTEMPTS

    def failing(calls: list[int], cause: BaseException | None) -> Any:
        def make() -> Any:
            calls.append(1)
            try:
                raise cause if cause is not None else OSError("connection refused")
            except BaseException as exc:
                raise leaseq.BackendUnavailable(f"PostgreSQL: {exc}") from exc
        return make

    for cause, runs in ((psycopg.errors.DeadlockDetected("deadlock detected"), ROLLED_BACK_ATTEMPTS),
                        (psycopg.errors.SerializationFailure("could not serialize access"), ROLLED_BACK_ATTEMPTS),
                        (None, 1)):
        calls: list[int] = []
        with pytest.raises(leaseq.BackendUnavailable):
            q._run_again(failing(calls, cause))
        assert len(calls) == runs, cause
    with q.joined() as (view, _):
        calls = []
        with pytest.raises(leaseq.BackendUnavailable):
            view._run_again(failing(calls, psycopg.errors.DeadlockDetected("deadlock detected")))
        assert calls == [1]
