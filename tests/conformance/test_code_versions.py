"""Code changes under replay, on every transport (sync, async, HTTP) and both backends: a
task records the code version it started under, a worker claims a started task only under a
version it declares compatible, and a retried handler that no longer matches its recorded run
ends its attempt in needs_reconciliation, naming the entry."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import leaseq
from leaseq.worker.context import TaskContext

from .test_transports import transport  # noqa: F401  (the fixture: sync, async and HTTP transports)

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def test_a_worker_claims_a_started_task_only_under_a_version_it_serves(q: leaseq.Queue,
                                                                       transport: Any) -> None:  # noqa: F811
    v1 = transport.register_worker("v1", version="1")
    v2 = transport.register_worker("v2", version="2")  # serves tasks started under 2 only
    both = transport.register_worker("v2-reads-1", version="2", compatible_versions=["1"])
    anyone = transport.register_worker("unversioned")  # no version: serves any task, stamps none
    assert (v2.code_version, v2.compatible_versions) == ("2", ["2"])
    assert (both.code_version, both.compatible_versions) == ("2", ["1", "2"])
    assert (anyone.code_version, anyone.compatible_versions) == (None, None)

    started = q.enqueue("agent", {"n": 1}, max_attempts=10)
    assert q.get(started.id).code_version is None  # not started yet
    [first] = transport.claim(v1)
    assert first.task_id == started.id and first.task.code_version == "1"  # the first claim stamps it
    transport.fail(v1, first, "crashed", delay=0)
    assert transport.claim(v2) == []  # started under 1: not for a worker that serves only 2
    fresh = q.enqueue("agent", {"n": 2}, max_attempts=10)
    [mine] = transport.claim(v2)  # a task not started yet is claimable by every worker
    assert mine.task_id == fresh.id and mine.task.code_version == "2"
    transport.complete(v2, mine, None)
    [served] = transport.claim(both)  # declares 1 compatible: takes it, and the task keeps its version
    assert served.task_id == started.id and served.task.code_version == "1"
    transport.fail(both, served, "crashed again", delay=0)
    [other] = transport.claim(anyone)
    assert other.task_id == started.id and other.task.code_version == "1"
    transport.complete(anyone, other, None)
    assert q.get(started.id).code_version == "1" and q.get(fresh.id).code_version == "2"

    unstamped = q.enqueue("agent", {"n": 3}, max_attempts=10)
    [c] = transport.claim(anyone)  # a worker without a version leaves it unstamped
    assert c.task.code_version is None
    transport.fail(anyone, c, "crashed", delay=0)
    [c] = transport.claim(v2)  # so any worker may take it, and the first with a version stamps it
    assert c.task_id == unstamped.id and c.task.code_version == "2"


def test_a_versions_declaration_is_checked(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    with pytest.raises(leaseq.InvalidInput) as refused:
        transport.register_worker("w", compatible_versions=["1"])
    assert refused.value.field == "compatible_versions"
    with pytest.raises(leaseq.InvalidInput) as refused:
        transport.register_worker("w", version="not a version!")
    assert refused.value.field == "version"
    with pytest.raises(leaseq.InvalidInput) as refused:
        transport.register_worker("w", version="2", compatible_versions="1")
    assert refused.value.field == "compatible_versions"
    assert q.workers() == []  # nothing registered


def test_a_retried_handler_with_other_tool_calls_ends_in_needs_reconciliation(q: leaseq.Queue,
                                                                              transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a", version="1")
    task = q.enqueue("agent", {}, idempotency_key="plan-1", max_attempts=2)
    made: list[str] = []

    def search(query: str) -> list[str]:
        made.append(query)
        return [f"result for {query}"]

    def handler(ctx: TaskContext, query: str) -> list[str]:
        found: list[str] = ctx.tool(search, action="web.search", effect="read_only")(query)
        return found

    [claim] = transport.claim(w)
    handler(TaskContext(transport, w, claim, LOG), "leases")
    transport.fail(w, claim, "crashed after the search", delay=0)
    [claim] = transport.claim(w)  # the last attempt its budget allows
    ctx = TaskContext(transport, w, claim, LOG)
    with pytest.raises(leaseq.ToolCallDiverged) as diverged:
        handler(ctx, "fences")  # the code changed: the recorded call had other arguments
    assert diverged.value.idempotency_key == "plan-1:web.search:0" and made == ["leases"]
    held = q.get(task.id)
    # not a failure: the attempt is given back (a failure here would have made it dead)
    assert (held.status, held.attempts, held.lease_owner) == ("needs_reconciliation", 1, None)
    assert "plan-1:web.search:0" in (held.last_error or "") and held.code_version == "1"
    events = q.events(task.id)
    [event] = [e for e in events if e.type == "diverged"]
    assert event.generation == claim.generation and event.detail["idempotency_key"] == "plan-1:web.search:0"
    assert event.detail["recorded"]["args_digest"] != event.detail["requested"]["args_digest"]
    assert event.detail["recorded"]["action"] == event.detail["requested"]["action"] == "web.search"
    # the second attempt: claimed, diverged, to reconciliation (no failure recorded)
    assert [e.type for e in events][-3:] == ["claimed", "diverged", "needs_reconciliation"]
    assert "diverged from its recorded run" in events[-1].detail["reason"]
    with pytest.raises(leaseq.LeaseLost):  # the attempt has ended
        transport.complete(w, claim, ["late"])
    # a person resolves it: requeued once the code is fixed, it runs again
    assert q.reconcile(task.id, "requeue", "deployed the fix", by="ann").status == "queued"
    [again] = transport.claim(w)
    assert again.task_id == task.id and again.generation == claim.generation + 1
