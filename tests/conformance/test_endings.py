"""One way to end an attempt: ``end_attempts`` (complete, fail, retry, release; one or many).

``Queue.complete``, ``fail``, ``retry`` and ``release`` are each a batch of one of
the engine's ``end_attempts``; a batch checks every ending before it writes
anything, completes in one statement, and leaves the attempts the lease guard
refuses out of its answer.
"""

from __future__ import annotations

import asyncio

import pytest

import leaseq
from leaseq.core.model import AttemptRef, Ending

from .support import snapshot


def test_one_batch_ends_attempts_each_its_own_way(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    for i in range(5):
        q.enqueue("job", {"n": i}, max_attempts=3)
    done, failed, retried, released, stale = q.claim(w, limit=5)
    q.cancel(stale.task_id, "operator stopped it", by="ops")
    ended, refused = q.end_attempts(w, [
        Ending(done, "complete", result={"ok": 1}),
        Ending(failed.attempt, "fail", error="boom", delay=0),  # an AttemptRef will do
        Ending(retried, "retry", after=60, reason="rate limited"),
        Ending(released, "release", reason="stopping", started=False),
        Ending(stale, "complete")])
    assert [(e.task_id, e.generation, e.outcome) for e in ended] == [
        (c.task_id, c.generation, o) for c, o in ((done, "complete"), (failed, "fail"), (retried, "retry"),
                                                  (released, "release"))]
    assert ended[0].task is None and [e.task.status for e in ended[1:] if e.task] == ["queued"] * 3
    assert refused == [stale.attempt]
    assert q.get(done.task_id).result == {"ok": 1}
    assert q.get(failed.task_id).last_error == "boom"
    assert (q.get(retried.task_id).snoozes, q.get(released.task_id).attempts) == (1, 0)
    assert q.get(stale.task_id).status == "cancelled"


@pytest.mark.parametrize("bad, field", [
    (dict(outcome="fail"), "endings.1.error"),
    (dict(outcome="fail", error="x", delay=-1), "endings.1.delay"),
    (dict(outcome="retry", reason="r", after=float("nan")), "endings.1.after"),
    (dict(outcome="release", reason="r", started="no"), "endings.1.started"),
    (dict(outcome="complete", error="x"), "endings.1.error"),
    (dict(outcome="vanish"), "endings.1.outcome"),
])
def test_a_bad_ending_refuses_the_whole_batch_and_changes_nothing(q: leaseq.Queue, dsn: str, bad: dict,
                                                                  field: str) -> None:
    w = q.register_worker("w")
    q.enqueue("job", max_attempts=3)
    q.enqueue("job", max_attempts=3)
    first, second = q.claim(w, limit=2)
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as info:
        q.end_attempts(w, [Ending(first, "complete"), Ending(second, **bad)])
    assert info.value.field == field
    assert snapshot(dsn) == before


def test_an_attempt_named_twice_or_of_another_worker_is_refused_whole(q: leaseq.Queue, dsn: str) -> None:
    w, other = q.register_worker("w"), q.register_worker("other")
    q.enqueue("job")
    [c] = q.claim(w)
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as twice:
        q.end_attempts(w, [Ending(c, "complete"), Ending(c.attempt, "release", reason="r")])
    assert twice.value.field == "endings.1.task_id"
    with pytest.raises(leaseq.InvalidInput) as foreign:
        q.end_attempts(w, [Ending(AttemptRef(c.task_id, c.generation, other.id), "complete")])
    assert foreign.value.field == "endings.0.claim"
    assert snapshot(dsn) == before


def test_the_async_queue_ends_attempts_the_same_way(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    q.enqueue("job")
    q.enqueue("job")
    a, b = q.claim(w, limit=2)
    q.fail(w, b, "ended already", retry=False)

    async def go() -> tuple[list[leaseq.core.model.Ended], list[AttemptRef]]:
        aq = leaseq.AsyncQueue(q)
        try:
            return await aq.end_attempts(w, [Ending(a, "fail", error="boom", retry=False),
                                             Ending(b, "complete")])
        finally:
            await q.close_async()

    ended, refused = asyncio.run(go())
    assert [(e.task_id, e.outcome, e.task and e.task.status) for e in ended] == [(a.task_id, "fail", "dead")]
    assert refused == [b.attempt]
