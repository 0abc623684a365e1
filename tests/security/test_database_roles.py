"""Authority in the database: a worker that holds database credentials can do no more than its lease allows.

Every test here logs in as a role made by ``leaseq roles create`` and sends
what an attacker holding that role's DSN would: the library's own calls,
raw SQL against every leaseq table, and direct calls of the definer
functions with arguments the library would never send. PostgreSQL only:
on SQLite whoever opens the file has full authority (the docs say so).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

import leaseq
from leaseq import roles
from leaseq.auth import AccessDenied
from leaseq.cli.main import cli
from pg_modes import own_connection

from fault.support import wait_for
from fault.test_worker_processes import Workers, lease_expired

TABLES = ("leaseq_tasks", "leaseq_events", "leaseq_effects", "leaseq_workers", "leaseq_approvals", "leaseq_tokens",
          "leaseq_audit", "leaseq_limits", "leaseq_queues", "leaseq_db_roles", "leaseq_dependencies",
          "leaseq_migrations", "leaseq_leader", "leaseq_sessions", "leaseq_worker_kinds", "leaseq_action_tokens",
          "leaseq_stream_items", "leaseq_fairness", "leaseq_fairness_shares")


@pytest.fixture
def admin(pg_schema_dsn: str) -> Iterator[leaseq.Queue]:
    q = leaseq.connect(pg_schema_dsn)
    q.migrate()
    yield q
    q.close()


@pytest.fixture
def make_role(admin: leaseq.Queue) -> Iterator[Callable[..., str]]:
    """Creates login roles through ``leaseq roles create`` (the CLI) and drops them afterwards."""
    made: list[str] = []

    def make(kind: str = "worker", *queues: str) -> str:
        name = f"lq_{kind}_{uuid.uuid4().hex[:8]}"
        args = ["roles", "create", kind, name, *[a for q in queues for a in ("--queue", q)]]
        result = CliRunner().invoke(cli, args, env={"LEASEQ_DSN": admin.store.dsn})
        assert result.exit_code == 0, result.output
        made.append(name)
        return result.stdout.strip().splitlines()[0]

    yield make
    with own_connection(admin.store.dsn, autocommit=True) as conn:
        for name in made:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
            conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def snapshot(admin: leaseq.Queue) -> dict[str, list]:
    """Every row of every leaseq table, read as the admin."""
    out = {}
    with own_connection(admin.store.dsn) as conn:
        for table in TABLES:
            if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is not None:
                out[table] = conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
    return out


def refused(dsn: str, statement: str, params: tuple = ()) -> str:
    """Run ``statement`` as the role of ``dsn``; it must fail. Returns the error."""
    with own_connection(dsn, autocommit=True) as conn:
        try:
            conn.execute(statement, params)
        except psycopg.Error as exc:
            return str(exc)
    raise AssertionError(f"allowed: {statement}")


def test_a_worker_role_runs_the_lease_protocol_through_the_functions(admin, make_role) -> None:
    """The library, as a worker role: register, claim, renew, record an effect, complete,
    fail and release. A claim asking for a seven-day lease gets the task's own."""
    dsn = make_role("worker")
    t1 = admin.enqueue("job", {"n": 1}, effect="idempotent", lease_seconds=30, actions=["crm.update"])
    t2 = admin.enqueue("job", {"n": 2}, lease_seconds=30)
    t3 = admin.enqueue("job", {"n": 3}, lease_seconds=30)
    with leaseq.connect(dsn) as q:
        w = q.register_worker("host")
        claims = q.claim(w, limit=3, lease_seconds=7 * 86400)
        assert sorted(c.task_id for c in claims) == [t1.id, t2.id, t3.id]
        assert all(c.lease_seconds == 30 for c in claims)
        assert all((c.expires_at - admin.now()).total_seconds() <= 30 for c in claims)
        by_id = {c.task_id: c for c in claims}
        q.heartbeat(w, by_id[t1.id])
        fx = q.begin_effect(w, by_id[t1.id], "crm.update", "contact:9")
        q.finish_effect(w, by_id[t1.id], fx, {"ok": True})
        q.complete(w, by_id[t1.id], {"done": 1})
        assert q.fail(w, by_id[t2.id], "boom", delay=0).status == "queued"
        assert q.release(w, by_id[t3.id]).status == "queued"
        assert q.get(t1.id).status == "completed"  # a task it held, it may read
    assert [e.type for e in admin.events(t1.id)][-1] == "completed"


def test_a_worker_roles_calls_read_its_authority_in_their_own_statements(admin, make_role) -> None:
    """Enqueue, claim and completion as a worker role read the role's registry row (and whether
    the worker is the role's) in the function called, not through a nested call of
    leaseq_caller(), a definer function of its own that cost each call about 60 us. Counted by
    PostgreSQL's function statistics, turned on for the role's sessions."""
    dsn = make_role("worker")
    role = psycopg.conninfo.conninfo_to_dict(dsn)["user"]
    with own_connection(admin.store.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER ROLE \"{role}\" SET track_functions = 'all'")

    def calls(function: str) -> int:
        with own_connection(admin.store.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT calls FROM pg_stat_user_functions WHERE schemaname = current_schema() "
                               "AND funcname = %s", (function,)).fetchone()
        return row[0] if row else 0

    with leaseq.connect(dsn) as q:
        w = q.register_worker("host")
        for i in range(5):
            q.enqueue("job", {"n": i})
        for claim in q.claim(w, limit=5):
            q.complete(w, claim, {"ok": True})
    # the role's backend reports its counts as it ends
    # (tasks that name no limit: the lean completion)
    wait_for(lambda: calls("leaseq_q_complete_plain") == 5, what="the role's function counts")
    # (a queue whose tasks name no key: the lean claim)
    assert calls("leaseq_q_insert_task") == 5 and calls("leaseq_q_claim_plain") >= 1
    assert calls("leaseq_caller") <= 1  # at most the connection's own question: what may I do?


@pytest.mark.parametrize("statement", [
    *[f"UPDATE {t} SET {c} = {c}" for t, c in (("leaseq_tasks", "status"), ("leaseq_events", "type"),
                                                ("leaseq_effects", "status"), ("leaseq_workers", "name"),
                                                ("leaseq_approvals", "decision"), ("leaseq_db_roles", "kind"))],
    *[f"DELETE FROM {t}" for t in ("leaseq_tasks", "leaseq_events", "leaseq_effects", "leaseq_workers",
                                   "leaseq_approvals", "leaseq_tokens", "leaseq_audit", "leaseq_db_roles",
                                   "leaseq_action_tokens", "leaseq_worker_kinds")],
    "SELECT token_hash FROM leaseq_action_tokens",
    "INSERT INTO leaseq_workers (id, name) VALUES ('forged', 'forged')",
    "INSERT INTO leaseq_events (task_id, type) VALUES (1, 'completed')",
    "INSERT INTO leaseq_tasks (queue, kind, payload, effect, idempotency_key) "
    "VALUES ('default', 'x', '{}', 'read_only', 'k')",
    "SELECT payload FROM leaseq_tasks",
    "SELECT secret_hash FROM leaseq_tokens",
    "SET ROLE leaseq_owner",
    "SET ROLE postgres",
    "CREATE FUNCTION leaseq_q_evil() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "CREATE TABLE leaseq_evil (x int)",
    "ALTER TABLE leaseq_tasks DISABLE TRIGGER ALL",
    "SELECT * FROM leaseq_q_cancel_task('by a worker', 1)",
    "SELECT * FROM leaseq_q_set_task_status('queued', false, NULL, false, 'awaiting_approval', 1)",
    "SELECT * FROM leaseq_q_decide_approval('approved', 'alice', 'dashboard', 'ok', 1)",
    "SELECT * FROM leaseq_q_set_paused('default', false, 'me')",
    "SELECT * FROM leaseq_q_revoke_worker('someone')",
    "SELECT * FROM leaseq_q_token_list()",
    "SELECT * FROM leaseq_q_prune_tasks(ARRAY[1]::bigint[])",
    "SELECT * FROM leaseq_q_get_task(1)",
    "SELECT * FROM leaseq_q_list_events(1)",
    "SELECT * FROM leaseq_q_list_trails(100)",
    "SELECT leaseq_q_insert_event(1, 'completed', 1, NULL, '{}')",
    "SELECT leaseq_q_insert_events('[{\"task_id\": 1, \"type\": \"completed\"}]')",
])
def test_a_worker_role_is_refused_everything_else_and_nothing_changes(admin, make_role, statement) -> None:
    """Raw SQL on every table, another task's payload and trail, the operator's functions,
    becoming another role, defining code in the schema: each refused, nothing changed."""
    gated = admin.enqueue("job", {"secret": "of another task"}, approval="required")
    assert gated.id == 1
    dsn = make_role("worker")
    before = snapshot(admin)
    refused(dsn, statement)
    assert snapshot(admin) == before


def test_a_worker_acts_only_as_identities_its_role_registered_and_within_its_queues(admin, make_role) -> None:
    mine, theirs = make_role("worker", "default"), make_role("worker")
    admin.enqueue("job", {"n": 1})
    admin.enqueue("job", {"n": 2}, queue="payroll")
    with leaseq.connect(theirs) as q:
        other_worker = q.register_worker("other")
    with leaseq.connect(mine) as q:
        w = q.register_worker("mine")
        with pytest.raises(Exception, match="not registered by role"):
            q.claim(other_worker)  # another role's identity
        with pytest.raises(Exception, match="may not reach queue payroll"):
            q.claim(w, queue="payroll")
        before = snapshot(admin)
        with pytest.raises(Exception, match="may not reach queue payroll"):
            q.enqueue("job", {"n": 3}, queue="payroll")
        assert snapshot(admin) == before
        [claim] = q.claim(w)
        q.complete(w, claim, None)


def test_a_stale_worker_cannot_take_its_lease_back_by_hand(admin, make_role) -> None:
    """The issue's first attack: A's lease ran out and B holds generation 2. A, holding
    its DSN, rewrites the lease columns by hand and completes: refused, B completes."""
    dsn_a, dsn_b = make_role("worker"), make_role("worker")
    task = admin.enqueue("job", {"n": 1}, lease_seconds=0.3)
    with leaseq.connect(dsn_a) as qa, leaseq.connect(dsn_b) as qb:
        a, b = qa.register_worker("a"), qb.register_worker("b")
        [claim_a] = qa.claim(a)
        wait_for(lambda: lease_expired(admin, task.id), what="A's lease to run out")
        # B's lease long enough for a loaded machine to finish (a claim's lease is capped at the
        # task's own, which had to be short for A's to run out): not a lease column, the owner's to set
        with own_connection(admin.store.dsn, autocommit=True) as conn:
            conn.execute("UPDATE leaseq_tasks SET lease_seconds = 30 WHERE id = %s", (task.id,))
        [claim_b] = qb.claim(b, lease_seconds=30.0)
        assert claim_b.generation == 2
        refused(dsn_a, "UPDATE leaseq_tasks SET lease_owner = %s, claim_generation = claim_generation + 1, "
                       "lease_expires_at = now() + interval '1 hour' WHERE id = %s", (a.id, task.id))
        refused(dsn_a, "SELECT * FROM leaseq_q_renew_leases(ARRAY[%s]::bigint[], %s, %s::jsonb)",
                (task.id, b.id, f'{{"{task.id}": 2}}'))  # B's identity: not A's role's
        with pytest.raises(leaseq.LeaseLost):
            qa.complete(a, claim_a, {"from": "a"})
        qb.complete(b, claim_b, {"from": "b"})
    assert admin.get(task.id).result == {"from": "b"}


#: The lease epoch as schema 25 defines it, read from the server itself.
TRUE_EPOCH = ("SELECT ((pg_control_system()).system_identifier >> 32) * 1000000"
              " + ('x' || left(pg_walfile_name(pg_current_wal_insert_lsn()), 8))::bit(32)::bigint")


def test_a_worker_role_cannot_forge_the_lease_epoch_its_session_caches(admin, make_role) -> None:
    """The epoch's cluster part is read once per server session (schema 42): a worker role,
    in the very session its claims run in, shadows the function that reads it, sets a
    setting named after it, and tries to replace it; its claims still carry the server's epoch."""
    dsn = make_role("worker")
    tasks = [admin.enqueue("job", {"n": n}) for n in range(2)]
    with own_connection(admin.store.dsn, autocommit=True) as conn:
        [[epoch]] = conn.execute(TRUE_EPOCH).fetchall()
        schema = conn.execute("SELECT current_schema()").fetchone()[0]
    refused(dsn, "CREATE OR REPLACE FUNCTION leaseq_cluster_epoch() RETURNS bigint LANGUAGE sql AS 'SELECT 7'")
    refused(dsn, f'CREATE FUNCTION "{schema}".leaseq_cluster_epoch(integer) RETURNS bigint LANGUAGE sql AS \'SELECT 7\'')
    with leaseq.connect(dsn, max_size=1) as q:
        w = q.register_worker("forger")
        with q.store._pool.connection() as conn:  # the one session the claims below run in
            conn.execute("CREATE FUNCTION pg_temp.leaseq_cluster_epoch() RETURNS bigint LANGUAGE sql AS 'SELECT 7'")
            conn.execute("SET leaseq.cluster_epoch = '7'")
            conn.commit()
        claims = [*q.claim(w), *q.claim(w)]  # the first plans the claim, the second runs the cached plan
        assert [c.epoch for c in claims] == [epoch, epoch] and sorted(c.task_id for c in claims) == \
            sorted(t.id for t in tasks)


def test_not_even_a_superuser_moves_a_lease_with_an_ad_hoc_update(admin) -> None:
    """The trigger: lease columns change only through the functions (owner's rights)."""
    task = admin.enqueue("job")
    error = refused(admin.store.dsn, "UPDATE leaseq_tasks SET status = 'running', lease_owner = 'x', "
                                     "claim_generation = 7 WHERE id = %s", (task.id,))
    assert "leases change only through leaseq's functions" in error
    assert admin.get(task.id).status == "queued"


@pytest.mark.parametrize("column", ["status", "lease_owner", "lease_expires_at", "claim_generation"])
def test_a_superusers_update_naming_a_lease_column_is_refused_even_one_that_changes_nothing(admin, column) -> None:
    """The trigger judges the statement's SET list (its WHEN is one comparison, cheap on the hot
    path): a lease column named by anyone but the owner is refused, its value changed or not;
    a claim's own update, made as the owner, passes; a column that holds no lease stays writable."""
    task = admin.enqueue("job")
    error = refused(admin.store.dsn, f"UPDATE leaseq_tasks SET {column} = {column} WHERE id = %s", (task.id,))
    assert "leases change only through leaseq's functions" in error
    worker = admin.register_worker("w")
    [claim] = admin.claim(worker)
    with own_connection(admin.store.dsn, autocommit=True) as conn:
        conn.execute("UPDATE leaseq_tasks SET priority = 5 WHERE id = %s", (task.id,))
    admin.complete(worker, claim)
    assert admin.get(task.id).status == "completed"


def test_a_viewer_role_reads_only_its_queues_and_writes_nothing(admin, make_role) -> None:
    dsn = make_role("viewer", "default")
    mine = admin.enqueue("job", {"n": 1})
    other = admin.enqueue("job", {"n": 2}, queue="payroll")
    with leaseq.connect(dsn) as q:
        assert q.get(mine.id).payload == {"n": 1}
        with pytest.raises(Exception, match="may not reach task"):
            q.get(other.id)
        with pytest.raises(Exception, match="permission denied"):
            q.cancel(mine.id)
        with pytest.raises(Exception, match="permission denied"):
            q.enqueue("job")
    assert admin.get(mine.id).status == "queued"


def test_a_viewer_role_reads_every_trail_of_its_queues_and_no_other(admin, make_role) -> None:
    """list_trails, a read across every task, is cut to a scoped role's queues."""
    mine = admin.enqueue("job", {"n": 1})
    admin.enqueue("job", {"n": 2}, queue="payroll")
    read = "SELECT task_id, type FROM leaseq_q_list_trails(100)"
    with own_connection(make_role("viewer", "default")) as conn:
        assert conn.execute(read).fetchall() == [(mine.id, "enqueued")]
    with own_connection(make_role("viewer")) as conn:
        assert sorted(conn.execute(read).fetchall()) == [(1, "enqueued"), (2, "enqueued")]


def test_a_worker_role_scoped_to_queues_sweeps_those_queues_only(admin, make_role) -> None:
    """Every sweep takes its queue (schema 41), checked against a scoped role's queues: the
    role's sweep routes its queues' expired leases, and another queue's are not its to route."""
    mine = admin.enqueue("job", {"n": 1}, lease_seconds=1)
    theirs = admin.enqueue("job", {"n": 2}, queue="payroll", lease_seconds=1)
    other = admin.register_worker("other")
    admin.claim(other, lease_seconds=1)
    admin.claim(other, queue="payroll", lease_seconds=1)
    wait_for(lambda: lease_expired(admin, mine.id) and lease_expired(admin, theirs.id), what="both leases expired")
    dsn = make_role("worker", "default")
    with own_connection(dsn) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT id FROM leaseq_q_lock_expired('payroll', 10)")
    with leaseq.connect(dsn) as q:
        assert q.sweep() == 1
    assert (admin.get(mine.id).status, admin.get(theirs.id).status) == ("queued", "running")
    assert admin.sweep() == 1 and admin.get(theirs.id).status == "queued"


def test_a_scoped_roles_bounded_sweep_walks_its_own_queues(admin, make_role) -> None:
    """A pass of the sweep examines at most max_queues queues: a role scoped to queues walks its
    own, so queues it may not reach, earlier in name order, neither use up its passes nor hide
    where the next one resumes (its queues would never be reached)."""
    from conformance.support import run_out

    other = admin.register_worker("other")
    tasks = {}
    for name in ("a1", "a2", "a3", "mine1", "mine2", "mine3"):
        tasks[name] = admin.enqueue("job", {}, queue=name)
        [c] = admin.claim(other, queue=name)
        run_out(admin, other, c)
    with leaseq.connect(make_role("worker", "mine1", "mine2", "mine3", "nothing-there")) as q:
        assert q.sweep(max_queues=2) == 2 and q.sweep_resumes_after == "mine2"
        assert q.sweep(max_queues=2) == 1 and q.sweep_resumes_after is None
    assert [admin.get(tasks[n].id).status for n in sorted(tasks)] == ["running"] * 3 + ["queued"] * 3
    assert admin.sweep(max_queues=2) == 2 and admin.sweep_resumes_after == "a2"


def test_a_worker_role_that_routes_a_strangers_expired_lease_cannot_read_that_task(admin, make_role) -> None:
    """The expiry sweep a worker runs changes tasks it never held; changing one must not
    make it readable (a row this transaction changed counts as the worker's only when the
    transaction inserted it)."""
    victim = admin.enqueue("job", {"secret": "of another task"}, lease_seconds=1)
    admin.claim(admin.register_worker("other"), lease_seconds=1)
    wait_for(lambda: lease_expired(admin, victim.id), what="the victim's lease expired")
    dsn = make_role("worker")
    with own_connection(dsn) as conn:
        locked = [r[0] for r in conn.execute("SELECT id FROM leaseq_q_lock_expired('default', 10)").fetchall()]
        assert locked == [victim.id]
        conn.execute("SELECT * FROM leaseq_q_route_expired(%s)", ([victim.id],))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="never held task"):
            conn.execute("SELECT payload FROM leaseq_q_get_task(%s)", (victim.id,))
        conn.rollback()
    # the library's own sweep, run as the role, still routes it
    with leaseq.connect(dsn) as q:
        q.sweep()
    assert admin.get(victim.id).status == "queued"


def test_a_scoped_viewer_reads_across_queues_only_its_own(admin, make_role) -> None:
    dsn = make_role("viewer", "default")
    admin.enqueue("job", {"n": 1})
    admin.enqueue("job", {"n": 2}, queue="payroll")
    admin.enqueue_many("job", [{"n": 3}, {"n": 4}], queue="payroll", fairness_key="acme")  # for the fair-share reads
    assert admin.claim(admin.register_worker("w2"), queue="payroll", limit=2)
    admin.pause("payroll")
    with leaseq.connect(dsn) as q:
        assert {s["queue"] for s in q.stats()} == {"default"}
        assert {s["name"] for s in q.queues()} <= {"default"}
    with own_connection(dsn, autocommit=True) as conn:
        for query in ("leaseq_q_stats()", "leaseq_q_list_queues()", "leaseq_q_known_queues(100)",
                      "leaseq_q_dashboard_completed_by_minute(NULL, 3600)", "leaseq_q_dashboard_failures_by_minute(NULL, 3600)",
                      "leaseq_q_open_intents_by_queue()", "leaseq_q_dashboard_worker_leases(NULL, 100)",
                      "leaseq_q_dashboard_fair_queued(100)", "leaseq_q_dashboard_fair_claims(1000, 3600, 100)"):
            assert "payroll" not in str(conn.execute(f"SELECT * FROM {query}").fetchall()), query
    for query in ("leaseq_q_audit_list(10)", "leaseq_q_list_workers()", "leaseq_q_served_kinds()",
                  "leaseq_q_dashboard_kinds(NULL)", "leaseq_q_dashboard_workers(NULL)", "leaseq_q_dashboard_worker_last_events(100)",
                  "leaseq_q_list_limits(NULL)"):
        assert "covers every queue" in refused(dsn, f"SELECT * FROM {query}"), query
    with leaseq.connect(dsn) as q, pytest.raises(AccessDenied, match="covers every queue"):
        q.workers()
    # unscoped, the same reads see every queue
    with leaseq.connect(make_role("viewer")) as q:
        assert {s["queue"] for s in q.stats()} == {"default", "payroll"}
    with own_connection(make_role("viewer"), autocommit=True) as conn:
        for query in ("leaseq_q_dashboard_fair_queued(100)", "leaseq_q_dashboard_fair_claims(1000, 3600, 100)"):
            assert "payroll" in str(conn.execute(f"SELECT * FROM {query}").fetchall()), query


def test_a_scoped_operator_cannot_run_retention_over_other_queues(admin, make_role) -> None:
    """Retention reaches every queue's ended tasks: a role limited to some queues is refused it,
    and nothing of another queue is cleared or deleted."""
    w = admin.register_worker("w")
    task = admin.enqueue("job", {"salary": 1}, queue="payroll")
    [claim] = admin.claim(w, queue="payroll")
    admin.complete(w, claim, {"paid": True})
    dsn = make_role("operator", "default")
    with leaseq.connect(dsn) as q:
        for kwargs in ({}, {"payloads_older_than_seconds": 0}):
            with pytest.raises(Exception, match="covers every queue"):
                q.prune(0, **kwargs)
    for query in ("leaseq_q_prune_finished_ids(0, 10)", "leaseq_q_scrub_finished_ids(0, 10)",
                  "leaseq_q_prune_evidence(0, 10)", "leaseq_q_prune_audit(0, 10)",
                  "leaseq_q_prune_flow_keys(0, 10)", "leaseq_q_prune_spend(0, 10)",
                  "leaseq_q_prune_fairness(0, 10)"):
        assert "covers every queue" in refused(dsn, f"SELECT * FROM {query}"), query
    assert admin.get(task.id).result == {"paid": True}
    with leaseq.connect(make_role("operator")) as q:  # unscoped, it may
        assert q.prune(0)["tasks"] == 1


def test_an_operator_role_acts_but_cannot_pose_as_a_worker(admin, make_role) -> None:
    dsn = make_role("operator")
    task = admin.enqueue("job")
    with leaseq.connect(dsn) as q:
        q.pause("default")
        q.resume("default")
        assert q.cancel(task.id).status == "cancelled"
        with pytest.raises(Exception, match="permission denied"):
            q.claim(q.register_worker("op"))


def test_an_operator_role_decides_under_its_own_name_and_cannot_write_another(admin, make_role) -> None:
    dsn = make_role("operator")
    role = psycopg.conninfo.conninfo_to_dict(dsn)["user"]
    gated = admin.enqueue("job", {"n": 1}, approval="required")
    with leaseq.connect(dsn) as q:
        approved = q.approve(gated.id, q.approval(gated.id).digest, note="ok", by="alice (operator token)", via="cli")
    decision = admin.approval(gated.id)
    assert (decision.decided_by, decision.decided_via) == (role, "cli (as alice (operator token))")
    assert approved.status == "queued"
    assert [e.detail["by"] for e in admin.events(gated.id) if e.type == "approved"] == [role]
    with own_connection(admin.store.dsn) as conn:
        assert conn.execute("SELECT actor FROM leaseq_audit WHERE action = 'approve'").fetchall() == [(role,)]

    # the same calls, sent by hand with another name: refused, nothing written
    other = admin.enqueue("job", {"n": 2}, approval="required", approval_deadline=3600)
    before = snapshot(admin)
    for statement in [
        f"SELECT * FROM leaseq_q_decide_approval_in_time('approved', 'alice', 'dashboard', 'ok', {other.id})",
        f"SELECT * FROM leaseq_q_decide_approval('denied', 'alice', 'dashboard', 'no', {other.id})",
        # the deadline's name, before the deadline
        f"SELECT * FROM leaseq_q_decide_approval('denied', 'leaseq:deadline', 'deadline', 'late', {other.id})",
        "SELECT * FROM leaseq_q_audit_insert('alice', 'approve', 'task:1', '{}'::jsonb)",
        f"SELECT leaseq_q_insert_event({other.id}, 'approved', NULL, NULL, '{{\"by\": \"alice\"}}'::jsonb)",
        "SELECT leaseq_q_insert_events('[{\"task_id\": 1, \"type\": \"x\", \"detail\": {\"by\": \"alice\"}}]')",
        "SELECT * FROM leaseq_q_set_paused(true, 'default', true, 'alice')",
    ]:
        assert "acts under its own name" in refused(dsn, statement) or \
            "has not passed its deadline" in refused(dsn, statement), statement
    assert snapshot(admin) == before


def test_a_gates_passed_deadline_never_lets_the_deadlines_name_decide_a_budget_request(admin, make_role) -> None:
    """The deadline's name decides only an undecided request whose own deadline has passed: a
    gate approved in time, whose deadline passed since, does not lend it to the task's later
    request for more budget (a request of its own, schema 38)."""
    dsn = make_role("operator")
    task = admin.enqueue("job", approval="required", approval_deadline=1.0, budget={"tok": 10},
                         effect="idempotent")
    admin.approve(task.id, admin.approval(task.id).digest, by="alice")
    w = admin.register_worker("w")
    [claim] = admin.claim(w)
    assert admin.consume(w, claim, "job:consume:0", "tok", 50)["state"] == "paused"
    while admin.now() < admin.approval(task.id).task.created_at + timedelta(seconds=1.5):
        time.sleep(0.05)
    before = snapshot(admin)
    statement = f"SELECT * FROM leaseq_q_decide_approval('denied', 'leaseq:deadline', 'deadline', 'late', {task.id})"
    assert "has not passed its deadline" in refused(dsn, statement)
    assert snapshot(admin) == before and admin.get(task.id).status == "awaiting_approval"


def _claim_forever(dsn: str, queue_name: str, stop_at: float) -> None:
    with leaseq.connect(dsn) as q:
        try:
            w = q.register_worker("racer")
            while time.monotonic() < stop_at:
                q.claim(w, queue=queue_name, limit=5)
        except Exception:
            return  # revoked: every call refused from the revocation on


@pytest.mark.parametrize("round_", range(3))
def test_revoking_a_role_races_its_claims_and_leaves_it_no_live_lease(admin, make_role, round_) -> None:
    """Processes of a worker role claim in a loop while its role is revoked: after the
    revocation no lease of theirs is live, the role cannot log in, and its tasks go back."""
    dsn = make_role("worker")
    name = psycopg.conninfo.conninfo_to_dict(dsn)["user"]
    admin.enqueue_many("job", [{"n": n} for n in range(200)], lease_seconds=60)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_claim_forever, args=(dsn, "default", time.monotonic() + 20)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        wait_for(lambda: admin.list_tasks(status="running", limit=1), what="the role's first claims")
        out = roles.revoke_role(admin, name)
        assert out["workers_revoked"]
        for p in procs:
            p.join(30)
            assert not p.is_alive()
        now = admin.now()  # a revoked worker's leases end at once (their deadlines moved into the past)
        assert [t.id for t in admin.list_tasks(status="running", limit=500) if t.lease_expires_at >= now] == []
        admin.sweep()  # and the recovery policy routes them
        assert admin.list_tasks(status="running", limit=500) == []
        with pytest.raises(psycopg.OperationalError):
            own_connection(dsn).close()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def test_the_design_notes_operational_test_with_role_separated_worker_processes(admin, make_role, pg_schema_dsn,
                                                                              tmp_path: Path) -> None:
    """SIGSTOP A after its claim; B recovers; SIGCONT A: A is refused everywhere, each
    worker process logged in as a worker role of its own."""
    from leaseq.fencing import FencedStore

    FencedStore(pg_schema_dsn).migrate()
    task = admin.enqueue("fenced_write", {"resource": "account:7", "value": "from-b"}, effect="idempotent",
                         lease_seconds=1.0)
    procs_a = Workers(make_role("worker"), tmp_path, fence_dsn=pg_schema_dsn)
    procs_b = Workers(make_role("worker"), tmp_path, fence_dsn=pg_schema_dsn)
    try:
        a = procs_a.start("a")
        try:
            wait_for(lambda: (tmp_path / "reached-fenced-1").exists(), what="A reached the downstream call")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; A's log: {procs_a.log('a')}") from None
        os.kill(a.pid, signal.SIGSTOP)
        wait_for(lambda: lease_expired(admin, task.id), what="A's lease expired")
        procs_b.start("b")
        try:
            wait_for(lambda: admin.get(task.id).status == "completed", what="B completed the task")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; B's log: {procs_b.log('b')}; {admin.get(task.id)}") from None
        (tmp_path / "go-fenced-1").write_text("")
        os.kill(a.pid, signal.SIGCONT)
        wait_for(lambda: (tmp_path / "stale-1").exists(), what="A's downstream write refused")
        assert not (tmp_path / "applied-1").exists()
        final = admin.get(task.id)
        assert final.claim_generation == 2 and final.result == {"value": "from-b", "generation": 2}
        types = [(e.type, e.generation) for e in admin.events(task.id)]
        assert ("lease_expired", 1) in types and ("completed", 2) in types and ("completed", 1) not in types
    finally:
        procs_a.close()
        procs_b.close()


def test_each_role_knows_its_authority_and_a_worker_role_starts_a_worker_without_the_warning(
        admin, make_role, caplog) -> None:
    import logging

    dsns = {kind: make_role(kind) for kind in ("worker", "operator", "viewer")}
    for kind, dsn in dsns.items():
        with leaseq.connect(dsn) as q:
            assert q.database_authority() == kind
    for dsn, warned in ((dsns["worker"], False), (admin.store.dsn, True)):
        app = leaseq.App(dsn)

        @app.task("noop")
        def noop(ctx) -> None:
            return None

        noop.enqueue()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="leaseq.worker"):
            app.run_worker(until_idle=True)
        assert ("UNSAFE FOR PRODUCTION" in caplog.text) is warned, caplog.text
        app.queue.close()


def test_a_worker_role_holds_back_and_releases_only_the_tasks_its_own_work_touches(admin, make_role) -> None:
    """A worker's enqueue with ``after=`` parks the task it made, and its completion releases
    the tasks waiting for the one it ended. Sent about a stranger's task, each is refused."""
    dsn = make_role("worker")
    victim = admin.enqueue("job", {"n": "queued stranger"})
    up = admin.enqueue("job", {"n": "upstream"})
    waiting = admin.enqueue("job", {"n": "waiting stranger"}, after=[up.id])
    assert admin.get(waiting.id).status == "waiting"
    before = snapshot(admin)
    for statement in (f"SELECT * FROM leaseq_q_hold_tasks(ARRAY[{victim.id}]::bigint[])",
                      f"SELECT leaseq_q_insert_dependencies('cancel', ARRAY[{victim.id}]::bigint[], "
                      f"ARRAY[{up.id}]::bigint[])",
                      f"SELECT * FROM leaseq_q_settle_waiters('[{{\"task_id\": {waiting.id}, \"status\": \"queued\"}}]')"):
        assert "a worker" in refused(dsn, statement)
    assert snapshot(admin) == before
    with leaseq.connect(dsn) as q:  # the same statements, sent by the worker's own work
        w = q.register_worker("w")
        [claim] = q.claim(w)
        assert claim.task_id == victim.id
        child = q.enqueue("job", {"n": "child"}, after=[victim.id])
        assert admin.get(child.id).status == "waiting"
        q.complete(w, claim, None)
    assert admin.get(child.id).status == "queued"


def test_a_worker_role_cannot_free_limit_slots_its_ended_leases_do_not_hold(admin, make_role) -> None:
    """A limit's count of running leases is the truth whatever a worker role sends: slots are
    given back by task (the task's own keys, once per claim generation), never by a key the
    caller names. Freeing by key is granted to no one; naming a running stranger, a task that
    already gave its slots back, or its own ended task twice gives nothing back."""
    admin.set_limit("api", max_running=2, by="ops")
    dsn = make_role("worker")
    other = admin.register_worker("other")
    held = admin.enqueue("job", {"n": "stranger"}, limits=["api"])
    [strangers] = admin.claim(other)
    mine = admin.enqueue("job", {"n": "mine"}, limits=["api"])

    def running() -> int:
        return next(l["running"] for l in admin.limits() if l["key"] == "api")

    assert running() == 1
    refused(dsn, "SELECT * FROM leaseq_q_release_limits('[{\"key\": \"api\", \"units\": 1, \"queue\": \"default\"}]')")
    with own_connection(dsn, autocommit=True) as conn:
        conn.execute("SELECT * FROM leaseq_q_give_back_slots(%s)", ([held.id, mine.id],))
    assert running() == 1 and admin.get(held.id).status == "running"
    with leaseq.connect(dsn) as q:
        w = q.register_worker("w")
        [claim] = q.claim(w)
        assert claim.task_id == mine.id and running() == 2
        assert q.fail(w, claim, "boom", delay=0).status == "queued"
        assert running() == 1
        # its own ended task named again, in transactions of its own and many times in one
        with own_connection(dsn) as conn:
            for _ in range(5):
                conn.execute("SELECT * FROM leaseq_q_give_back_slots(%s)", ([mine.id, mine.id],))
            conn.commit()
        assert running() == 1
    admin.complete(other, strangers, None)
    assert running() == 0
    assert admin.claim(other, limit=5)[0].task_id == mine.id and running() == 1


def test_a_worker_role_records_effects_and_evidence_only_under_a_live_lease(admin, make_role) -> None:
    dsn = make_role("worker")
    task = admin.enqueue("job", {"n": 1}, effect="idempotent", actions=["crm.update"])
    with leaseq.connect(dsn) as q:
        w = q.register_worker("w")
        [claim] = q.claim(w)
        q.complete(w, claim, None)  # held once: its trail is readable, its lease is over
        assert q.get(task.id).status == "completed"
    before = snapshot(admin)
    assert "holds no live lease" in refused(
        dsn, "SELECT * FROM leaseq_q_insert_effect(%s, %s, %s, 'crm.update', 'k', 'idempotent', NULL, NULL, false)",
        (task.id, claim.generation, w.id))
    assert "writes evidence only" in refused(
        dsn, "SELECT leaseq_q_insert_event(%s, 'completed', %s, %s, '{}')", (task.id, claim.generation, w.id))
    assert snapshot(admin) == before


@pytest.mark.parametrize("args", [["roles", "list"], ["roles", "create", "worker", "lq_forged"],
                                  ["roles", "revoke", "lq_someone"]])
def test_a_worker_role_cannot_manage_roles_and_is_told_so_in_one_line(admin, make_role, args) -> None:
    dsn = make_role("worker")
    before = snapshot(admin)
    result = CliRunner().invoke(cli, args, env={"LEASEQ_DSN": dsn})
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: dsn: ") and "Traceback" not in result.output, result.output
    assert snapshot(admin) == before


def test_a_role_holds_at_most_its_connection_limit(admin, make_role) -> None:
    """A stolen credential cannot take every connection the server has: a role made by
    ``leaseq roles create`` holds at most 50 at once, or what --connection-limit says. A limit
    that is no number of connections is refused in one line, and no role is made."""
    with own_connection(admin.store.dsn) as conn:
        def limit_of(role: str) -> int:
            return conn.execute("SELECT rolconnlimit FROM pg_roles WHERE rolname = %s", (role,)).fetchone()[0]

        default = psycopg.conninfo.conninfo_to_dict(make_role("worker"))["user"]
        assert limit_of(default) == roles.DEFAULT_CONNECTION_LIMIT == 50
    name = f"lq_worker_{uuid.uuid4().hex[:8]}"
    result = CliRunner().invoke(cli, ["roles", "create", "worker", name, "--connection-limit", "2"],
                                env={"LEASEQ_DSN": admin.store.dsn})
    assert result.exit_code == 0, result.output
    dsn = result.stdout.strip().splitlines()[0]
    try:
        held = [own_connection(dsn) for _ in range(2)]
        with pytest.raises(psycopg.OperationalError, match="too many connections"):
            own_connection(dsn)
        for c in held:
            c.close()
    finally:
        with own_connection(admin.store.dsn, autocommit=True) as conn:
            conn.execute(f'DROP ROLE IF EXISTS "{name}"')
    for bad in ("0", "-2", "many"):
        other = f"lq_worker_{uuid.uuid4().hex[:8]}"
        result = CliRunner().invoke(cli, ["roles", "create", "worker", other, "--connection-limit", bad],
                                    env={"LEASEQ_DSN": admin.store.dsn})
        assert result.exit_code != 0 and "connection" in result.output.lower(), result.output
        assert "Traceback" not in result.output and "connection" in result.output.splitlines()[-1].lower()
        with own_connection(admin.store.dsn) as conn:
            assert conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (other,)).fetchone() is None


@pytest.fixture
def other_schema(admin: leaseq.Queue) -> Iterator[leaseq.Queue]:
    """A second leaseq schema in the same database: another application's queue."""
    from conftest import with_search_path
    from psycopg.conninfo import conninfo_to_dict

    schema = f"t_other_{uuid.uuid4().hex[:10]}"
    base = admin.store.dsn
    with own_connection(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    options = str(conninfo_to_dict(base).get("options") or "")
    plain = base.split("?", 1)[0] if "search_path" in options else base
    q = leaseq.connect(with_search_path(plain, schema))
    q.migrate()
    try:
        yield q
    finally:
        q.close()
        with own_connection(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_a_role_made_for_one_schema_has_no_authority_in_another(admin, make_role, other_schema) -> None:
    """Group roles are the database's, not the schema's: a worker role made for one
    application's schema reaches another's functions through them. It is refused there:
    it may not register a worker, claim, enqueue or read, and nothing changes."""
    from psycopg.conninfo import conninfo_to_dict

    from conftest import with_search_path

    victim = other_schema.enqueue("payroll", {"account": 7}, lease_seconds=30)
    dsn = make_role("worker")
    other = str(conninfo_to_dict(other_schema.store.dsn)["options"]).rsplit("search_path=", 1)[-1].split()[0]
    there = with_search_path(dsn.split("?", 1)[0], other)
    before = snapshot(other_schema)
    with own_connection(there, autocommit=True) as conn:
        assert conn.execute("SHOW search_path").fetchone()[0].startswith(other)
    for statement in ("SELECT * FROM leaseq_q_register_worker('forged', NULL, NULL)",
                      f"SELECT * FROM leaseq_q_get_task({victim.id})",
                      "SELECT * FROM leaseq_q_list_queues()"):
        refused(there, statement)
    with leaseq.connect(there) as q:
        with pytest.raises(AccessDenied, match="has no leaseq role in schema"):
            q.register_worker("intruder")
        with pytest.raises(AccessDenied, match="has no leaseq role in schema"):
            q.enqueue("payroll", {"account": 8})
    assert snapshot(other_schema) == before


def test_a_worker_role_enqueues_singletons_and_debounced_tasks_within_its_queues(admin, make_role) -> None:
    """Singleton and debounced enqueues as a worker role: the key's lock, the reads of its
    tasks, a cancel_running replacement and a collapse all run through granted functions;
    a role scoped to one queue reaches no other queue's keys."""
    dsn = make_role("worker")
    holder = admin.enqueue("sync", {"v": 1}, singleton_key="cust")
    with leaseq.connect(dsn) as q:
        assert q.enqueue("sync", {"v": 2}, singleton_key="cust").id == holder.id  # skipped
        w = q.register_worker("w")
        [c] = q.claim(w)
        new = q.enqueue("sync", {"v": 3}, singleton_key="cust", on_conflict="cancel_running")
        assert new.enqueue_outcome == "created" and admin.get(holder.id).status == "cancelled"
        with pytest.raises(leaseq.LeaseLost):
            q.complete(w, c, None)
        a = q.enqueue("reindex", {"n": 1}, debounce=60, key="repo")
        b = q.enqueue("reindex", {"n": 2}, debounce=60, key="repo")
        assert (b.id, b.enqueue_outcome, admin.get(a.id).payload) == (a.id, "collapsed", {"n": 2})
    scoped = make_role("worker", "mine")
    other = admin.enqueue("sync", queue="theirs", singleton_key="x")
    before = snapshot(admin)
    with leaseq.connect(scoped) as q:
        with pytest.raises(Exception):
            q.enqueue("sync", queue="theirs", singleton_key="x", on_conflict="cancel_running")
    for statement in (f"SELECT * FROM leaseq_q_cancel_singleton('no', ARRAY[{other.id}]::bigint[], 'theirs', 'x')",
                      "SELECT * FROM leaseq_q_flow_lock('singleton', 'theirs', 'x')"):
        assert "may not reach queue" in refused(scoped, statement)
    assert snapshot(admin) == before
    assert admin.get(other.id).status == "queued"


def test_durable_waits_as_roles_a_worker_waits_and_only_an_operator_signals_under_its_own_name(
        admin, make_role) -> None:
    """A worker role sleeps and waits for signals through the lease-guarded functions; it
    may not send a signal (insert_signal's callers: operator). An operator role signals
    under its own login name whatever ``by`` it gives, and a role scoped to queues only
    signals tasks on them."""
    worker_dsn, operator_dsn = make_role("worker"), make_role("operator")
    scoped_dsn = make_role("operator", "alpha")
    role = psycopg.conninfo.conninfo_to_dict(operator_dsn)["user"]
    task = admin.enqueue("job", {}, idempotency_key="waits-roles")
    other = admin.enqueue("job", {}, queue="beta")
    with leaseq.connect(worker_dsn) as q:
        w = q.register_worker("host")
        [claim] = q.claim(w)
        assert q.sleep(w, claim, "waits-roles:sleep:0", seconds=0.2)["state"] == "suspended"
        assert admin.get(task.id).status == "waiting"
        time.sleep(0.3)
        [claim] = q.claim(w)
        assert q.sleep(w, claim, "waits-roles:sleep:0", seconds=0.2)["state"] == "resumed"
        with pytest.raises(Exception, match="permission denied|may call this"):
            q.signal(task.id, "go")
        assert q.wait_signal(w, claim, "waits-roles:signal:go:0", "go")["state"] == "suspended"
    with leaseq.connect(operator_dsn) as q:
        sent = q.signal(task.id, "go", {"ok": 1}, by="alice (operator token)", via="cli")
    assert sent["sent_by"] == role and sent["woke"] is True
    assert [e.detail["by"] for e in admin.events(task.id) if e.type == "signal_sent"] == [role]
    with leaseq.connect(scoped_dsn) as q:
        with pytest.raises(AccessDenied, match="may not reach task"):
            q.signal(other.id, "go")
    with leaseq.connect(worker_dsn) as q:
        [claim] = q.claim(w)  # the identity its role registered above
        got = q.wait_signal(w, claim, "waits-roles:signal:go:0", "go")
        assert (got["state"], got["payload"], got["sent_by"]) == ("received", {"ok": 1}, role)
        q.complete(w, claim, None)
    refused(worker_dsn, f"SELECT * FROM leaseq_q_insert_signal('forged', {task.id}, 'go', NULL)")


def test_streams_as_roles_a_worker_emits_under_its_lease_and_readers_read_within_their_scope(
        admin, make_role) -> None:
    """A worker role appends to a task's stream through the lease-guarded function, as an
    identity its role registered; another worker role may neither read that stream (it never
    held the task) nor append under the first one's identity; a viewer role reads it, a viewer
    scoped to other queues does not, and neither writes."""
    worker_dsn, stranger_dsn = make_role("worker"), make_role("worker")
    viewer_dsn, scoped_dsn = make_role("viewer"), make_role("viewer", "alpha")
    task = admin.enqueue("job", {}, idempotency_key="streams-roles")
    with leaseq.connect(worker_dsn) as q:
        w = q.register_worker("host")
        [claim] = q.claim(w, lease_seconds=60)
        assert q.emit(w, claim, {"n": 1})["seq"] == 2
        assert q.emit(w, claim, {"plan": 1}, key="streams-roles:emit:0")["replayed"] is False
        assert [e.seq for e in q.stream(task.id, follow=False)] == [1, 2, 3]  # the task its identity holds
    before = snapshot(admin)
    with leaseq.connect(stranger_dsn) as q:
        with pytest.raises(AccessDenied, match="never held task"):
            list(q.stream(task.id, follow=False))
        with pytest.raises(AccessDenied, match="was not registered by role"):
            q.emit(w, claim, "written under another role's identity")
    refused(stranger_dsn, "SELECT * FROM leaseq_q_append_stream('1'::jsonb, NULL, %s, %s, %s)",
            (w.id, task.id, claim.generation))
    with leaseq.connect(viewer_dsn) as q:
        assert [e.item for e in q.stream(task.id, follow=False)] == [None, {"n": 1}, {"plan": 1}]
        with pytest.raises(AccessDenied, match="permission denied|may call this"):
            q.emit(w, claim, "as a viewer")
    with leaseq.connect(scoped_dsn) as q:
        with pytest.raises(AccessDenied, match="may not reach task"):
            list(q.stream(task.id, follow=False))
    assert snapshot(admin) == before
    admin.complete(w, claim, None)


def test_asks_as_roles_a_worker_asks_and_only_an_operator_answers_under_its_own_name(admin, make_role) -> None:
    """A worker role asks a question (ctx.ask) through the lease-guarded wait; it may not answer
    one (open_ask's callers: operator). An operator role answers under its own login name, a
    viewer role lists the open questions, and a role scoped to queues answers only on them."""
    worker_dsn, operator_dsn, viewer_dsn = make_role("worker"), make_role("operator"), make_role("viewer")
    scoped_dsn = make_role("operator", "alpha")
    role = psycopg.conninfo.conninfo_to_dict(operator_dsn)["user"]
    task = admin.enqueue("job", {}, idempotency_key="asks-roles")
    ask = {"question": "go ahead?", "schema": {"type": "boolean"}}
    with leaseq.connect(worker_dsn) as q:
        w = q.register_worker("host")
        [claim] = q.claim(w)
        assert q.wait_signal(w, claim, "asks-roles:ask:0", "leaseq.answer", ask=ask)["state"] == "suspended"
        with pytest.raises(Exception, match="permission denied|may call this"):
            q.answer(task.id, True)
    with leaseq.connect(viewer_dsn) as q:
        assert [a["task_id"] for a in q.asks()] == [task.id]
        with pytest.raises(Exception, match="permission denied|may call this"):
            q.answer(task.id, True)
    with leaseq.connect(scoped_dsn) as q:
        with pytest.raises(AccessDenied, match="may not reach task"):
            q.answer(task.id, True)
    with leaseq.connect(operator_dsn) as q:
        with pytest.raises(leaseq.InvalidInput):
            q.answer(task.id, "yes")
        answered = q.answer(task.id, True, by="alice (operator token)", via="cli")
    assert answered["answered_by"] == role and answered["woke"] is True
    assert [e.detail["by"] for e in admin.events(task.id) if e.type == "answered"] == [role]
    with leaseq.connect(worker_dsn) as q:
        [claim] = q.claim(w)
        got = q.wait_signal(w, claim, "asks-roles:ask:0", "leaseq.answer", ask=ask)
        assert (got["state"], got["payload"], got["sent_by"]) == ("received", True, role)
        q.complete(w, claim, None)


def test_child_tasks_as_roles_a_worker_spawns_waits_and_wakes_its_parent_and_cannot_wake_a_strangers(
        admin, make_role) -> None:
    """A worker role spawns a child and waits for it through the lease-guarded functions, and the
    transaction that completes the child wakes the parent; it may not wake the parents of tasks
    its transaction did not end (wake_parents), nor name a stranger as a child's parent. An
    operator role cancels the tree."""
    worker_dsn, operator_dsn = make_role("worker"), make_role("operator")
    parent = admin.enqueue("plan", {}, idempotency_key="children-roles")
    with leaseq.connect(worker_dsn) as q:
        w = q.register_worker("host")
        [claim] = q.claim(w, kinds=["plan"])
        child = q.spawn(w, claim, "step", {"n": 1}, key="one")
        assert child.parent_id == parent.id
        assert q.spawn(w, claim, "step", {"n": 1}, key="one").id == child.id  # the same child
        assert q.wait_children(w, claim, "children-roles:children:0", [child.id])["state"] == "suspended"
        [lease] = q.claim(w, kinds=["step"])
        q.complete(w, lease, "done")
        assert admin.get(parent.id).status == "queued"  # woken by the worker role's completion
        [claim] = q.claim(w, kinds=["plan"])
        assert q.wait_children(w, claim, "children-roles:children:0", [child.id])["results"] == ["done"]
        second = q.spawn(w, claim, "step", {"n": 2}, key="two")
    stranger = admin.enqueue("other", {})
    before = snapshot(admin)
    assert "wakes only the parents" in refused(
        worker_dsn, f"SELECT * FROM leaseq_q_wake_parents(ARRAY[{second.id}]::bigint[])")
    assert "never held task" in refused(
        worker_dsn, f"SELECT * FROM leaseq_q_set_child_parent({parent.id}, {stranger.id})")
    refused(worker_dsn, f"SELECT * FROM leaseq_q_lock_children_of(ARRAY[{parent.id}]::bigint[])")
    assert snapshot(admin) == before
    with leaseq.connect(operator_dsn) as q:
        report = q.cancel(parent.id, "stop", tree=True)
    assert [(c["task_id"], c["disposition"]) for c in report["children"]] == [(child.id, "completed"),
                                                                               (second.id, "not_started")]


def test_code_changes_as_roles_a_worker_registers_its_versions_and_ends_only_its_own_diverged_attempt(
        admin, make_role) -> None:
    """A worker role registers its code version (the claim stamps it on the task) and ends an
    attempt whose handler diverged from its recorded run through the lease-guarded diverge_task:
    the task goes to needs_reconciliation with its evidence. Another worker role cannot end a
    lease it does not hold that way, nor can an operator or a viewer role call it."""
    worker_dsn, other_dsn = make_role("worker"), make_role("worker")
    operator_dsn, viewer_dsn = make_role("operator"), make_role("viewer")
    task = admin.enqueue("job", {}, idempotency_key="versions-roles", max_attempts=3)
    with leaseq.connect(worker_dsn) as q:
        w = q.register_worker("host", version="2", compatible_versions=["1"])
        [claim] = q.claim(w)
        assert claim.task.code_version == "2"
        fx = q.begin_effect(w, claim, "web.search", "versions-roles:web.search:0", effect="read_only",
                            args_digest="aa" * 16)
        q.finish_effect(w, claim, fx, ["found"])
        q.fail(w, claim, "crashed", delay=0)
        [claim] = q.claim(w)
    with leaseq.connect(other_dsn) as q:
        stranger = q.register_worker("intruder")
    before = snapshot(admin)
    call = "SELECT * FROM leaseq_q_diverge_task('forged', %s, %s, %s)"
    with own_connection(other_dsn, autocommit=True) as conn:  # its own identity: no lease, no row
        assert conn.execute(call, (task.id, stranger.id, claim.generation)).fetchall() == []
    for dsn, why in ((other_dsn, "was not registered by role"), (operator_dsn, "permission denied"),
                     (viewer_dsn, "permission denied")):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=why):
            with own_connection(dsn, autocommit=True) as conn:
                conn.execute(call, (task.id, w.id, claim.generation))
    assert snapshot(admin) == before  # refused, or no row: nothing changed
    with leaseq.connect(worker_dsn) as q:
        with pytest.raises(leaseq.ToolCallDiverged):
            q.begin_effect(w, claim, "web.search", "versions-roles:web.search:0", effect="read_only",
                           args_digest="bb" * 16)
    held = admin.get(task.id)
    assert (held.status, held.attempts, held.code_version) == ("needs_reconciliation", 1, "2")
    assert [e.type for e in admin.events(task.id)][-2:] == ["diverged", "needs_reconciliation"]


def test_a_worker_role_claims_by_fair_share_within_its_queues(admin, make_role) -> None:
    """A worker role enqueues tasks with fairness keys and claims them by fair share (the
    claim stands aside for claim_fair, which charges the keys' rows it cannot touch
    otherwise); a role scoped to one queue claims nothing of another, and cannot charge a
    key by hand."""
    dsn = make_role("worker")
    with leaseq.connect(dsn) as q:
        q.enqueue_many("sync", [{"n": n} for n in range(6)], fairness_key="big")
        q.enqueue("sync", {"n": 99}, fairness_key="small")
        w = q.register_worker("w")
        served = [c.task.fairness_key for c in q.claim(w, limit=4)]
        assert served.count("small") == 1 and served.count("big") == 3, served
    with own_connection(admin.store.dsn) as conn:
        charged = dict(conn.execute("SELECT key, claimed FROM leaseq_fairness").fetchall())
    assert charged == {"big": 3, "small": 1}
    scoped = make_role("worker", "mine")
    admin.enqueue("sync", queue="theirs", fairness_key="t")
    before = snapshot(admin)
    with leaseq.connect(scoped) as q:
        w = q.register_worker("w")
        with pytest.raises(Exception):
            q.claim(w, queue="theirs")
    assert snapshot(admin) == {**before, "leaseq_workers": snapshot(admin)["leaseq_workers"]}
    statement = ("SELECT * FROM leaseq_q_charge_fair_share('theirs', "
                 "'[{\"key\": \"t\", \"priority\": 0, \"start\": 0, \"cost\": 100}]'::jsonb)")
    assert "permission denied" in refused(scoped, statement)
