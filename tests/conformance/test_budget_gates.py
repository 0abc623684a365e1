"""A gated task paused for its budget, on both backends and every transport (the worker's
consume and the operator's approvals alike): the request for more budget is a request of
its own (schema 38). The gate the task was enqueued with keeps its record (decision,
approver, note, digest) beside it; a decision of the one never stands for the other; a
retried enqueue still finds the task it asked for, gated."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import leaseq
from leaseq import auth
from leaseq.store import parse_dsn

from .test_transports import over

TOK = "tok"


def requests_of(dsn: str, task_id: int) -> dict[str, dict[str, Any]]:
    """The task's rows of leaseq_approvals, read on a connection of the test's own, by what
    each asks for: the gate the task was enqueued with, or more budget (its reason)."""
    dialect, target = parse_dsn(dsn)
    sql = f"SELECT * FROM leaseq_approvals WHERE task_id = {int(task_id)}"
    if dialect == "sqlite":
        conn = sqlite3.connect(target)
        try:
            cur = conn.execute(sql)
            found = [dict(zip([d[0] for d in cur.description], row)) for row in cur.fetchall()]
        finally:
            conn.close()
    else:
        from pg_modes import own_connection

        with own_connection(target) as pg:
            cur = pg.execute(sql)
            found = [dict(zip([d[0] for d in cur.description], row)) for row in cur.fetchall()]
    return {("budget" if row["reason"] == "budget" else "gate"): row for row in found}


@contextlib.contextmanager
def deciding(kind: str, q: leaseq.Queue) -> Iterator[tuple[Callable[..., Any], str]]:
    """``(approve, who)``: an operator's approval made ``kind`` way (the sync Queue, the
    AsyncQueue, or POST /v1/tasks/{id}/approve through the real service); ``who`` the
    decided_by it records."""
    if kind == "sync":
        yield (lambda task_id, digest, note, more=None: q.approve(task_id, digest, note, by="alice",
                                                                   raise_budget=more)), "alice"
    elif kind == "async":
        loop = asyncio.new_event_loop()
        aq = leaseq.AsyncQueue(q)
        try:
            yield (lambda task_id, digest, note, more=None: loop.run_until_complete(
                aq.approve(task_id, digest, note, by="alice", raise_budget=more))), "alice"
        finally:
            loop.run_until_complete(q.close_async())
            loop.close()
    else:
        import httpx
        from service.conftest import serve

        with serve(q) as (url, _app):
            token, _ = auth.create_token(q, name="alice", role="operator", created_by="test", all_queues=True)
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
                def approve(task_id: int, digest: str, note: str, more: dict[str, int] | None = None) -> Any:
                    body: dict[str, Any] = {"digest": digest, "note": note}
                    if more is not None:
                        body["raise_budget"] = more
                    resp = http.post(f"/v1/tasks/{task_id}/approve", json=body)
                    assert resp.status_code == 200, resp.text
                    return resp.json()

                yield approve, "alice"


def pause_for_budget(t: Any, task_id: int) -> dict[str, Any]:
    """A worker (on transport ``t``) claims the task and consumes past its budget: the task
    pauses, asking for more."""
    w = t.register_worker("w")
    [claim] = t.claim(w)
    assert claim.task_id == task_id
    answer = t.consume(w, claim, "job:consume:0", TOK, 150)
    assert answer["state"] == "paused"
    return answer


@pytest.mark.parametrize("kind", ["sync", "async", "http"])
def test_a_budget_request_never_overwrites_the_gate_the_task_was_enqueued_with(q: leaseq.Queue, dsn: str,
                                                                              kind: str) -> None:
    task = q.enqueue("job", {"n": 1}, approval="required", budget={TOK: 100}, idempotency_key="job-1",
                     effect="idempotent")
    digest = q.approval(task.id).digest
    with deciding(kind, q) as (approve, who), over(kind, q, "worker") as worker_side:
        approve(task.id, digest, "gate: looks right")
        pause_for_budget(worker_side, task.id)  # the worker's side on the same transport
        assert q.get(task.id).status == "awaiting_approval"
        rows = requests_of(dsn, task.id)
        # the gate's record stands as decided, the budget's request beside it, undecided
        assert rows["gate"]["decision"] == "approved" and rows["gate"]["decided_by"].startswith(who)
        assert rows["gate"]["note"] == "gate: looks right" and rows["gate"]["digest"] == digest
        assert rows["budget"]["reason"] == "budget" and rows["budget"]["decision"] is None
        # a retried enqueue asks for the gated task it made: the same one, not a conflict
        again = q.enqueue("job", {"n": 1}, approval="required", budget={TOK: 100}, idempotency_key="job-1",
                          effect="idempotent")
        assert again.id == task.id
        assert q.approval(task.id).reason == "budget"  # the decision to make now is the budget's
        approve(task.id, q.approval(task.id).digest, "budget: go on", {TOK: 100})
    rows = requests_of(dsn, task.id)
    assert rows["gate"]["note"] == "gate: looks right" and rows["gate"]["decision"] == "approved"
    assert rows["budget"]["note"] == "budget: go on" and rows["budget"]["decision"] == "approved"
    assert q.get(task.id).status == "queued" and q.get(task.id).budget == {TOK: 200}
    kinds = [e.type for e in q.events(task.id)]
    assert kinds.count("approved") == 2 and "approval_requested" in kinds and "budget_exceeded" in kinds


def test_a_task_has_one_undecided_request_at_a_time(q: leaseq.Queue, dsn: str) -> None:
    """Every decision finds the request by its task alone: a second undecided row is refused
    by the database, whoever writes it."""
    task = q.enqueue("job", approval="required")
    with pytest.raises(Exception), q.store.transaction() as tx:
        tx.script(f"INSERT INTO leaseq_approvals (task_id, request, digest, requested_by, reason) "
                  f"VALUES ({task.id}, 'budget', 'x', 'someone', 'budget')")
    assert list(requests_of(dsn, task.id)) == ["gate"]


def test_denying_the_budget_request_leaves_the_gates_approval_as_it_was(q: leaseq.Queue, dsn: str) -> None:
    task = q.enqueue("job", approval="required", budget={TOK: 100}, effect="idempotent")
    q.approve(task.id, q.approval(task.id).digest, "gate ok", by="alice")
    pause_for_budget(q, task.id)
    q.deny(task.id, "spent enough", by="bob")
    rows = requests_of(dsn, task.id)
    assert (rows["gate"]["decision"], rows["gate"]["decided_by"], rows["gate"]["note"]) == ("approved", "alice",
                                                                                            "gate ok")
    assert (rows["budget"]["decision"], rows["budget"]["decided_by"]) == ("denied", "bob")
    assert q.get(task.id).status == "denied"
