"""Two remote workers racing with overlapping batches: the guards hold per task.

Each round, worker A holds a batch of short leases. As they run out, A
completes and renews the whole batch while B claims (routing the expired
leases to itself), completes and renews what it got, and also sends A's
claims as if they were its own, all at once, over HTTP. Whatever the
interleaving: every task is completed exactly once, by the holder of the
generation that completed it; each worker's answers agree with the
database; nobody completes a task it did not hold.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import leaseq

ROUNDS = 25
TASKS = 8


def _events(q: leaseq.Queue, task_id: int) -> list[leaseq.Event]:
    return q.events(task_id)


def test_overlapping_batches_never_complete_a_task_twice(svc) -> None:
    a_rq = svc.remote(svc.token("worker", name="a", all_queues=True))
    b_rq = svc.remote(svc.token("worker", name="b", all_queues=True))
    a, b = a_rq.register_worker("a"), b_rq.register_worker("b")
    all_ids: list[int] = []
    completed_by: dict[str, set[int]] = {"a": set(), "b": set()}
    for rnd in range(ROUNDS):
        ids = [svc.q.enqueue("job", {"round": rnd, "n": i}, queue=f"r{rnd}", lease_seconds=0.15).id
               for i in range(TASKS)]
        all_ids += ids
        held = a_rq.claim(a, queue=f"r{rnd}", limit=TASKS)
        assert len(held) == TASKS
        start = threading.Barrier(4)
        errors: list[BaseException] = []
        b_claims: list[leaseq.Claim] = []

        def run(fn: Any) -> None:
            try:
                start.wait(5)
                fn()
            except BaseException as exc:  # reported below
                errors.append(exc)

        # A answers around the moment its leases run out: before, at, or after it.
        late = random.uniform(0.08, 0.22)

        def a_complete() -> None:
            time.sleep(late)
            completed_by["a"].update(a_rq.complete_many(a, [(c, {"by": "a"}) for c in held]))

        def a_renew() -> None:
            time.sleep(late * random.random())
            a_rq.renew_leases(a, held)

        def b_take_over() -> None:
            for _ in range(30):  # until A's leases run out (or A finished them)
                got = b_rq.claim(b, queue=f"r{rnd}", limit=TASKS, lease_seconds=30)
                b_claims.extend(got)
                if got:
                    break
                time.sleep(0.01)
            b_rq.renew_leases(b, b_claims)
            completed_by["b"].update(b_rq.complete_many(b, [(c, {"by": "b"}) for c in b_claims]))

        def b_impersonate() -> None:
            # A's claims re-labelled as B's: the guard checks the holder, so none may pass.
            forged = [leaseq.Claim(task_id=c.task_id, generation=c.generation, worker_id=b.id,
                                   expires_at=c.expires_at, task=c.task) for c in held]
            done = b_rq.complete_many(b, [(c, {"by": "forger"}) for c in forged])
            assert done == set(), done
            assert b_rq.renew_leases(b, forged) == {}

        threads = [threading.Thread(target=run, args=(fn,)) for fn in (a_complete, a_renew, b_take_over,
                                                                     b_impersonate)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        # Whatever neither finished (B claimed nothing and A was too late) is finished by B now
        # (B's own leases are long: only A's run out in this test).
        deadline = time.monotonic() + 5
        while any(svc.q.get(i).status != "completed" for i in ids) and time.monotonic() < deadline:
            leftover = b_rq.claim(b, queue=f"r{rnd}", limit=TASKS, lease_seconds=30)
            completed_by["b"].update(b_rq.complete_many(b, [(c, {"by": "b"}) for c in leftover]))
            assert not {c.task_id for c in leftover} & completed_by["a"]
            time.sleep(0.02)

    assert completed_by["a"].isdisjoint(completed_by["b"])
    assert completed_by["a"] | completed_by["b"] == set(all_ids)
    stored = {t.id: t for t in svc.q.list_tasks(limit=len(all_ids) + 10)}
    for task_id in all_ids:
        task = stored[task_id]
        assert task.status == "completed", task
        who = "a" if task_id in completed_by["a"] else "b"
        assert task.result == {"by": who}, task
        events = _events(svc.q, task_id)
        done = [e for e in events if e.type == "completed"]
        assert len(done) == 1, events
        holder = {e.generation: e.worker_id for e in events if e.type == "claimed"}
        assert holder[done[0].generation] == done[0].worker_id == (a.id if who == "a" else b.id)
    assert Counter(e.type for t in all_ids for e in _events(svc.q, t))["completed"] == len(all_ids)
