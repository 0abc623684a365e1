"""`leaseq mcp`: a real MCP client talks to a real `leaseq mcp` process over stdio.

The server acts for one token: reads for a viewer (payloads hidden), operator
actions for an operator, each authorized like the HTTP API and audited via "mcp";
a refused or malformed call changes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

import leaseq
from leaseq import auth
from conformance.support import run_out
from snapshots import snapshot

pytest.importorskip("mcp")
from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402


def needs_reconciliation(q: leaseq.Queue) -> leaseq.Task:
    """A side-effecting task whose lease expired with an intent open: it waits for a person."""
    task = q.enqueue("refund", {"order": 42, "card": "4111"}, effect="side_effect")
    w = q.register_worker("w")
    [claim] = q.claim(w)
    q.begin_effect(w, claim, "payments.refund", key="refund:42")
    run_out(q, w, claim)
    q.sweep()
    assert q.get(task.id).status == "needs_reconciliation"
    return task


async def session_calls(dsn: str, token: str, calls: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], list]:
    """Start `leaseq mcp` for ``token``, list its tools and make ``calls``; (tool names, results)."""
    env = {**os.environ, "LEASEQ_MCP_TOKEN": token}
    params = StdioServerParameters(command=sys.executable, args=["-m", "leaseq.cli", "--dsn", dsn, "mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        names = [t.name for t in (await session.list_tools()).tools]
        results = [await session.call_tool(name, arguments) for name, arguments in calls]
    return names, results


def run(dsn: str, token: str, *calls: tuple[str, dict[str, Any]]) -> tuple[list[str], list]:
    return asyncio.run(asyncio.wait_for(session_calls(dsn, token, list(calls)), timeout=60))


def body(result) -> dict[str, Any]:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


def error_text(result) -> str:
    assert result.is_error, result.content
    return result.content[0].text


def test_a_viewer_reads_and_is_refused_every_operator_action(q: leaseq.Queue, dsn: str) -> None:
    task = needs_reconciliation(q)
    viewer, _ = auth.create_token(q, name="oncall-viewer", role="viewer", created_by="test")
    before = snapshot(dsn)
    names, (who, inbox, shown, overview, cancel, reconcile) = run(
        dsn, viewer,
        ("whoami", {}), ("reconciliation_inbox", {}), ("get_task", {"task_id": task.id}), ("queue_overview", {}),
        ("cancel", {"task_id": task.id, "reason": "viewer tries"}),
        ("reconcile", {"task_id": task.id, "outcome": "requeue", "note": "viewer tries"}))
    assert {"queue_overview", "list_tasks", "get_task", "reconciliation_inbox", "list_workers",
            "cancel", "reconcile", "requeue", "unblock", "pause", "resume", "revoke_worker"} <= set(names)
    assert body(who)["role"] == "viewer" and body(who)["may"] == []
    [waiting] = body(inbox)["tasks"]
    assert waiting["id"] == task.id and waiting["payload"] != task.payload  # a viewer sees no payloads
    assert [fx["action"] for fx in waiting["open_effects"]] == ["payments.refund"]
    assert {"lease_expired", "needs_reconciliation"} <= {e["type"] for e in body(shown)["events"]}
    [default] = body(overview)["queues"]
    assert default["name"] == "default" and default["counts"]["needs_reconciliation"] == 1
    for refused in (cancel, reconcile):
        assert "AccessDenied" in error_text(refused) and "viewer" in error_text(refused)
    after = snapshot(dsn)
    for state in (before, after):  # the token's last-used time moves: that is all
        state.pop("leaseq_tokens")
    assert after == before  # refused actions change nothing, not even the audit log


def test_an_operator_action_is_performed_and_audited_via_mcp(q: leaseq.Queue, dsn: str) -> None:
    task = needs_reconciliation(q)
    operator, _ = auth.create_token(q, name="oncall", role="operator", created_by="test")
    before = snapshot(dsn)
    _, (bad, done) = run(
        dsn, operator,
        ("reconcile", {"task_id": task.id, "outcome": "maybe", "note": "?"}),
        ("reconcile", {"task_id": task.id, "outcome": "requeue", "note": "the refund never reached the bank"}))
    assert "outcome" in error_text(bad) and "InvalidInput" in error_text(bad)
    assert body(done)["done"] == f"task {task.id} reconciled: requeue"
    assert q.get(task.id).status == "queued"
    [entry] = [a for a in auth.audit_log(q) if a["action"] == "reconcile"]
    assert entry["actor"].startswith("oncall (operator token ") and entry["detail"]["via"] == "mcp"
    assert entry["target"] == f"task:{task.id}"
    assert len(snapshot(dsn)["leaseq_audit"]) == len(before["leaseq_audit"]) + 1


@pytest.mark.parametrize("dsn", ["sqlite"], indirect=True)
def test_without_a_valid_token_the_server_does_not_start(q: leaseq.Queue, dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LEASEQ_MCP_TOKEN"}
    for extra, expected in (([], "error: token: required"), (["--token", "lq_not-a-token"], "error: ")):
        proc = subprocess.run([sys.executable, "-m", "leaseq.cli", "--dsn", dsn, "mcp", *extra],
                              capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
        assert proc.returncode != 0 and expected in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_approvals_through_mcp_a_viewer_is_refused_an_operator_decides(q: leaseq.Queue, dsn: str) -> None:
    gated = q.enqueue("payments.refund", {"order": 7, "cents": 1250}, queue="payments", effect="side_effect",
                      approval="required", by="agent-7")
    other = q.enqueue("payments.refund", {"order": 8}, queue="payments", approval="required")
    digest = q.approval(gated.id).digest
    viewer, _ = auth.create_token(q, name="oncall-viewer", role="viewer", created_by="test")
    operator, _ = auth.create_token(q, name="oncall", role="operator", created_by="test")
    names, (inbox, refused) = run(dsn, viewer, ("approvals_inbox", {}),
                                  ("approve", {"task_id": gated.id, "digest": digest}))
    assert {"approvals_inbox", "approve", "deny"} <= set(names)
    first = body(inbox)["approvals"][0]
    assert (first["task_id"], first["digest"], first["requested_by"]) == (gated.id, "[redacted]", "agent-7")
    assert first["task"]["payload"] == "[redacted]"  # neither the payload nor its guessable digest
    assert "AccessDenied" in error_text(refused) and q.get(gated.id).status == "awaiting_approval"

    wrong = leaseq.approval_digest("payments.refund", {"order": 7, "cents": 999999}, "payments")
    _, (shown, mismatch, approved, denied) = run(
        dsn, operator, ("approvals_inbox", {"queue": "payments"}),
        ("approve", {"task_id": gated.id, "digest": wrong}),
        ("approve", {"task_id": gated.id, "digest": digest, "note": "checked the order"}),
        ("deny", {"task_id": other.id, "reason": "never paid"}))
    assert body(shown)["approvals"][0]["task"]["payload"] == {"order": 7, "cents": 1250}
    assert "ApprovalMismatch" in error_text(mismatch) and digest not in error_text(mismatch)
    assert body(approved)["done"] == f"task {gated.id} approved" and q.get(gated.id).status == "queued"
    assert body(denied)["done"] == f"task {other.id} denied" and q.get(other.id).status == "denied"
    decided = q.approval(gated.id)
    assert decided.decided_by.startswith("oncall (operator token ") and decided.decided_via == "mcp"
    actions = sorted(a["action"] for a in auth.audit_log(q) if a["action"] in ("approve", "deny"))
    assert actions == ["approve", "deny"]


def test_a_revoked_token_is_refused_at_its_next_call_and_the_server_stops(q: leaseq.Queue, dsn: str) -> None:
    task = q.enqueue("refund", {"order": 42})
    token, record = auth.create_token(q, name="oncall", role="operator", created_by="test")

    async def session() -> tuple[Any, Any, BaseException | None]:
        params = StdioServerParameters(command=sys.executable, args=["-m", "leaseq.cli", "--dsn", dsn, "mcp"],
                                       env={**os.environ, "LEASEQ_MCP_TOKEN": token})
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            before = await client.call_tool("whoami", {})
            auth.revoke_token(q, record["id"], by="test-admin")  # while the agent is connected
            refused = await client.call_tool("cancel", {"task_id": task.id, "reason": "after revocation"})
            after: BaseException | None = None
            try:  # the server stops: every answer until then is a refusal, then nothing answers
                async with asyncio.timeout(20):
                    while True:
                        assert "revoked" in error_text(await client.call_tool("queue_overview", {}))
            except TimeoutError:
                pass
            except Exception as exc:  # the closed connection, as the client reports it
                after = exc
        return before, refused, after

    try:
        before, refused, after = asyncio.run(asyncio.wait_for(session(), timeout=60))
    except BaseException as exc:  # the client's task group may report the closed pipe itself
        pytest.fail(f"the session failed before the server stopped: {exc!r}")
    assert body(before)["name"] == "oncall"
    assert "revoked" in error_text(refused)
    assert after is not None and not isinstance(after, asyncio.TimeoutError), after
    assert q.get(task.id).status == "queued"  # nothing done under the revoked name
    assert [a for a in auth.audit_log(q) if a["action"] == "cancel"] == []


@pytest.mark.parametrize("dsn", ["sqlite"], indirect=True)
def test_a_token_on_the_command_line_is_warned_about(q: leaseq.Queue, dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LEASEQ_MCP_TOKEN"}
    bogus = "lq_" + "0" * 12 + "_" + "0" * 64
    proc = subprocess.run([sys.executable, "-m", "leaseq.cli", "--dsn", dsn, "mcp", "--token", bogus],
                          capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0 and "warning: --token puts the token on the command line" in proc.stderr
    quiet = subprocess.run([sys.executable, "-m", "leaseq.cli", "--dsn", dsn, "mcp"], capture_output=True,
                           text=True, env={**env, "LEASEQ_MCP_TOKEN": bogus}, timeout=60, stdin=subprocess.DEVNULL)
    assert quiet.returncode != 0 and "warning" not in quiet.stderr and "invalid token" in quiet.stderr, quiet.stderr
    assert "Traceback" not in proc.stderr + quiet.stderr


def test_a_queue_limited_token_sees_and_acts_on_its_queues_only(q: leaseq.Queue, dsn: str) -> None:
    task = needs_reconciliation(q)  # on queue "default"
    mine = q.enqueue("job", {"n": 1}, queue="mine")
    operator, _ = auth.create_token(q, name="oncall", role="operator", queues=["mine"], created_by="test")
    trail = q.events(task.id)
    _, (listed, inbox, overview, other, workers, cancel_other, cancel_mine) = run(
        dsn, operator,
        ("list_tasks", {}), ("reconciliation_inbox", {}), ("queue_overview", {}),
        ("get_task", {"task_id": task.id}), ("list_workers", {}),
        ("cancel", {"task_id": task.id, "reason": "not mine"}),
        ("cancel", {"task_id": mine.id, "reason": "mine"}))
    assert [t["id"] for t in body(listed)["tasks"]] == [mine.id]
    assert body(inbox)["tasks"] == []
    assert [row["name"] for row in body(overview)["queues"]] == ["mine"]
    for refused in (other, workers, cancel_other):
        assert "AccessDenied" in error_text(refused) and "limited to queues mine" in error_text(refused)
    assert body(cancel_mine)["outcome"]["status"] == "cancelled"
    assert q.get(task.id).status == "needs_reconciliation" and q.events(task.id) == trail
    assert [e["target"] for e in auth.audit_log(q) if e["action"] == "cancel"] == [f"task:{mine.id}"]
