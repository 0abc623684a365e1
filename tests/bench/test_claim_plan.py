"""The claim reads the claimable set from its partial index, on both backends.

``claim_batch`` must walk ``leaseq_tasks_claimable`` in claim order (no
sort, no full scan), however many finished tasks sit in the table beside
the queued ones. The plans are read with EXPLAIN, which runs nothing.

On PostgreSQL the hot statements run their prepared statement's generic
plan (``leaseq.store.postgres.GENERIC_PLAN``): that one plan serves every
call, so it is read here too, for each of them.

The renewal of many leases (``renew_leases``) is read as the store runs it,
on statistics taken before those tasks ran, and must look at each running
row once: a join against the (task, generation) pairs, planned generically,
looked at every pair for every running row.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq.store.base import load_queries
from leaseq.store.queries import load_named_queries
from leaseq.store.postgres import GENERIC_PLAN, _configure, _encode
from pg_modes import own_connection

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


#: The singleton rule's probe (a task with a singleton key only when no other of its key is running
#: or queued before it): a read of the singleton index, by the candidate's key.
SINGLETON_PROBE = ("leaseq_tasks_singleton", False)


def _subplan(plan: dict[str, Any], name: str) -> dict[str, Any]:
    """The node of a JSON plan named ``name`` (a CTE: "CTE <name>")."""
    if plan.get("Subplan Name") == name:
        return plan
    for child in plan.get("Plans", []):
        try:
            return _subplan(child, name)
        except LookupError:
            pass
    raise LookupError(name)


def _candidate_scans(plan: dict[str, Any]) -> list[tuple[str, bool]]:
    """The reads of queued tasks that find the candidates of a queue without fairness keys (the
    claim's ``plain`` step): every one but the singleton rule's probe, which must read its index
    and nothing else."""
    scans = _queued_scans(_subplan(plan, "CTE plain"))
    assert all(s == SINGLETON_PROBE for s in scans if s[0] != "leaseq_tasks_claimable"), scans
    return [s for s in scans if s != SINGLETON_PROBE]


#: The claim's FAIR SHARE steps, which read only in a queue with a task that names a fairness
#: key queued (the claim's flags say whether: one probe of leaseq_tasks_fair).
FAIR_STEPS = ("CTE fair_keys", "CTE fair_mode", "CTE fair_ready", "CTE fair_one", "CTE fair_start",
              "CTE fair_pick")
#: The indexes they may read tasks by: each key's tasks, the tasks without a key, the singleton
#: rule's probe, and the chosen candidates by id.
FAIR_INDEXES = {"leaseq_tasks_fair", "leaseq_tasks_claimable", "leaseq_tasks_singleton", "leaseq_tasks_pkey"}


def _task_reads(plan: dict[str, Any], limited: bool = False) -> list[tuple[str, str, bool]]:
    """``(node type, index, under a Limit)`` of every read of the task table in a JSON plan."""
    limited = limited or plan["Node Type"] == "Limit"
    found = []
    if plan.get("Relation Name") == "leaseq_tasks":
        found.append((plan["Node Type"], plan.get("Index Name", ""), limited))
    for child in plan.get("Plans", []):
        if child["Node Type"] == "Bitmap Index Scan" and plan.get("Relation Name") == "leaseq_tasks":
            found[-1] = (plan["Node Type"], child.get("Index Name", ""), limited)
        found += _task_reads(child, limited)
    return found


def _fair_steps_in(plan: dict[str, Any]) -> list[str]:
    """The fair-share steps a plan holds."""
    found = [plan["Subplan Name"]] if plan.get("Subplan Name") in FAIR_STEPS else []
    return found + [s for child in plan.get("Plans", []) for s in _fair_steps_in(child)]


def _check_fair_steps(plan: dict[str, Any]) -> None:
    """The fair-share steps read tasks by index only, each key's (and the keyless tasks') under
    a Limit: no step walks a key's whole backlog, let alone the table."""
    probe = _task_reads(_subplan(plan, "CTE flags"))
    assert ("Index Only Scan", "leaseq_tasks_fair", True) in probe, probe
    for step in FAIR_STEPS:
        if step not in _fair_steps_in(plan):
            continue  # claim_fair_one has only the one key's steps
        reads = _task_reads(_subplan(plan, step))
        assert all(kind != "Seq Scan" and index in FAIR_INDEXES for kind, index, _ in reads), (step, reads)
        if step in ("CTE fair_ready", "CTE fair_one"):  # fair_one: the one key's walk, locking as it goes
            walks = [r for r in reads if r[1] in ("leaseq_tasks_fair", "leaseq_tasks_claimable")]
            assert len(walks) == (2 if step == "CTE fair_ready" else 1), walks
            assert all(limited for _, _, limited in walks), walks


def _pg_plan(dsn: str, worker_id: str) -> dict[str, Any]:
    with own_connection(dsn) as conn:
        [[doc]] = conn.execute("EXPLAIN (FORMAT JSON) " + load_queries("postgres")["claim_batch"],
                               dict(CLAIM_PARAMS, worker_id=worker_id)).fetchall()
    return doc[0]["Plan"]


def _pg_queue(dsn: str, finished: int, queued: int, *, analyze: bool = True) -> str:
    q = leaseq.connect(dsn)
    q.migrate()
    worker = q.register_worker("plan").id
    q.close()
    with own_connection(dsn, autocommit=True) as conn:
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
    assert _candidate_scans(plan) == [("leaseq_tasks_claimable", False)], json.dumps(plan, indent=1)[:6000]
    assert not _fair_steps_in(plan)  # the claim of a queue without keys: no fair-share step at all


def test_postgres_claims_from_the_claimable_index_before_any_analyze(pg_schema_dsn: str) -> None:
    worker = _pg_queue(pg_schema_dsn, 0, 40_000, analyze=False)
    assert _candidate_scans(_pg_plan(pg_schema_dsn, worker)) == [("leaseq_tasks_claimable", False)]


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
        rows = conn.execute("EXPLAIN QUERY PLAN " + load_queries("sqlite")["claim_batch"],
                            dict(CLAIM_PARAMS, worker_id=worker)).fetchall()
        fair_rows = conn.execute("EXPLAIN QUERY PLAN " + load_queries("sqlite")["claim_fair"],
                                 dict(CLAIM_PARAMS, worker_id=worker)).fetchall()
    # The limits' judgement sorts the candidates it judges (at most `limit` rows, in claim
    # order for a running sum): not a read of the task table, so left out here.
    judged = _sqlite_subtree(rows, "CO-ROUTINE demand")
    plan = [row[3] for row in rows if row[0] not in judged]
    candidate = [step for step in plan if "leaseq_tasks USING" in step and "INTEGER PRIMARY KEY" not in step]
    assert any("INDEX leaseq_tasks_claimable" in step for step in candidate), plan
    assert not [step for step in plan if "TEMP B-TREE" in step or step.startswith("SCAN leaseq_tasks")], plan
    assert not _sqlite_subtree(rows, "MATERIALIZE fair_pick")  # no fair-share step in the claim
    _check_sqlite_fair_steps(fair_rows)


def _sqlite_subtree(rows: list[tuple[Any, ...]], label: str) -> set[int]:
    """The ids of an EXPLAIN QUERY PLAN's step ``label`` and of every step under it."""
    ids = {row[0] for row in rows if row[3] == label}
    for row in rows:
        if row[1] in ids:
            ids.add(row[0])
    return ids


def _check_sqlite_fair_steps(rows: list[tuple[Any, ...]]) -> None:
    """The fair-share steps read tasks by index only (each key's by leaseq_tasks_fair), never a
    scan of the table; what they sort is the few candidates they read."""
    fair = _sqlite_subtree(rows, "MATERIALIZE fair_pick") | _sqlite_subtree(rows, "MATERIALIZE flags")
    steps = [row[3] for row in rows if row[0] in fair]
    # the probe that says whether the queue uses fairness keys, and the walk of its keys
    assert any(step.startswith("SEARCH k USING") and "INDEX leaseq_tasks_fair (queue=? AND fairness_key>?)" in step
               for step in steps), steps
    assert any("USING INDEX leaseq_tasks_fair (queue=? AND fairness_key=?)" in step for step in steps), steps
    tables = re.compile(r"SCAN (leaseq_tasks|t|k|kv|qv)\b(?! VIRTUAL TABLE)")  # the tasks; the keys' times
    assert not [step for step in steps if tables.match(step)], steps


#: Parameters for reading each generic plan; their values do not shape it.
SAMPLE = dict(
    CLAIM_PARAMS, task_id=1, generation=1, task_ids=[1, 2], generations=[1, 1], leases={"1": 1, "2": 1},
    result=None, items=[
        {"task_id": 1, "generation": 1, "result": None}], block=False, retry=True, fingerprint="f",
    max_same_error=3, error="e", delay=0.0, backoff_base=1.0, backoff_cap=3600.0, jitter=0.5, type="note", detail={},
    events=[
        {"task_id": 1, "type": "note", "generation": 1, "worker_id": "w", "detail": {}}],
    kind="noop", payload={}, effect="read_only", priority=0, idempotency_key="k", max_attempts=5,
    tasks=[{"payload": {}, "idempotency_key": "k"}], singleton_key=None, debounce_key=None, scope="singleton",
    fairness_key=None, fairness_weight=None,
    key="k", timeout=None, deadline_at=None, deadline_in=None,
    trace_context=None, after=1.0, max_snoozes=100, with_dependents=False, lock_worker=True,
    # the tool-call ledger and the token check
    delta=1, effect_id=1, response={}, action="crm.update", args_digest=None, token_id="t1",
    # declared resources, and the reference token minted for an effect
    resource=None, tool=False, token_hash="0" * 64, ttl_seconds=300.0,
    # durable waits: a sleep's length or end, the signal waited for
    seconds=1.0, until=None, signal=None,
    # child tasks: the children a wait names (a parent waits for them)
    children=[2], child_ids=[2],
    # a durable wait that waits for a person (a budget spent)
    approval=False,
)
WRITE_PARAMS = {q: {"lease_seconds": 30.0, "actions": None, "resources": None, "limits": None, "units": 1}
                for q in ("insert_task", "insert_tasks", "insert_fresh_tasks")}
#: Tables a hot statement may read whole: one row per limit key, a handful.
SMALL_TABLES = {"leaseq_limits"}


#: The statements' bodies run as their definer functions run them: with the rights of the
#: schema's owner (a trigger refuses lease writes by any other role, a superuser's too).
AS_OWNER = "SET LOCAL ROLE leaseq_owner"


def _scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """``(node type, relation)`` of every read of a table in a JSON plan."""
    found = [(plan["Node Type"], plan["Relation Name"])] if "Relation Name" in plan else []
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


def _generic_plan(dsn: str, query: str, params: dict[str, Any], *, verbose: bool = False) -> dict[str, Any]:
    """Prepare ``query`` as leaseq's store does and read the generic plan that every call then runs."""
    sql = load_queries("postgres")[query]
    order = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))  # psycopg numbers names in this order
    with own_connection(dsn, autocommit=True) as conn:
        with conn.transaction(force_rollback=True):  # preparing runs the statement once: undo it
            conn.execute(AS_OWNER)
            conn.execute(sql, _encode(params), prepare=True)
            [[name]] = conn.execute("SELECT name FROM pg_prepared_statements ORDER BY prepare_time DESC LIMIT 1")
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            with psycopg.ClientCursor(conn) as cur:
                args = "(" + ", ".join(["%s"] * len(order)) + ")" if order else ""
                cur.execute(f"EXPLAIN (FORMAT JSON{', VERBOSE' if verbose else ''}) EXECUTE {name}{args}",
                            [_encode(params)[k] for k in order])
                [[doc]] = cur.fetchall()
    return doc[0]["Plan"]


@pytest.mark.parametrize("query", sorted(GENERIC_PLAN))
def test_postgres_generic_plans_read_tasks_by_index(pg_schema_dsn: str, query: str) -> None:
    """No hot statement's one plan reads the task or event table from end to end."""
    worker = _pg_queue(pg_schema_dsn, 20_000, 20_000)
    plan = _generic_plan(pg_schema_dsn, query, dict(SAMPLE, worker_id=worker, **WRITE_PARAMS.get(query, {})))
    scans = _scans(plan)
    assert not [s for s in scans if s[0] == "Seq Scan" and s[1].startswith("leaseq_") and s[1] not in SMALL_TABLES], \
        (scans, json.dumps(plan))
    if query == "claim_batch":
        assert _candidate_scans(plan) == [("leaseq_tasks_claimable", False)], json.dumps(plan, indent=1)[:6000]
        assert not _fair_steps_in(plan)
    if query == "claim_fair":
        _check_fair_steps(plan)
    if query == "claim_plain":
        # the lean claim: the claimable index in claim order, and none of the steps of
        # fairness keys, limits or singleton keys
        assert _queued_scans(_subplan(plan, "CTE candidate")) == [("leaseq_tasks_claimable", False)], \
            json.dumps(plan, indent=1)[:6000]
        assert not _fair_steps_in(plan)
        steps = json.dumps(plan)
        assert not [n for n in ("CTE held", "CTE demand", "CTE refused", "CTE taken", "leaseq_limits",
                                "leaseq_tasks_singleton", "leaseq_tasks_fair") if n in steps], steps[:6000]
    if query == "claim_fair_one":
        # the one-key claim: the one key's walk (fair_one) and its charge, none of the steps that
        # weigh keys against each other
        _check_fair_steps(plan)
        assert sorted(set(_fair_steps_in(plan))) == ["CTE fair_mode", "CTE fair_one", "CTE fair_start"], \
            json.dumps(plan, indent=1)[:6000]
    if query == "claim_fair_one_plain":
        # the one-key claim of a queue whose tasks never named a limit or a singleton key:
        # claim_fair_one's steps, and none of the limits' nor the singleton rule's; whether one
        # key alone is queued is read by its flags (fair_one_flags), no step of its own
        _check_fair_steps(plan)
        assert sorted(set(_fair_steps_in(plan))) == ["CTE fair_one", "CTE fair_start"], \
            json.dumps(plan, indent=1)[:6000]
        assert "fair_mode" not in json.dumps(plan), json.dumps(plan, indent=1)[:6000]
        steps = json.dumps(plan)
        assert not [n for n in ("CTE held", "CTE demand", "CTE refused", "CTE taken", "leaseq_limits",
                                "leaseq_tasks_singleton") if n in steps], steps[:6000]
    if query in ("claim_batch", "claim_fair", "claim_fair_one", "claim_fair_one_plain", "claim_plain"):
        # the look for an expired lease reads the leases index in deadline order, no walk and sort
        assert [s for s in _queued_scans(plan, status="running") if s[0] != "leaseq_tasks_pkey" and s != SINGLETON_PROBE] == \
            [("leaseq_tasks_leases", False)], json.dumps(plan, indent=1)[:6000]


#: A queue that uses fairness keys: one key's deep backlog, and another key's few tasks.
FAIR_FILL = {"postgres": """
UPDATE leaseq_tasks SET fairness_key = CASE WHEN id % 4000 = 0 THEN 'b' ELSE 'a' END, fairness_weight = 1
WHERE status = 'queued'
""", "sqlite": """
UPDATE leaseq_tasks SET fairness_key = CASE WHEN id % 4000 = 0 THEN 'b' ELSE 'a' END, fairness_weight = 1
WHERE status = 'queued'
"""}


def _rows_read(plan: dict[str, Any], relation: str = "leaseq_tasks") -> int:
    """Rows an analysed plan's reads of ``relation`` returned or threw away, loops counted."""
    here = 0
    if plan.get("Relation Name") == relation:
        here = plan.get("Actual Loops", 1) * (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
                                              + plan.get("Rows Removed by Index Recheck", 0))
    return here + sum(_rows_read(child, relation) for child in plan.get("Plans", []))


@pytest.mark.parametrize("queued", [4_000, 40_000])
def test_postgres_fair_claim_reads_a_claim_of_each_key_however_deep(pg_schema_dsn: str, queued: int) -> None:
    """With fairness keys in use, the claim (claim_fair) reads by index, and each key only as
    far as a few claims' worth (four batches and 64 rows): never the deep key's whole backlog."""
    worker = _pg_queue(pg_schema_dsn, 20_000, queued)
    with own_connection(pg_schema_dsn, autocommit=True) as conn:
        conn.execute(FAIR_FILL["postgres"])
        conn.execute("VACUUM (ANALYZE) leaseq_tasks")
    params = dict(SAMPLE, worker_id=worker)
    plan = _generic_plan(pg_schema_dsn, "claim_fair", params)
    _check_fair_steps(plan)
    analysed = _explain_analyze_as_the_store_runs(pg_schema_dsn, "claim_fair", params)
    claimed = _subplan(analysed, "CTE claimed")
    assert claimed["Actual Rows"] == CLAIM_PARAMS["limit"], json.dumps(analysed, indent=1)[:4000]
    # Two keys, the deep one read four batches and 64 rows deep (4x + 64) and the other whole (its few tasks),
    # those candidates again by id to lock them, the claimed rows updated (1x), and a few
    # probes: the same at either depth.
    assert _rows_read(analysed) <= 15 * CLAIM_PARAMS["limit"], json.dumps(analysed, indent=1)[:8000]


@pytest.mark.parametrize("queued", [4_000, 40_000])
def test_postgres_fair_claim_of_one_key_alone_reads_a_claim_worth(pg_schema_dsn: str, queued: int) -> None:
    """With one fairness key alone queued (one tenant's backlog), the fair claim reads that key's
    tasks in claim order only as far as its batch (fair_one): not four batches and 64 rows of it,
    ordered by virtual finish, as where keys are weighed against each other."""
    worker = _pg_queue(pg_schema_dsn, 20_000, queued)
    with own_connection(pg_schema_dsn, autocommit=True) as conn:
        conn.execute("UPDATE leaseq_tasks SET fairness_key = 'a', fairness_weight = 1 WHERE status = 'queued'")
        conn.execute("VACUUM (ANALYZE) leaseq_tasks")
    analysed = _explain_analyze_as_the_store_runs(pg_schema_dsn, "claim_fair", dict(SAMPLE, worker_id=worker))
    assert _subplan(analysed, "CTE claimed")["Actual Rows"] == CLAIM_PARAMS["limit"]
    assert _subplan(analysed, "CTE fair_one")["Actual Rows"] == CLAIM_PARAMS["limit"]
    # the batch read and locked, the claimed rows updated, each first at its priority looked up
    # again, and a few probes (the keys, the tasks without one): the same at either depth
    assert _rows_read(analysed) <= 4 * CLAIM_PARAMS["limit"], json.dumps(analysed, indent=1)[:8000]


@pytest.mark.parametrize("query", ["claim_fair_one", "claim_fair_one_plain"])
@pytest.mark.parametrize("queued", [4_000, 40_000])
def test_postgres_one_key_claim_reads_a_claim_worth_and_stands_aside_for_two(pg_schema_dsn: str,
                                                                            queued: int, query: str) -> None:
    """The one-key claim (claim_fair_one, and its form for a queue without limits and singleton
    keys) of one tenant's backlog reads that key's tasks in claim order only as far as its
    batch, whatever the depth; with a second key queued it claims nothing and answers
    fair_one false (the caller claims with claim_fair)."""
    worker = _pg_queue(pg_schema_dsn, 20_000, queued)
    with own_connection(pg_schema_dsn, autocommit=True) as conn:
        conn.execute("UPDATE leaseq_tasks SET fairness_key = 'a', fairness_weight = 1 WHERE status = 'queued'")
        conn.execute("VACUUM (ANALYZE) leaseq_tasks")
    params = dict(SAMPLE, worker_id=worker)
    analysed = _explain_analyze_as_the_store_runs(pg_schema_dsn, query, params)
    assert _subplan(analysed, "CTE claimed")["Actual Rows"] == CLAIM_PARAMS["limit"]
    assert _subplan(analysed, "CTE fair_one")["Actual Rows"] == CLAIM_PARAMS["limit"]
    assert _rows_read(analysed) <= 4 * CLAIM_PARAMS["limit"], json.dumps(analysed, indent=1)[:8000]
    with own_connection(pg_schema_dsn, autocommit=True) as conn:
        conn.execute(FAIR_FILL["postgres"])
    analysed = _explain_analyze_as_the_store_runs(pg_schema_dsn, query, params)
    assert _subplan(analysed, "CTE claimed")["Actual Rows"] == 0
    assert _rows_read(analysed) <= 2 * CLAIM_PARAMS["limit"], json.dumps(analysed, indent=1)[:8000]


def test_postgres_lean_one_key_claim_stands_aside_for_a_limited_task(pg_schema_dsn: str) -> None:
    """claim_fair_one_plain claims nothing, and answers limited_due, once a task of its queue
    names a limit (the trigger of schema 40 records the queue as the task is written), though
    one key alone is queued: the caller claims with claim_fair_one, which tests it."""
    worker = _pg_queue(pg_schema_dsn, 0, 400)
    with own_connection(pg_schema_dsn, autocommit=True) as conn:
        conn.execute("UPDATE leaseq_tasks SET fairness_key = 'a', fairness_weight = 1 WHERE status = 'queued'")
        conn.execute("VACUUM (ANALYZE) leaseq_tasks")
    params = dict(SAMPLE, worker_id=worker)
    sql = load_queries("postgres")["claim_fair_one_plain"]
    with own_connection(pg_schema_dsn, autocommit=True) as conn, conn.transaction(force_rollback=True):
        conn.execute(AS_OWNER)
        cur = conn.execute(sql, _encode(params))
        found = [dict(zip([c.name for c in cur.description or []], r)) for r in cur.fetchall()]
        assert len(found) == CLAIM_PARAMS["limit"] and not found[0]["limited_due"] and found[0]["fair_one"]
    with own_connection(pg_schema_dsn, autocommit=True) as conn:
        conn.execute("UPDATE leaseq_tasks SET limits = ARRAY['cap'] WHERE id = (SELECT max(id) FROM leaseq_tasks)")
        assert conn.execute("SELECT count(*) FROM leaseq_limited_claims WHERE queue = 'default'").fetchone() == (1,)
    analysed = _explain_analyze_as_the_store_runs(pg_schema_dsn, "claim_fair_one_plain", params)
    assert _subplan(analysed, "CTE claimed")["Actual Rows"] == 0
    with own_connection(pg_schema_dsn, autocommit=True) as conn, conn.transaction(force_rollback=True):
        conn.execute(AS_OWNER)
        cur = conn.execute(sql, _encode(params))
        found = [dict(zip([c.name for c in cur.description or []], r)) for r in cur.fetchall()]
        assert len(found) == 1 and found[0]["id"] is None and found[0]["limited_due"] and found[0]["fair_one"]


#: The lean one-key claim's generic plan at most: its nodes, and its steps (CTEs, init plans
#: and sub plans). A claim starts every node at every call, every step again where a row it
#: reaches was claimed beside it since its snapshot (PostgreSQL's EvalPlanQual recheck starts
#: a copy of each), and plans it all again whenever its cached plan is invalidated.
ONE_KEY_PLAN = {"nodes": 69, "steps": 35}


def _plan_size(plan: dict[str, Any]) -> dict[str, int]:
    """A JSON plan's nodes, and its steps (the nodes that head a CTE, an init plan or a sub plan)."""
    nodes = _nodes(plan)
    return {"nodes": len(nodes), "steps": len([n for n in nodes if "Subplan Name" in n])}


def test_postgres_lean_one_key_claim_plan_stays_small(pg_schema_dsn: str) -> None:
    """claim_fair_one_plain's generic plan, which the drain of one tenant's backlog starts at
    every claim: whether one key alone is queued, and whether a task of the queue ever named a
    limit, read by its flags (no step of its own), and its charge made from its candidates (it
    leases every one): at most ONE_KEY_PLAN, and under claim_fair_one's."""
    worker = _pg_queue(pg_schema_dsn, 0, 400)
    with own_connection(pg_schema_dsn, autocommit=True) as conn:
        conn.execute("UPDATE leaseq_tasks SET fairness_key = 'a', fairness_weight = 1 WHERE status = 'queued'")
        conn.execute("VACUUM (ANALYZE) leaseq_tasks")
    params = dict(SAMPLE, worker_id=worker)
    sizes = {q: _plan_size(_generic_plan(pg_schema_dsn, q, params)) for q in ("claim_fair_one", "claim_fair_one_plain")}
    lean = sizes["claim_fair_one_plain"]
    assert lean["nodes"] <= ONE_KEY_PLAN["nodes"] and lean["steps"] <= ONE_KEY_PLAN["steps"], sizes
    assert lean["nodes"] < sizes["claim_fair_one"]["nodes"], sizes


def _share_reads(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """``(node type, index)`` of every read of the keys' shares in a JSON plan."""
    found = []
    if plan.get("Relation Name") == "leaseq_fairness_shares" and plan["Node Type"] != "ModifyTable":
        found.append((plan["Node Type"], plan.get("Index Name", "")))
    for child in plan.get("Plans", []):
        if child["Node Type"] == "Bitmap Index Scan" and found and plan.get("Relation Name") == "leaseq_fairness_shares":
            found[-1] = (plan["Node Type"], child.get("Index Name", ""))
        found += _share_reads(child)
    return found


def test_postgres_fair_claim_reads_and_charges_the_keys_shares_by_index(pg_schema_dsn: str) -> None:
    """The fair claim's one plan reads each key's shares (schema 37) by the shares' primary key
    (queue, priority, key, share), the priority's virtual time by leaseq_fairness_shares_vstart
    (one probe), and charges its connection's share of each key through the primary key: never
    a scan of every key's shares, however many keys a queue has served."""
    worker = _pg_queue(pg_schema_dsn, 20_000, 4_000)
    with own_connection(pg_schema_dsn, autocommit=True) as conn:
        conn.execute(FAIR_FILL["postgres"])
        conn.execute("""
            INSERT INTO leaseq_fairness_shares (queue, priority, key, shard, base, vstart, service, claimed)
            SELECT 'default', 0, 'k' || k, s, 0, k, 1, 1 FROM generate_series(1, 5000) k, generate_series(0, 3) s
        """)
        conn.execute("VACUUM (ANALYZE) leaseq_fairness_shares")
        conn.execute("VACUUM (ANALYZE) leaseq_tasks")
    plan = _generic_plan(pg_schema_dsn, "claim_fair", dict(SAMPLE, worker_id=worker))
    shown = json.dumps(plan, indent=1)[:8000]
    reads = _share_reads(_subplan(plan, "CTE fair_start"))
    assert ("Index Scan", "leaseq_fairness_shares_pkey") in reads, (reads, shown)
    assert any(index == "leaseq_fairness_shares_vstart" for _, index in reads), (reads, shown)
    assert {index for _, index in reads} <= {"leaseq_fairness_shares_pkey", "leaseq_fairness_shares_vstart"}, reads
    charge = _subplan(plan, "CTE charged")
    assert charge["Node Type"] == "ModifyTable" and charge["Relation Name"] == "leaseq_fairness_shares", shown
    assert charge["Conflict Arbiter Indexes"] == ["leaseq_fairness_shares_pkey"], shown


def test_sqlite_fair_claim_work_does_not_grow_with_a_key_backlog(tmp_path) -> None:
    """SQLite's fair claim does the same work over a backlog ten times deeper (counted in
    virtual machine steps): it reads each key by index, a claim's worth at most."""
    steps = {}
    for queued in (4_000, 40_000):
        path = tmp_path / f"fair-{queued}.db"
        q = leaseq.connect(f"sqlite:///{path}")
        q.migrate()
        worker = q.register_worker("plan").id
        q.close()
        with sqlite3.connect(path) as conn:
            conn.execute(SQLITE_FILL, {"status": "completed", "n": 20_000})
            conn.execute(SQLITE_FILL, {"status": "queued", "n": queued})
            conn.execute(FAIR_FILL["sqlite"])
            conn.execute("ANALYZE")
            conn.commit()
            plan = conn.execute("EXPLAIN QUERY PLAN " + load_queries("sqlite")["claim_fair"],
                                dict(CLAIM_PARAMS, worker_id=worker)).fetchall()
            _check_sqlite_fair_steps(plan)
            counted = [0]

            def count() -> int:
                counted[0] += 1
                return 0

            conn.set_progress_handler(count, 100)
            found = conn.execute(load_queries("sqlite")["claim_fair"], dict(CLAIM_PARAMS, worker_id=worker)).fetchall()
            conn.set_progress_handler(None, 0)
            conn.rollback()
        assert len(found) == CLAIM_PARAMS["limit"]
        steps[queued] = counted[0]
    assert steps[40_000] < 1.5 * steps[4_000], steps


#: Leases held by one worker in the renewal plan tests: enough that a walk of
#: every pair for every running row (the old join) is millions of steps.
HELD = 2_000


def _held_leases(dsn: str, *, analyze: bool) -> tuple[str, list[leaseq.Claim]]:
    """``HELD`` leases of one worker; with ``analyze``, statistics taken while every task was still queued."""
    q = leaseq.connect(dsn)
    try:
        q.migrate()
        if dsn.startswith("postgresql"):
            with own_connection(dsn, autocommit=True) as conn:
                conn.execute("ALTER TABLE leaseq_tasks SET (autovacuum_enabled = false)")
        q.enqueue_many("noop", [{"i": i} for i in range(HELD)])
        if analyze:
            if dsn.startswith("postgresql"):
                with own_connection(dsn, autocommit=True) as conn:
                    conn.execute("ANALYZE leaseq_tasks")
            else:
                with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
                    conn.execute("ANALYZE")
        worker = q.register_worker("renewer").id
        claims: list[leaseq.Claim] = []
        while len(claims) < HELD:
            claims += q.claim(worker, limit=HELD - len(claims), lease_seconds=3600)
    finally:
        q.close()
    return worker, claims


def _renew_params(worker: str, claims: list[leaseq.Claim]) -> dict[str, Any]:
    """What the engine passes, and the old statement's generation list beside it (ignored by the new one)."""
    return dict(worker_id=worker, task_ids=[c.task_id for c in claims], generations=[c.generation for c in claims],
                leases={str(c.task_id): c.generation for c in claims})


def _explain_analyze_as_the_store_runs(dsn: str, query: str, params: dict[str, Any]) -> dict[str, Any]:
    """EXPLAIN ANALYZE of ``query`` with the plan leaseq's store gives it, rolled back.

    On leaseq's connections (``plan_cache_mode = force_generic_plan``) every
    statement sent with parameters runs a generic plan, prepared or not; a
    ``plan: generic up to`` one given a longer list is planned for its values.
    """
    sql = load_queries("postgres")[query]
    with own_connection(dsn, autocommit=True) as conn:
        _configure(conn)
        with conn.transaction(force_rollback=True):
            conn.execute(AS_OWNER)
            if query in GENERIC_PLAN:  # as its function runs it (leaseq.store.functions)
                conn.execute("SET LOCAL jit = off")
            sized = load_named_queries("postgres")[query].custom_above
            if sized is not None and len(params[sized[0]]) > sized[1]:
                with psycopg.ClientCursor(conn) as cur:
                    cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, _encode(params))
                    [[doc]] = cur.fetchall()
                return doc[0]["Plan"]
            order = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
            conn.execute("PREPARE renew_plan AS " + re.sub(r"%\((\w+)\)s", lambda m: f"${order.index(m[1]) + 1}",
                                                             sql))
            with psycopg.ClientCursor(conn) as cur:
                cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE renew_plan(" + ", ".join(["%s"] * len(order))
                            + ")", [_encode(params)[k] for k in order])
                [[doc]] = cur.fetchall()
            return doc[0]["Plan"]


def _rows_looked_at(plan: dict[str, Any]) -> int:
    """Rows every node of an analysed plan read and threw away (filters and join filters), loops counted."""
    loops = plan.get("Actual Loops", 1)
    here = loops * (plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Join Filter", 0))
    return here + sum(_rows_looked_at(child) for child in plan.get("Plans", []))


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan] + [n for child in plan.get("Plans", []) for n in _nodes(child)]


@pytest.mark.parametrize("analyze", [False, True], ids=["fresh", "stale-statistics"])
def test_postgres_renewal_of_many_leases_reads_each_row_once(pg_schema_dsn: str, analyze: bool) -> None:
    worker, claims = _held_leases(pg_schema_dsn, analyze=analyze)
    plan = _explain_analyze_as_the_store_runs(pg_schema_dsn, "renew_leases", _renew_params(worker, claims))
    shown = re.sub(r"'[{][^']{200,}'", "'{…}'", json.dumps(plan, indent=1))[:4000]  # without the long lists
    assert plan["Node Type"] == "ModifyTable" and plan["Actual Rows"] == HELD, shown  # every lease renewed
    # Each running row is looked at once: no walk of the pairs for every row.
    assert _rows_looked_at(plan) <= HELD, (_rows_looked_at(plan), shown)
    assert not [n for n in _nodes(plan) if n["Node Type"] == "Function Scan"], shown
    # The id list reaches the planner as a value (counted, and probed by hash), not as a parameter:
    # HELD is above the renewal's generic plan's batch (plan: generic up to).
    tasks = [n for n in _nodes(plan) if n.get("Relation Name") == "leaseq_tasks"]
    assert not [n for n in tasks if "$" in n.get("Index Cond", "") + n.get("Filter", "")], shown


def test_the_renewal_runs_one_plan_for_a_workers_batch_and_plans_a_long_list_for_its_values() -> None:
    """A worker's usual batch runs the cached generic plan; a longer list is planned for its values."""
    assert "renew_leases" in GENERIC_PLAN
    assert load_named_queries("postgres")["renew_leases"].custom_above == ("task_ids", RENEW_GENERIC_UP_TO)


#: How many leases a renewal names at most and still runs its function's generic plan.
RENEW_GENERIC_UP_TO = 32


def _nested_plans(q: leaseq.Queue, call: Callable[[], object]) -> list[str]:
    """The plans of the statements ``call`` runs inside the functions, on ``q``'s one
    pooled connection (auto_explain, nested statements)."""
    notes: list[str] = []
    with q.store._pool.connection() as conn:
        for sql in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                    "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_level = notice",
                    "SET auto_explain.log_verbose = on"):
            conn.execute(sql)
        conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
    call()
    with q.store._pool.connection() as conn:
        conn.execute("SET auto_explain.log_min_duration = -1")
    return notes


@pytest.mark.parametrize("held", [RENEW_GENERIC_UP_TO, RENEW_GENERIC_UP_TO + 1])
def test_postgres_renewal_function_plans_a_list_longer_than_a_batch_for_its_values(pg_schema_dsn: str,
                                                                                    held: int) -> None:
    """The renewal's function, as the library calls it: up to 32 leases the id list stays a
    parameter (the session's one plan), above that it reaches the planner as a value."""
    q = leaseq.connect(pg_schema_dsn, max_size=1)
    try:
        q.migrate()
        q.enqueue_many("noop", [{"i": i} for i in range(held)])
        worker = q.register_worker("renewer")
        claims = q.claim(worker, limit=held, lease_seconds=3600)
        assert len(claims) == held
        renewed: dict[int, Any] = {}
        plans = _nested_plans(q, lambda: renewed.update(q.renew_leases(worker, claims)))
        assert set(renewed) == {c.task_id for c in claims}  # either way, every lease renewed
    finally:
        q.close()
    [renewal] = [p for p in plans if "Update on" in p and "leaseq_tasks" in p]
    ids = ",".join(str(c.task_id) for c in sorted(claims, key=lambda c: c.task_id))
    if held <= RENEW_GENERIC_UP_TO:
        assert "ANY ($1)" in renewal and ids not in renewal, renewal
    else:
        assert "ANY ($1)" not in renewal and ids in renewal, renewal


def test_postgres_claims_hold_the_epochs_cluster_part_as_a_value(pg_schema_dsn: str) -> None:
    """The claims' generic plans carry the cluster part of the lease epoch as a constant,
    read when the session planned them (schema 42): no claim reads pg_control."""
    worker = _pg_queue(pg_schema_dsn, 0, 10)
    with own_connection(pg_schema_dsn, autocommit=True) as conn:
        [[cluster]] = conn.execute("SELECT ((pg_control_system()).system_identifier >> 32) * 1000000").fetchall()
    claims = [name for name in sorted(GENERIC_PLAN) if name.startswith("claim_") and name != "claim_fair"]
    assert "claim_batch" in claims and "claim_plain" in claims
    for name in claims:
        plan = json.dumps(_generic_plan(pg_schema_dsn, name, dict(SAMPLE, worker_id=worker), verbose=True))
        assert "claim_epoch" in load_queries("postgres")[name], name
        assert f"'{cluster}'::bigint" in plan and "pg_control_system" not in plan \
            and "leaseq_cluster_epoch" not in plan, (name, plan[:3000])


@pytest.mark.parametrize("analyze", [False, True], ids=["fresh", "analysed"])
def test_sqlite_renewal_of_many_leases_finds_each_row_by_id(tmp_path, analyze: bool) -> None:
    path = tmp_path / "renew.db"
    worker, claims = _held_leases(f"sqlite:///{path}", analyze=analyze)
    params = _renew_params(worker, claims)
    params = {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in params.items()}
    with sqlite3.connect(path) as conn:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + load_queries("sqlite")["renew_leases"],
                                               params)]
    # One pass over the leases named, each task found by its primary key: not
    # a scan of one list for every entry of another, nor of the tasks.
    assert len([step for step in plan if "VIRTUAL TABLE" in step]) == 1, plan
    assert plan.index(next(s for s in plan if "VIRTUAL TABLE" in s)) < plan.index(
        next(s for s in plan if "INTEGER PRIMARY KEY" in s)), plan
    assert not [step for step in plan if step.startswith("SCAN t ") or step.startswith("SCAN leaseq_tasks")
                or "TEMP B-TREE" in step], plan
    q = leaseq.connect(f"sqlite:///{path}")
    try:
        assert set(q.renew_leases(worker, claims)) == {c.task_id for c in claims}
    finally:
        q.close()


def _index_reads(plan: dict[str, Any], sorted_above: bool = False) -> list[tuple[str, str, str, bool]]:
    """``(relation, index or node type, index condition, sorted_above)`` for every read of a table."""
    sorted_here = sorted_above or plan["Node Type"] in ("Sort", "Incremental Sort")
    found = []
    if "Relation Name" in plan and plan["Node Type"] != "ModifyTable":
        found.append((plan["Relation Name"], plan.get("Index Name", plan["Node Type"]), plan.get("Index Cond", ""),
                      sorted_here))
    for child in plan.get("Plans", []):
        found += _index_reads(child, sorted_here)
    return found


#: The sweeps' reads, each of one queue (schema 41): the index each walks, in its own order.
SWEEP_INDEX = {"lock_expired": ("leaseq_tasks", "leaseq_tasks_leases"),
               "lock_sleepers": ("leaseq_tasks", "leaseq_tasks_wake"),
               "lock_overdue": ("leaseq_tasks", "leaseq_tasks_deadline"),
               "prune_action_tokens": ("leaseq_action_tokens", "leaseq_action_tokens_expires")}


@pytest.mark.parametrize("query", sorted(SWEEP_INDEX))
def test_postgres_sweeps_read_one_queue_from_their_index_in_its_order(pg_schema_dsn: str, query: str) -> None:
    """BY QUEUE: each sweep locks rows of its one queue, read from an index that leads with the
    queue, in the order the sweep takes them (no sort): never the entries of every queue."""
    worker = _pg_queue(pg_schema_dsn, 20_000, 20_000)
    plan = _generic_plan(pg_schema_dsn, query, dict(SAMPLE, worker_id=worker))
    relation, index = SWEEP_INDEX[query]
    reads = [r for r in _index_reads(plan) if r[0] == relation and r[1] != f"{relation}_pkey"]
    assert [(r[1], r[3]) for r in reads] == [(index, False)], json.dumps(plan, indent=1)[:6000]
    assert "queue = $" in reads[0][2], json.dumps(plan, indent=1)[:6000]


def test_postgres_claims_routing_check_reads_its_own_queue(pg_schema_dsn: str) -> None:
    """The claim's routing check (claim_head): its expired lease and its due sleeper are looked
    for in the claiming queue's entries of the leases and wake indexes only."""
    worker = _pg_queue(pg_schema_dsn, 20_000, 20_000)
    for query in ("claim_batch", "claim_fair", "claim_fair_one", "claim_fair_one_plain", "claim_plain"):
        plan = _generic_plan(pg_schema_dsn, query, dict(SAMPLE, worker_id=worker))
        routing = [r for r in _index_reads(plan) if r[1] in ("leaseq_tasks_leases", "leaseq_tasks_wake")]
        assert sorted(r[1] for r in routing) == ["leaseq_tasks_leases", "leaseq_tasks_wake"], \
            (query, json.dumps(plan, indent=1)[:6000])
        assert all("queue = $" in r[2] and not r[3] for r in routing), (query, routing)


#: Twenty thousand action tokens of one task's entry (their rows' contents do not shape the plan).
TOKEN_FILL = """
WITH e AS (INSERT INTO leaseq_effects (task_id, generation, action, idempotency_key)
           SELECT id, 1, 'a', 'k' FROM leaseq_tasks ORDER BY id LIMIT 1 RETURNING id, task_id)
INSERT INTO leaseq_action_tokens (token_hash, effect_id, task_id, generation, action, idempotency_key, issued_at,
                                  expires_at, queue)
SELECT repeat('a', 64), e.id, e.task_id, 1, 'a', 'k', now(), now() + i * interval '1 second', 'default'
FROM e, generate_series(1, 20000) i
"""


def test_postgres_sweep_queues_probes_each_queue_by_index(pg_schema_dsn: str) -> None:
    """The sweep's list of queues: a skip from one queue to the next and probes of the sweeps'
    indexes by queue, never a read of every task."""
    worker = _pg_queue(pg_schema_dsn, 20_000, 20_000)
    with own_connection(pg_schema_dsn, autocommit=True) as conn:  # action tokens, as a busy queue has
        conn.execute(AS_OWNER)
        conn.execute(TOKEN_FILL)
        conn.execute("ANALYZE leaseq_action_tokens")
    plan = _generic_plan(pg_schema_dsn, "sweep_queues", dict(SAMPLE, worker_id=worker, after=None, scan=1000,
                                                            within=None))
    reads = _index_reads(plan)
    assert not [r for r in reads if not r[1].startswith("leaseq_")], json.dumps(plan, indent=1)[:6000]
    assert {r[1] for r in reads} == {"leaseq_tasks_queue_key", "leaseq_tasks_leases", "leaseq_tasks_wake",
                                     "leaseq_tasks_deadline", "leaseq_action_tokens_expires"}, reads
