"""Retention: every column that can carry user data is cleared from ended tasks, every
ended status is pruned, and an evidence record without user data outlives the task on
a retention of its own. Live tasks are never touched.

Each ended task below carries the marker ``ENDED-SECRET`` in every place a user's data
can reach (payload, result, error text, effect and tool responses, reasons and notes,
an intent's payload, a gated task's approval); each live task carries ``LIVE-SECRET``.
The checks read every column of every table, so a column added later that keeps user
data fails them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import timedelta
from typing import Any

import pytest

import leaseq
from leaseq import auth
from leaseq.store import parse_dsn

from .support import age_tasks, own_connection

DAY = 86400.0
#: Every status a task ends in (leaseq.engine.schema.ENDED_STATUSES says the same).
ENDED_STATUSES = ("completed", "cancelled", "dead", "denied", "expired")
ENDED = "ENDED-SECRET"
LIVE = "LIVE-SECRET"

#: Every text or JSON column of the schema, and what retention does with it. A column
#: that is not listed fails test_every_text_column_is_classified: decide, then list it.
CLEARED = "cleared at the payload cut-off, deleted with the task"
COLUMNS: dict[str, str] = {
    # a task's own data
    "leaseq_tasks.payload": CLEARED,
    "leaseq_tasks.result": CLEARED,
    "leaseq_tasks.last_error": CLEARED,
    "leaseq_effects.response": CLEARED,  # model and tool output, an intent's answer
    "leaseq_effects.args_digest": CLEARED,  # a tool call's arguments, hashed (guessable)
    "leaseq_approvals.note": CLEARED,  # an approval's note, a denial's reason
    "leaseq_approvals.digest": CLEARED,  # unsalted: a payload can be guessed from it
    "leaseq_signals.payload": CLEARED,  # what a person or a system sent the task
    "leaseq_stream_items.item": "deleted at the payload cut-off (or by the streams' own retention), with the task",
    "leaseq_events.detail": "reduced to EVIDENCE_KEYS at the payload cut-off, copied so to the evidence record",
    "leaseq_audit.detail": "a task's entries reduced to EVIDENCE_KEYS (reasons, notes, digests go)",
    "leaseq_evidence.detail": "EVIDENCE_KEYS only, by construction",
    # names, identifiers, states and declarations: not user data (deleted with the task)
    **{f"leaseq_tasks.{c}": "identifier or declaration" for c in (
        "queue", "kind", "effect", "status", "lease_owner", "idempotency_key", "error_fingerprint", "actions",
        "trace_context", "limits", "resources", "singleton_key", "debounce_key", "wait_signal", "wait_children",
        "code_version", "fairness_key")},
    **{f"leaseq_signals.{c}": "identifier or sender (deleted with the task)" for c in (
        "name", "sent_by", "consumed_key")},
    **{f"leaseq_stream_items.{c}": "state or identifier (deleted with the entry)" for c in (
        "type", "ledger_key", "worker_id")},
    **{f"leaseq_effects.{c}": "identifier or state" for c in (
        "worker_id", "action", "idempotency_key", "status", "effect", "resource")},
    **{f"leaseq_approvals.{c}": "who asked and who decided" for c in (
        "requested_by", "decision", "decided_by", "decided_via", "requested_worker", "requested_token")},
    **{f"leaseq_action_tokens.{c}": "a token's hash and claims" for c in (
        "token_hash", "action", "idempotency_key", "resource", "queue")},
    "leaseq_events.type": "state", "leaseq_events.worker_id": "identifier",
    **{f"leaseq_evidence.{c}": "identifier or state" for c in ("queue", "kind", "task_status", "type", "worker_id")},
    "leaseq_dependencies.on_failure": "state",
    **{f"leaseq_audit.{c}": "who, what, which target" for c in ("actor", "action", "target")},
    # not task data
    **{f"leaseq_tokens.{c}": "credentials (not task data)" for c in (
        "id", "name", "role", "secret_hash", "queues", "created_by", "revoked_by")},
    **{f"leaseq_workers.{c}": "worker identity (not task data)" for c in (
        "id", "name", "token_id", "db_role", "stop_reason", "code_version", "compatible_versions")},
    **{f"leaseq_worker_kinds.{c}": "declaration (not task data)" for c in (
        "worker_id", "kind", "queue", "effect", "actions", "signature")},
    **{f"leaseq_db_roles.{c}": "database roles (not task data)" for c in ("role", "kind", "queues", "created_by")},
    **{f"leaseq_sessions.{c}": "dashboard sessions (not task data)" for c in ("id_hash", "token_id")},
    **{f"leaseq_leader.{c}": "maintenance leadership" for c in ("name", "holder")},
    **{f"leaseq_limits.{c}": "declaration" for c in ("key", "counts", "changed_by")},
    # budgets settled after the call (schema 31): usage by limit key, not task data
    "leaseq_tasks.budget": "declaration (units by limit key)", "leaseq_tasks.spent": "usage (units by limit key)",
    "leaseq_limit_charges.key": "limit key (deleted when the attempt ends, or with the task)",
    "leaseq_limit_spend.key": "usage by limit key and day (not task data)",
    # schema 40: the tenant the usage was settled for (a fairness key), pruned with its day
    "leaseq_limit_spend.tenant": "usage by limit key, tenant and day (a fair-share key)",
    "leaseq_approvals.reason": "why a person is asked", "leaseq_approvals.detail": "a budget's figures",
    "leaseq_approvals.request": "which request: the gate or more budget (schema 38)",
    # budgets that cover the tree (schema 34): one row per budget owner and key, deleted with the owner
    "leaseq_tasks.budget_owners": "task ids (the budgets that cover the task)",
    "leaseq_budgets.key": "limit key (deleted with the task whose budget it is)",
    **{f"leaseq_queues.{c}": "queue switch" for c in ("name", "changed_by")},
    "leaseq_migrations.name": "schema",
    # one lock row per singleton or debounce key an enqueue named (not pruned yet: the keys are
    # the application's own, as idempotency keys are)
    **{f"leaseq_flow_keys.{c}": "flow-control key lock" for c in ("scope", "queue", "key")},
    # one row per fairness key a claim served, with its virtual time (pruned once idle)
    **{f"leaseq_fairness.{c}": "fair-share key's turn" for c in ("queue", "key")},
    # PostgreSQL (schema 37): the keys' turns in shares, one per claiming connection (the view
    # leaseq_fairness above sums them)
    **{f"leaseq_fairness_shares.{c}": "fair-share key's turn" for c in ("queue", "key")},
    # PostgreSQL (schema 39): one row per queue a task naming a key was written to (its claims
    # run in full); a queue name, kept as leaseq_queues keeps one
    "leaseq_full_claims.queue": "queue switch",
    # PostgreSQL (schema 40): one row per queue a task naming a limit or a singleton key was
    # written to (its one-key claims test them); a queue name, as above
    "leaseq_limited_claims.queue": "queue switch",
}
#: Columns of tables only PostgreSQL has.
POSTGRES_ONLY = {"leaseq_fairness_shares.queue", "leaseq_fairness_shares.key", "leaseq_full_claims.queue",
                 "leaseq_limited_claims.queue"}


def _text_columns(dsn: str) -> set[str]:
    dialect, target = parse_dsn(dsn)
    if dialect == "sqlite":
        conn = sqlite3.connect(target)
        try:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'leaseq_%'")]
            return {f"{t}.{c[1]}" for t in tables for c in conn.execute(f"PRAGMA table_info({t})")
                    if c[2].upper() == "TEXT"}
        finally:
            conn.close()
    with own_connection(target) as conn:
        return {f"{t}.{c}" for t, c in conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name LIKE 'leaseq%%' "
            "AND data_type IN ('text', 'jsonb', 'json', 'ARRAY', 'character varying')")}


def _dump(dsn: str) -> dict[str, list[str]]:
    """Every row of every leaseq table, as text."""
    dialect, target = parse_dsn(dsn)
    found: dict[str, list[str]] = {}
    if dialect == "sqlite":
        conn = sqlite3.connect(target)
        try:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'leaseq_%'")]
            for t in tables:
                found[t] = [repr(r) for r in conn.execute(f"SELECT * FROM {t}")]
        finally:
            conn.close()
        return found
    with own_connection(target) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() AND table_name LIKE 'leaseq%%'")]
        for t in tables:
            found[t] = [r[0] for r in conn.execute(f"SELECT x::text FROM {t} x")]
    return found


def _where(dsn: str, marker: str) -> list[str]:
    return [f"{t}: {row}" for t, rows in _dump(dsn).items() for row in rows if marker in row]


def _age_evidence(dsn: str, seconds: float) -> None:
    """Move every evidence record's ``ended_at`` back by ``seconds`` (a test's own write)."""
    dialect, target = parse_dsn(dsn)
    if dialect == "sqlite":
        conn = sqlite3.connect(target)
        try:
            with conn:
                conn.execute("UPDATE leaseq_evidence SET ended_at = ended_at - ?", (seconds,))
        finally:
            conn.close()
        return
    with own_connection(target) as conn:
        conn.execute("UPDATE leaseq_evidence SET ended_at = ended_at - %s * interval '1 second'", (seconds,))


def _digest(q: leaseq.Queue, task_id: int) -> str:
    [req] = [e for e in q.events(task_id) if e.type == "approval_requested"]
    return str(req.detail["digest"])


def _ended_tasks(q: leaseq.Queue) -> dict[str, int]:
    """One task in each ended status (and a few ways into them), each carrying ENDED
    wherever user data can go."""
    w = q.register_worker("w")
    s = f"{ENDED} the customer's words"
    made: dict[str, int] = {}

    # completed: effect response, tool call, retry reason, lost-lease report, release reason, intent
    t = q.enqueue("job", {"text": s}, effect="side_effect", queue="ended")
    [c] = q.claim(w, queue="ended")
    q.retry(w, c, reason=s)
    [c] = q.claim(w, queue="ended")
    q.release(w, c, reason=s)
    [c] = q.claim(w, queue="ended")
    fx = q.begin_effect(w, c, "email.send")
    q.finish_effect(w, c, fx, {"model_output": s})
    tool = q.begin_effect(w, c, "search", effect="read_only", args_digest="ab" * 32)
    q.finish_effect(w, c, tool, {"tool_output": s})
    child = q.intend(w, c, "executor", {"intent": s}, key="k1", queue="ended-intents")
    q.signal(t.id, "reply", {"text": s}, by="ops")  # kept for a wait that never comes
    q.emit(w, c, {"progress": s})  # the task's stream: what the handler emitted
    q.emit(w, c, {"plan": s}, key=f"{t.idempotency_key}:emit:0")  # durable: in the ledger too
    q.complete(w, c, {"answer": s})
    made["completed"] = t.id
    # the intent's own task ends too (cancelled by a person, with a reason)
    q.cancel(child.id, reason=s, by="ops")
    made["cancelled-intent"] = child.id

    # completed after approval (note), and after reconciliation (note, result)
    t = q.enqueue("job", {"text": s}, queue="ended", approval="required", by="alice")
    q.approve(t.id, _digest(q, t.id), note=s, by="bob")
    [c] = q.claim(w, queue="ended")
    q.complete(w, c, {"answer": s})
    made["completed-approved"] = t.id
    t = q.enqueue("job", {"text": s}, effect="side_effect", queue="ended")
    [c] = q.claim(w, queue="ended")
    q.begin_effect(w, c, "payment.charge")
    q.fail(w, c, s)  # an open intent: needs_reconciliation
    q.reconcile(t.id, "completed", note=s, result={"answer": s}, by="ops")
    made["completed-reconciled"] = t.id

    # dead (error text), after a requeue (note)
    t = q.enqueue("job", {"text": s}, queue="ended")
    [c] = q.claim(w, queue="ended")
    q.fail(w, c, s, retry=False)
    q.requeue(t.id, note=s, by="ops")
    [c] = q.claim(w, queue="ended")
    q.report_loss(w, c, s)
    q.fail(w, c, s, retry=False)
    made["dead"] = t.id

    # cancelled while running (reason)
    t = q.enqueue("job", {"text": s}, queue="ended")
    [c] = q.claim(w, queue="ended")
    q.cancel(t.id, reason=s, by="ops")
    made["cancelled"] = t.id

    # denied (reason), by a person
    t = q.enqueue("job", {"text": s}, queue="ended", approval="required", by="alice")
    q.deny(t.id, reason=s, by="bob")
    made["denied"] = t.id

    # expired: its deadline passed before it started
    t = q.enqueue("job", {"text": s}, queue="ended-late", deadline=timedelta(seconds=0.2))
    deadline = time.monotonic() + 10
    while q.get(t.id).status != "expired":
        assert time.monotonic() < deadline, "the deadline did not pass"
        time.sleep(0.05)
        q.sweep()
    made["expired"] = t.id
    for name, task_id in made.items():
        assert q.get(task_id).status in ENDED_STATUSES, (name, q.get(task_id).status)
    assert {q.get(i).status for i in made.values()} == set(ENDED_STATUSES)
    return made


def _live_tasks(q: leaseq.Queue) -> dict[str, int]:
    """A task in each live (or waiting-for-a-person) status, carrying LIVE."""
    w = q.register_worker("live")
    s = f"{LIVE} still needed"
    made: dict[str, int] = {}
    made["queued"] = q.enqueue("job", {"text": s}, queue="live-queued").id
    t = q.enqueue("job", {"text": s}, effect="side_effect", queue="live-running", lease_seconds=3600)
    [c] = q.claim(w, queue="live-running")
    fx = q.begin_effect(w, c, "email.send")
    q.finish_effect(w, c, fx, {"model_output": s})
    q.emit(w, c, {"progress": s})
    made["running"] = t.id
    made["awaiting_approval"] = q.enqueue("job", {"text": s}, queue="live-gated", approval="required",
                                          by="alice").id
    t = q.enqueue("job", {"text": s}, queue="live-blocked")
    [c] = q.claim(w, queue="live-blocked")
    made["blocked"] = q.fail(w, c, s, block=True).id
    t = q.enqueue("job", {"text": s}, effect="side_effect", queue="live-recon")
    [c] = q.claim(w, queue="live-recon")
    q.begin_effect(w, c, "payment.charge")
    made["needs_reconciliation"] = q.fail(w, c, s).id
    made["waiting"] = q.enqueue("job", {"text": s}, queue="live-waiting", after=[made["queued"]]).id
    for name, task_id in made.items():
        assert q.get(task_id).status == name
    return made


def _snapshot(q: leaseq.Queue, ids: dict[str, int]) -> dict[str, Any]:
    return {name: (q.get(i), q.events(i), q.effects(i), list(q.stream(i, follow=False))) for name, i in ids.items()}


def _evidence_keys() -> set[str]:
    from leaseq.engine.schema import EVIDENCE_KEYS

    return set(EVIDENCE_KEYS)


def test_the_ended_statuses_are_the_schemas(q: leaseq.Queue) -> None:
    from leaseq.core.model import Status
    from leaseq.engine.schema import ENDED_STATUSES as declared

    assert set(declared) == set(ENDED_STATUSES)
    waiting_for_a_person = {"blocked", "needs_reconciliation"}
    live = {"queued", "running", "waiting", "awaiting_approval"}
    assert {s.value for s in Status} == set(ENDED_STATUSES) | waiting_for_a_person | live


def test_every_text_column_is_classified(q: leaseq.Queue, dsn: str) -> None:
    """Each column that can hold text is listed in COLUMNS with what retention does with it."""
    found = _text_columns(dsn)
    listed = COLUMNS.keys() - (set() if q.dialect == "postgres" else POSTGRES_ONLY)
    assert found - listed == set(), "classify these columns in COLUMNS (user data or not)"
    assert listed - found == set(), "these columns are gone: take them out of COLUMNS"


def test_retention_clears_user_data_then_prunes_every_ended_status(q: leaseq.Queue, dsn: str) -> None:
    ended = _ended_tasks(q)
    live = _live_tasks(q)
    age_tasks(dsn, [*ended.values(), *live.values()], 40 * DAY)
    assert _where(dsn, ENDED) and _where(dsn, LIVE)
    before = _snapshot(q, live)

    # 1. the payload cut-off: every ended task keeps its row, and no user data
    counts = q.prune(60 * DAY, payloads_older_than_seconds=30 * DAY, batch=2)
    assert _where(dsn, ENDED) == []
    assert counts["tasks"] == 0 and counts["payloads"] == len(ended)
    for task_id in ended.values():
        task = q.get(task_id)
        assert task.payload is None and task.result is None and task.last_error is None
        assert list(q.stream(task_id)) == []  # the stream, what the handler emitted, is gone
        assert all(fx.response is None and fx.args_digest is None for fx in q.effects(task_id))
        for e in q.events(task_id)[1:]:  # the first is the row's own "enqueued" entry
            assert set(e.detail) <= _evidence_keys(), (e.type, e.detail)
    approval = q.approval(ended["completed-approved"])
    assert (approval.decision, approval.decided_by, approval.note, approval.digest) == \
        ("approved", "bob", None, "cleared")
    assert _snapshot(q, live) == before  # live tasks untouched
    try:  # a cleared dead task has nothing left to run on
        q.requeue(ended["dead"], note="again", by="ops")
        raise AssertionError("a dead task whose payload was cleared was requeued")
    except leaseq.InvalidTransition as exc:
        assert "retention cleared" in str(exc)
    assert q.prune(60 * DAY, payloads_older_than_seconds=30 * DAY)["payloads"] == 0  # cleared once

    # 2. the task cut-off: every ended status is pruned, each leaving its evidence record
    counts = q.prune(30 * DAY, batch=3)
    assert counts["tasks"] == len(ended) and counts["evidence"] > len(ended)
    for name, task_id in ended.items():
        try:
            q.get(task_id)
            raise AssertionError(f"{name} task {task_id} was not pruned")
        except leaseq.NotFound:
            pass
    assert _where(dsn, ENDED) == []
    assert _snapshot(q, live) == before
    record = {name: q.evidence_record(task_id) for name, task_id in ended.items()}
    for name, entries in record.items():
        assert entries[0]["type"] == "enqueued" and entries[0]["task_id"] == ended[name]
        assert {e["task_status"] for e in entries} == {q_status(name)}
        for e in entries:
            assert set(e["detail"]) <= _evidence_keys(), e
    # who held which generation, and why each lease ended
    trail = [(e["type"], e["generation"], e["worker_id"] is not None) for e in record["completed"]]
    assert [t for t in trail if t[0] == "claimed"] == [("claimed", 1, True), ("claimed", 2, True),
                                                        ("claimed", 3, True)]
    ends = [(e["type"], e["generation"]) for e in record["completed"]
            if e["type"] in ("retry_requested", "lease_released", "completed")]
    assert ends == [("retry_requested", 1), ("lease_released", 2), ("completed", 3)]
    assert [(e["type"], e["detail"].get("next_status")) for e in record["dead"] if e["type"] == "failed"] == \
        [("failed", "dead"), ("failed", "dead")]
    assert [e["type"] for e in record["dead"]].count("lease_lost") == 1
    # who decided what
    decided = [(e["type"], e["detail"].get("by")) for e in record["completed-approved"]
               if e["type"] in ("approval_requested", "approved")]
    assert decided == [("approval_requested", None), ("approved", "bob")]
    assert [e["detail"]["requested_by"] for e in record["completed-approved"]
            if e["type"] == "approval_requested"] == ["alice"]
    assert [(e["type"], e["detail"].get("by")) for e in record["denied"] if e["type"] == "denied"] == \
        [("denied", "bob")]
    assert [(e["type"], e["detail"].get("by"), e["detail"].get("outcome")) for e in record["completed-reconciled"]
            if e["type"] == "reconciled"] == [("reconciled", "ops", "completed")]
    assert "deadline_passed" in [e["type"] for e in record["expired"]]

    # 3. the evidence record's own retention: kept until it passes, then gone
    _age_evidence(dsn, 300 * DAY)  # ended 340 days ago: within the default year
    assert q.prune(30 * DAY)["evidence_pruned"] == 0
    assert all(q.evidence_record(i) for i in ended.values())
    assert q.prune(30 * DAY, evidence_older_than_seconds=400 * DAY)["evidence_pruned"] == 0
    counts = q.prune(30 * DAY, evidence_older_than_seconds=300 * DAY, batch=5)
    assert counts["evidence_pruned"] == sum(len(r) for r in record.values())
    assert all(q.evidence_record(i) == [] for i in ended.values())
    assert _snapshot(q, live) == before


def q_status(name: str) -> str:
    return name.split("-")[0]


def test_the_evidence_record_outlives_the_task_by_default(q: leaseq.Queue, dsn: str) -> None:
    w = q.register_worker("w")
    t = q.enqueue("job", {"text": ENDED})
    [c] = q.claim(w)
    q.complete(w, c, {"answer": ENDED})
    age_tasks(dsn, [t.id], 40 * DAY)
    assert q.prune(30 * DAY)["tasks"] == 1
    assert [e["type"] for e in q.evidence_record(t.id)] == ["enqueued", "claimed", "completed"]
    _age_evidence(dsn, 330 * DAY)  # ended 370 days ago: past the default year
    assert q.prune(30 * DAY)["evidence_pruned"] == 3
    assert q.evidence_record(t.id) == []


def test_the_evidence_retention_is_checked(q: leaseq.Queue) -> None:
    for bad in (-1, float("nan"), "1y", DAY):  # DAY: shorter than the task retention
        with pytest.raises(leaseq.InvalidInput) as info:
            q.prune(30 * DAY, evidence_older_than_seconds=bad)  # type: ignore[arg-type]
        assert info.value.field == "evidence_older_than_seconds"
    assert not [e for e in leaseq.auth.audit_log(q) if e["action"] == "prune"]  # refused: nothing ran


def test_the_audit_entries_of_a_pruned_task_keep_who_not_what(q: leaseq.Queue, dsn: str) -> None:
    t = q.enqueue("job", {"text": ENDED}, approval="required", by="alice")
    q.deny(t.id, reason=f"{ENDED} refused", by="bob", via="cli")
    age_tasks(dsn, [t.id], 40 * DAY)
    q.prune(30 * DAY)
    [entry] = [e for e in leaseq.auth.audit_log(q) if e["action"] == "deny"]
    assert entry["actor"] == "bob" and entry["target"] == f"task:{t.id}" and entry["detail"] == {"via": "cli"}
    assert _where(dsn, ENDED) == []


def test_evidence_reads_alike_on_the_async_queue(dsn: str, q: leaseq.Queue) -> None:
    import asyncio

    w = q.register_worker("w")
    t = q.enqueue("job", {"text": ENDED})
    [c] = q.claim(w)
    q.complete(w, c, None)
    age_tasks(dsn, [t.id], 2 * DAY)

    async def run() -> list[dict[str, Any]]:
        aq = await leaseq.connect_async(dsn)
        try:
            counts = await aq.prune(DAY, evidence_older_than_seconds=10 * DAY)
            assert counts["tasks"] == 1
            return await aq.evidence_record(t.id)
        finally:
            await aq.close()

    found = asyncio.run(run())
    assert [e["type"] for e in found] == ["enqueued", "claimed", "completed"]
    assert json.loads(json.dumps(found, default=str))  # plain data


def _age_audit(dsn: str, seconds: float, ids: list[int]) -> None:
    """Move the audit entries ``ids`` back by ``seconds`` (a test's own write)."""
    dialect, target = parse_dsn(dsn)
    if dialect == "sqlite":
        conn = sqlite3.connect(target)
        try:
            with conn:
                conn.executemany("UPDATE leaseq_audit SET at = at - ? WHERE id = ?", [(seconds, i) for i in ids])
        finally:
            conn.close()
        return
    with own_connection(target) as conn:
        conn.execute("UPDATE leaseq_audit SET at = at - %s * interval '1 second' WHERE id = ANY(%s)", (seconds, ids))


def test_the_audit_log_is_kept_on_the_evidence_clock(q: leaseq.Queue, dsn: str) -> None:
    """Audit entries are evidence: kept for the evidence record's retention (a year by
    default), then deleted oldest first, in batches; newer ones stay."""
    for name in ("a", "b", "c"):
        q.pause(name, create=True, by="ops")
    old = [e["id"] for e in auth.audit_log(q) if e["action"] == "pause"]
    assert len(old) == 3
    q.resume("a", by="ops")
    _age_audit(dsn, 200 * DAY, old)
    assert q.prune(30 * DAY)["audit_pruned"] == 0  # within the default year
    assert q.prune(30 * DAY, evidence_older_than_seconds=300 * DAY)["audit_pruned"] == 0
    counts = q.prune(30 * DAY, evidence_older_than_seconds=100 * DAY, batch=2)
    assert counts["audit_pruned"] == 3
    left = [e["action"] for e in auth.audit_log(q)]
    assert "pause" not in left and "resume" in left and "prune" in left


def _age_rows(dsn: str, table: str, column: str, seconds: float) -> None:
    """Move every row's ``column`` of ``table`` ``seconds`` into the past (a time, or an ISO day)."""
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"))
        try:
            shift = (f"date({column}, '-{int(seconds // DAY)} days')" if column == "day"
                     else f"{column} - {seconds}")
            conn.execute(f"UPDATE {table} SET {column} = {shift}")
            conn.commit()
        finally:
            conn.close()
        return
    with own_connection(dsn) as conn:
        conn.execute("SET ROLE leaseq_owner")
        conn.execute(f"UPDATE {table} SET {column} = {column} - %s * interval '1 second'", (seconds,))


def test_flow_keys_and_spend_per_day_are_pruned(q: leaseq.Queue, dsn: str) -> None:
    """The lock rows of singleton and debounce keys no enqueue named within the retention are
    forgotten (and made again by the next enqueue of the key, which still serializes); each
    limit's spend per day goes with the evidence record's retention. Recent ones stay."""
    q.set_limit("tok", per_day=1_000, counts="units")
    w = q.register_worker("w")
    q.enqueue("sync", singleton_key="customer-1")
    q.enqueue("reindex", debounce=60, key="repo-1")
    task = q.enqueue("call", limits=["tok"], units=10)
    [claim] = q.claim(w, kinds=["call"])
    q.consume(w, claim, "call:consume:0", "tok", 7)
    q.complete(w, claim, None)
    assert [r["units"] for r in q.limit_spend()] == [7]
    counts = q.prune(30 * DAY)
    assert (counts["flow_keys_pruned"], counts["spend_pruned"]) == (0, 0)  # all recent
    _age_rows(dsn, "leaseq_flow_keys", "locked_at", 40 * DAY)
    _age_rows(dsn, "leaseq_limit_spend", "day", 40 * DAY)
    counts = q.prune(30 * DAY)  # the spend is within the evidence record's year
    assert (counts["flow_keys_pruned"], counts["spend_pruned"]) == (2, 0)
    counts = q.prune(30 * DAY, evidence_older_than_seconds=35 * DAY)
    assert (counts["flow_keys_pruned"], counts["spend_pruned"]) == (0, 1)
    assert q.limit_spend() == [] and q.get(task.id).status == "completed"
    # the key works as before: its row is made again, and the singleton still holds
    assert q.enqueue("sync", singleton_key="customer-1").enqueue_outcome == "skipped"
    assert q.enqueue("sync", singleton_key="customer-2").enqueue_outcome == "created"


def _fair_rows(dsn: str) -> dict[tuple[str, str], float]:
    """Every fair-share row: (queue, key) -> the key's virtual time (one priority is used here)."""
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"))
        try:
            return {(r[0], r[1]): r[2] for r in conn.execute("SELECT queue, key, vtime FROM leaseq_fairness")}
        finally:
            conn.close()
    with own_connection(dsn) as conn:
        conn.execute("SET ROLE leaseq_owner")
        return {(r[0], r[1]): r[2] for r in conn.execute("SELECT queue, key, vtime FROM leaseq_fairness")}


def test_idle_fairness_keys_are_pruned_and_start_level_when_back(q: leaseq.Queue, dsn: str) -> None:
    """A fair-share key's row (its virtual time) goes once no task of the key is queued and no
    claim served it within the retention; a key with a task queued (due or not) stays, and so
    does the row holding the priority's virtual time (the latest served), so the clock never runs
    back. A key back after its row went starts level with the keys being served: its first task
    goes out at once, however deep the others' backlog."""
    w = q.register_worker("w")
    q.enqueue_many("job", [{"n": n} for n in range(40)], queue="fq", fairness_key="acme")  # a deep backlog
    q.enqueue("job", queue="fq", fairness_key="gone")   # served, then nothing queued: pruned
    q.enqueue("job", queue="fq", fairness_key="held")   # served, then one queued for later: kept
    q.enqueue("job", queue="fq")                        # the tasks without a key: pruned likewise
    q.enqueue("job", queue="solo", fairness_key="only")  # the latest served of its queue: kept
    served = [c.task.fairness_key for c in q.claim(w, queue="fq", limit=10)]
    assert {"gone", "held", None} <= set(served), served
    q.claim(w, queue="solo")
    q.enqueue("job", queue="fq", fairness_key="held", delay=3600)
    assert set(_fair_rows(dsn)) == {("fq", "acme"), ("fq", "gone"), ("fq", "held"), ("fq", ""),
                                    ("solo", "only")}
    assert q.prune(30 * DAY)["fairness_pruned"] == 0  # all recent
    # on PostgreSQL leaseq_fairness is a view of each key's shares (one per claiming connection)
    _age_rows(dsn, "leaseq_fairness" if dsn.startswith("sqlite") else "leaseq_fairness_shares", "served_at",
              40 * DAY)
    counts = q.prune(30 * DAY, batch=1)
    assert counts["fairness_pruned"] == 2
    assert set(_fair_rows(dsn)) == {("fq", "acme"), ("fq", "held"), ("solo", "only")}
    assert q.prune(30 * DAY)["fairness_pruned"] == 0
    # back after its row went: level with acme, whose backlog is still 30 deep
    back = q.enqueue("job", queue="fq", fairness_key="gone")
    claimed = [c.task.id for c in q.claim(w, queue="fq", limit=2)]
    assert back.id in claimed, claimed
    # and is owed nothing: with a backlog of its own it takes every other turn (level within a
    # task's cost), not a run of the turns it missed while idle
    q.enqueue_many("job", [{"n": n} for n in range(10)], queue="fq", fairness_key="gone")
    served = [c.task.fairness_key for c in q.claim(w, queue="fq", limit=10)]
    assert served.count("gone") in (5, 6) and "acme" in served[:3], served


def test_streams_have_a_retention_of_their_own(q: leaseq.Queue, dsn: str) -> None:
    """``streams_older_than_seconds`` deletes the streams of tasks that ended longer ago than
    that, and nothing else: the task, its trail (where each attempt's stream began) and a
    stream of a task still running or ended more recently stay."""
    w = q.register_worker("w")
    made = {}
    for name in ("old", "recent", "running"):
        t = q.enqueue("job", {"text": name}, queue=f"st-{name}", idempotency_key=f"st-{name}")
        [c] = q.claim(w, queue=f"st-{name}")
        q.emit(w, c, {"progress": ENDED if name != "running" else LIVE})
        q.emit(w, c, {"plan": name}, key=f"st-{name}:emit:0")
        if name != "running":
            q.complete(w, c, {"answer": name})
        made[name] = t.id
    age_tasks(dsn, [made["old"], made["running"]], 3 * DAY)
    age_tasks(dsn, [made["recent"]], DAY / 2)
    for bad in (-1, float("nan"), "2d"):
        with pytest.raises(leaseq.InvalidInput) as info:
            q.prune(30 * DAY, streams_older_than_seconds=bad)  # type: ignore[arg-type]
        assert info.value.field == "streams_older_than_seconds"
    assert q.prune(30 * DAY)["streams"] == 0  # not asked for: streams stay with their tasks
    counts = q.prune(30 * DAY, streams_older_than_seconds=DAY, batch=1)
    assert counts["streams"] == 1 and counts["tasks"] == 0 and counts["payloads"] == 0
    assert list(q.stream(made["old"])) == []
    assert len(list(q.stream(made["recent"]))) == 3 and len(list(q.stream(made["running"], follow=False))) == 3
    old = q.get(made["old"])
    assert old.result == {"answer": "old"}  # the task and its other data stay
    assert [e.detail for e in q.events(old.id) if e.type == "stream_started"] == [{"seq": 1}]
    assert q.stream_stats(old.id)["attempts"] == []
    assert q.prune(30 * DAY, streams_older_than_seconds=DAY)["streams"] == 0  # deleted once
    [entry] = [e for e in auth.audit_log(q) if e["action"] == "prune" and e["detail"].get("streams")]
    assert entry["detail"]["streams_older_than_seconds"] == DAY
