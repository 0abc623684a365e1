"""A worker's renewal racing its own batched completion, and its revocation: no deadlock.

A worker renews every lease it holds in one statement while its completer
writes a batch of completions for some of them, in the order their handlers
returned; an operator may revoke it meanwhile. Each statement writes several
rows of the same worker. If two of them take those rows in different orders,
they deadlock, and PostgreSQL breaks a deadlock only after ``deadlock_timeout``
(a second by default), long enough for short leases to run out while both
wait: the completion is then refused and a handler that returned is run
again. So every such statement locks its rows in task id order.

Real threads on separate connections, started together, many rounds; the
batch is in descending id order, the opposite of the renewal's, and before
the rows were locked in order about one round in twelve deadlocked. SQLite
runs one writer at a time (no row locks); it runs anyway.

An operator's calls on a tree of tasks take the same care: approving a child's request
for more budget with a raise locks the ancestor whose budget it raises before the child,
as a cancel of that ancestor locks it before its tree (before, about one round in a few
deadlocked and the approval reached its caller as an error).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import leaseq
from leaseq.core.errors import LeaseLost, UnknownWorker

ROUNDS = 60
LEASES = 20
LEASE_SECONDS = 120.0


def _race(*calls: Callable[[], Any]) -> tuple[list[Any], list[BaseException]]:
    """Run ``calls`` in threads released together; their answers and their errors."""
    start = threading.Barrier(len(calls))
    answers: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        start.wait(timeout=30)
        try:
            answers[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a racing call never returned"
    return answers, errors


def _hold(q: leaseq.Queue, worker: Any, queue: str) -> list[Any]:
    q.enqueue_many("lock.order", [{"n": n} for n in range(LEASES)], queue=queue)
    claims = q.claim(worker, queue=queue, limit=LEASES, lease_seconds=LEASE_SECONDS)
    assert len(claims) == LEASES
    return claims


def test_a_renewal_and_a_batched_completion_of_the_same_leases_never_deadlock(q: leaseq.Queue, dsn: str):
    renewer, completer = leaseq.connect(dsn), leaseq.connect(dsn)  # two connections, as the worker's two paths
    try:
        worker = renewer.register_worker("lock-order")
        for round_ in range(ROUNDS):
            claims = _hold(renewer, worker, f"lock-order-{round_ % 3}")
            newest_first = [(c, {"n": i}) for i, c in enumerate(sorted(claims, key=lambda c: -c.task_id))]
            (renewed, completed), errors = _race(lambda: renewer.renew_leases(worker, claims),
                                                 lambda: completer.complete_many(worker, newest_first))
            assert errors == [], f"round {round_}: {errors[0]!r}"
            # Either may have gone first: every completion landed, and what the renewal
            # renewed is what it found still running (all of them, or none, or some between).
            assert completed == {c.task_id for c in claims}
            assert set(renewed) <= completed
            assert {t.status for t in map(renewer.get, completed)} == {"completed"}
    finally:
        renewer.close()
        completer.close()


def test_a_revocation_racing_the_workers_renewal_and_completion_never_deadlocks(q: leaseq.Queue, dsn: str):
    operator, renewer, completer = q, leaseq.connect(dsn), leaseq.connect(dsn)
    try:
        for round_ in range(ROUNDS // 2):
            worker = renewer.register_worker(f"lock-order-revoked-{round_}")
            claims = _hold(renewer, worker, "lock-order-revoked")
            half = sorted(claims, key=lambda c: -c.task_id)[: LEASES // 2]

            def complete() -> set[int]:
                try:
                    return completer.complete_many(worker, [(c, None) for c in half])
                except (LeaseLost, UnknownWorker):
                    return set()  # the revocation came first

            def renew() -> dict[int, Any]:
                try:
                    return renewer.renew_leases(worker, claims)
                except UnknownWorker:
                    return {}

            _, errors = _race(lambda: operator.revoke_worker(worker.id), renew, complete)
            assert errors == [], f"round {round_}: {errors[0]!r}"
            # Serialized whatever the interleaving: after the revocation, no lease of the worker is live.
            for c in claims:
                assert operator.get(c.task_id).status in ("completed", "running", "queued")
                try:
                    assert renewer.renew_leases(worker, [c]) == {}, f"task {c.task_id}: renewed after the revocation"
                except UnknownWorker:
                    pass
    finally:
        renewer.close()
        completer.close()


BUDGET_ROUNDS = 200


def _paused_child(q: leaseq.Queue, worker: Any, n: int) -> tuple[int, int]:
    """A budgeted root whose child spent the root's budget and waits for an approval (its
    request names the root as the owner whose budget ran out). The root keeps its lease."""
    queue = f"budget-race-{n}"
    root = q.enqueue("root", budget={"tok": 10}, queue=queue, effect="idempotent")
    [held] = q.claim(worker, queue=queue, kinds=["root"], lease_seconds=LEASE_SECONDS)
    child = q.spawn(worker, held, "child", queue=queue, key=f"c{n}", effect="idempotent")
    [lease] = q.claim(worker, queue=queue, kinds=["child"], lease_seconds=LEASE_SECONDS)
    paused = q.consume(worker, lease, f"c{n}:consume:0", "tok", 50)
    assert paused["state"] == "paused" and paused["figures"]["owner"] == root.id
    return root.id, child.id


def test_approving_a_childs_budget_request_racing_a_cancel_of_its_root_never_deadlocks(q: leaseq.Queue):
    """Approving a child's request for more budget with a raise writes its owner's (the root's)
    budget; cancelling the root takes its tree, the root first and the children after. Both
    lock the root first, so neither waits on the other in a cycle: each round ends with the
    approval made before the cancel (then cancelled with the tree) or refused after it (the
    child cancelled), and never with an error PostgreSQL raised to break a deadlock."""
    w = q.register_worker("budget-race")
    outcomes: dict[str, int] = {"approved": 0, "refused": 0}
    for n in range(BUDGET_ROUNDS):
        root, child = _paused_child(q, w, n)
        digest = q.approval(child).digest
        answers, errors = _race(
            lambda: q.approve(child, digest, by="alice", raise_budget={"tok": 100}),
            lambda: q.cancel(root, "stop the tree", by="bob", tree=True))
        unexpected = [e for e in errors if not isinstance(e, leaseq.InvalidTransition)]
        assert unexpected == [], f"round {n}: {unexpected!r}"
        outcomes["refused" if errors else "approved"] += 1
        assert q.get(root).status == "cancelled" and q.get(child).status == "cancelled", f"round {n}"
    assert sum(outcomes.values()) == BUDGET_ROUNDS, outcomes
