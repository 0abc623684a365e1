"""The claim reads the claimable set from its partial index, on both backends.

``claim_batch`` must walk ``leaseq_tasks_claimable`` in claim order (no
sort, no full scan), however many finished tasks sit in the table beside
the queued ones. The plans are read with EXPLAIN, which runs nothing.

On PostgreSQL the hot statements run their prepared statement's generic
plan (``leaseq.store.postgres.GENERIC_PLAN``): that one plan serves every
call, so it is read here too, for each of them.
"""

from __future__ import annotations

import json
import re
import sqlite3
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq.store.base import load_queries
from leaseq.store.postgres import GENERIC_PLAN, _encode

CLAIM_PARAMS = dict(queue="default", limit=10, lease_seconds=None, compact=False, route_first=True, kinds=None)

PG_FILL = """
INSERT INTO leaseq_tasks (queue, kind, payload, effect, status, idempotency_key, max_attempts, lease_seconds,
                          claim_generation, attempts, result)
SELECT 'default', 'noop', '{}', 'read_only', %(status)s, %(status)s || g, 5, 30,
       CASE WHEN %(status)s = 'queued' THEN 0 ELSE 1 END, CASE WHEN %(status)s = 'queued' THEN 0 ELSE 1 END,
       CASE WHEN %(status)s = 'queued' THEN NULL ELSE 'null'::jsonb END
FROM generate_series(1, %(n)s) AS g
"""

SQLITE_FILL = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < :n)
INSERT INTO leaseq_tasks (queue, kind, payload, effect, status, idempotency_key, max_attempts, lease_seconds,
                          claim_generation, attempts, result)
SELECT 'default', 'noop', '{}', 'read_only', :status, :status || n, 5, 30,
       CASE WHEN :status = 'queued' THEN 0 ELSE 1 END, CASE WHEN :status = 'queued' THEN 0 ELSE 1 END,
       CASE WHEN :status = 'queued' THEN NULL ELSE 'null' END
FROM g
"""

SHAPES = {  # (finished, queued): a long history, and a deep queue
    "history": (50_000, 200),
    "deep": (0, 50_000),
}


def _queued_scans(plan: dict[str, Any], sorted_above: bool = False, status: str = "queued") -> list[tuple[str, bool]]:
    """``(how, sorted_above)`` for every read of the tasks of ``status`` in a JSON plan."""
    sorted_here = sorted_above or plan["Node Type"] in ("Sort", "Incremental Sort")
    found = []
    conditions = plan.get("Index Cond", "") + plan.get("Filter", "")
    if plan.get("Relation Name") == "leaseq_tasks" and f"'{status}'" in conditions:
        found.append((plan.get("Index Name", plan["Node Type"]), sorted_here))
    for child in plan.get("Plans", []):
        found += _queued_scans(child, sorted_here, status)
    return found


def _pg_plan(dsn: str, worker_id: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        [[doc]] = conn.execute("EXPLAIN (FORMAT JSON) " + load_queries("postgres")["claim_batch"],
                               dict(CLAIM_PARAMS, worker_id=worker_id)).fetchall()
    return doc[0]["Plan"]


def _pg_queue(dsn: str, finished: int, queued: int, *, analyze: bool = True) -> str:
    q = leaseq.connect(dsn)
    q.migrate()
    worker = q.register_worker("plan").id
    q.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        if not analyze:  # keep autovacuum from analysing behind the test's back
            conn.execute("ALTER TABLE leaseq_tasks SET (autovacuum_enabled = false)")
        conn.execute(PG_FILL, {"status": "completed", "n": finished})
        conn.execute(PG_FILL, {"status": "queued", "n": queued})
        if analyze:
            conn.execute("VACUUM (ANALYZE) leaseq_tasks")
    return worker


@pytest.mark.parametrize("shape", SHAPES)
def test_postgres_claims_from_the_claimable_index(pg_schema_dsn: str, shape: str) -> None:
    worker = _pg_queue(pg_schema_dsn, *SHAPES[shape])
    plan = _pg_plan(pg_schema_dsn, worker)
    # Read in claim order straight from the partial index: no sort, no other index, no full scan.
    assert _queued_scans(plan) == [("leaseq_tasks_claimable", False)], json.dumps(plan, indent=1)[:6000]


def test_postgres_claims_from_the_claimable_index_before_any_analyze(pg_schema_dsn: str) -> None:
    worker = _pg_queue(pg_schema_dsn, 0, 40_000, analyze=False)
    assert _queued_scans(_pg_plan(pg_schema_dsn, worker)) == [("leaseq_tasks_claimable", False)]


@pytest.mark.parametrize("analyze", [False, True], ids=["fresh", "analysed"])
@pytest.mark.parametrize("shape", SHAPES)
def test_sqlite_claims_from_the_claimable_index(tmp_path, shape: str, analyze: bool) -> None:
    path = tmp_path / "plan.db"
    q = leaseq.connect(f"sqlite:///{path}")
    q.migrate()
    worker = q.register_worker("plan").id
    q.close()
    finished, queued = SHAPES[shape]
    with sqlite3.connect(path) as conn:
        conn.execute(SQLITE_FILL, {"status": "completed", "n": finished})
        conn.execute(SQLITE_FILL, {"status": "queued", "n": queued})
        if analyze:
            conn.execute("ANALYZE")
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + load_queries("sqlite")["claim_batch"],
                                               dict(CLAIM_PARAMS, worker_id=worker))]
    candidate = [step for step in plan if "leaseq_tasks USING" in step and "INTEGER PRIMARY KEY" not in step]
    assert any("INDEX leaseq_tasks_claimable" in step for step in candidate), plan
    assert not [step for step in plan if "TEMP B-TREE" in step or step.startswith("SCAN leaseq_tasks")], plan


#: Parameters for reading each generic plan; their values do not shape it.
SAMPLE = dict(
    CLAIM_PARAMS, task_id=1, generation=1, task_ids=[1, 2], generations=[1, 1], result=None, items=[
        {"task_id": 1, "generation": 1, "result": None}], block=False, retry=True, fingerprint="f",
    max_same_error=3, error="e", delay=0.0, type="note", detail={}, events=[
        {"task_id": 1, "type": "note", "generation": 1, "worker_id": "w", "detail": {}}],
    kind="noop", payload={}, effect="read_only", priority=0, idempotency_key="k", max_attempts=5,
    tasks=[{"payload": {}, "idempotency_key": "k"}], with_dependents=False,
)
WRITE_PARAMS = {q: {"lease_seconds": 30.0, "actions": None} for q in ("insert_task", "insert_tasks", "insert_fresh_tasks")}


def _scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """``(node type, relation)`` of every read of a table in a JSON plan."""
    found = [(plan["Node Type"], plan["Relation Name"])] if "Relation Name" in plan else []
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


def _generic_plan(dsn: str, query: str, params: dict[str, Any]) -> dict[str, Any]:
    """Prepare ``query`` as leaseq's store does and read the generic plan that every call then runs."""
    sql = load_queries("postgres")[query]
    order = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))  # psycopg numbers names in this order
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction(force_rollback=True):  # preparing runs the statement once: undo it
            conn.execute(sql, _encode(params), prepare=True)
            [[name]] = conn.execute("SELECT name FROM pg_prepared_statements ORDER BY prepare_time DESC LIMIT 1")
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            with psycopg.ClientCursor(conn) as cur:
                cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {name}(" + ", ".join(["%s"] * len(order)) + ")",
                            [_encode(params)[k] for k in order])
                [[doc]] = cur.fetchall()
    return doc[0]["Plan"]


@pytest.mark.parametrize("query", sorted(GENERIC_PLAN))
def test_postgres_generic_plans_read_tasks_by_index(pg_schema_dsn: str, query: str) -> None:
    """No hot statement's one plan reads the task or event table from end to end."""
    worker = _pg_queue(pg_schema_dsn, 20_000, 20_000)
    plan = _generic_plan(pg_schema_dsn, query, dict(SAMPLE, worker_id=worker, **WRITE_PARAMS.get(query, {})))
    scans = _scans(plan)
    assert not [s for s in scans if s[0] == "Seq Scan" and s[1].startswith("leaseq_")], (scans, json.dumps(plan))
    if query == "claim_batch":
        assert _queued_scans(plan) == [("leaseq_tasks_claimable", False)], json.dumps(plan, indent=1)[:6000]
        # the look for an expired lease reads the leases index in deadline order, no walk and sort
        assert [s for s in _queued_scans(plan, status="running") if s[0] != "leaseq_tasks_pkey"] == \
            [("leaseq_tasks_leases", False)], json.dumps(plan, indent=1)[:6000]
