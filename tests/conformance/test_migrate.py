"""migrate(): idempotent, records the schema version, safe to run concurrently."""

from __future__ import annotations

import asyncio
import threading

import pytest

import leaseq
from leaseq.store.base import load_migrations
from leaseq.store.queries import load_wire_queries


def as_written(*queues: leaseq.Queue) -> None:
    """Send the statements as written, not through their PostgreSQL functions: a schema of an
    older version has none yet (these tests write what an older version wrote, then call
    :func:`upgrade`)."""
    for q in queues:
        if q.dialect == "postgres":
            q.store._queries, q.store._functions = load_wire_queries("postgres"), q.store._queries  # type: ignore[attr-defined]


def upgrade(q: leaseq.Queue, *others: leaseq.Queue) -> list[int]:
    """``q.migrate()``; then every queue calls the functions it made."""
    applied = q.migrate()
    for each in (q, *others):
        if each.dialect == "postgres":
            each.store._queries = each.store._functions  # type: ignore[attr-defined]
    return applied


def as_owner(q: leaseq.Queue) -> str:
    """A statement that lets a test's ad-hoc UPDATE change a lease column: on PostgreSQL only
    the schema's owner may (a trigger refuses everyone else, a superuser too)."""
    return "SET LOCAL ROLE leaseq_owner" if q.dialect == "postgres" else "SELECT 1"


def _latest(dialect: str) -> list[int]:
    return [m.version for m in load_migrations(dialect)]


def test_migrate_is_idempotent_and_records_the_version(dsn: str) -> None:
    with leaseq.connect(dsn) as q:
        assert q.schema_version() == 0
        applied = q.migrate()
        assert applied == _latest(q.dialect) and applied[0] == 1
        assert q.schema_version() == max(applied)
        t = q.enqueue("job", {"keep": True})
        assert q.migrate() == []
        assert q.schema_version() == max(applied)
        assert q.get(t.id).payload == {"keep": True}  # migrating again keeps the data


def test_concurrent_migrations_on_a_fresh_database_both_succeed(dsn: str) -> None:
    queues = [leaseq.connect(dsn) for _ in range(2)]
    start = threading.Barrier(len(queues))
    applied: list[list[int]] = []
    errors: list[BaseException] = []

    def run(q: leaseq.Queue) -> None:
        try:
            start.wait(timeout=10)
            applied.append(q.migrate())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(q,)) for q in queues]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    try:
        assert errors == []
        # exactly one of them did the work; the other found it done
        assert sorted(applied, key=len) == [[], _latest(queues[0].dialect)]
        assert queues[0].schema_version() == queues[1].schema_version() == max(_latest(queues[0].dialect))
        w = queues[1].register_worker("a")
        queues[0].enqueue("job")
        assert len(queues[1].claim(w)) == 1
    finally:
        for q in queues:
            q.close()


def test_concurrent_awaited_migrations_on_a_fresh_database_both_succeed(dsn: str) -> None:
    """The awaited migrate is the source of the blocking one (one method): two at once on a
    fresh database end as two blocking ones do, the loser of the race to create the
    bookkeeping table (SQLite) running again rather than raising."""
    async def both() -> tuple[str, list[list[int]]]:
        queues = [await leaseq.connect_async(dsn) for _ in range(2)]
        try:
            return queues[0].dialect, list(await asyncio.gather(*(q.migrate() for q in queues)))
        finally:
            for q in queues:
                await q.close()

    dialect, applied = asyncio.run(both())
    assert sorted(applied, key=len) == [[], _latest(dialect)]


def test_upgrading_a_version_2_database_keeps_one_enqueued_entry_per_task(dsn: str) -> None:
    """Version 2 stored an "enqueued" event; from version 3 the task row is that
    entry. After the upgrade each trail shows it once, and nothing else goes."""
    with leaseq.connect(dsn) as q:
        as_written(q)
        with q.store.transaction() as tx:
            tx.rows("migrations_create")
            for mig in load_migrations(q.dialect)[:2]:
                tx.script(mig.sql)
                tx.rows("migrations_record", version=mig.version, name=mig.name)
        assert q.schema_version() == 2
        with q.store.transaction() as tx:  # what a version-2 enqueue wrote (in version-2 columns)
            tx.script("INSERT INTO leaseq_tasks (queue, kind, payload, effect, idempotency_key, max_attempts, "
                      "lease_seconds) VALUES ('default', 'job', '{\"old\": true}', 'read_only', 'k-1', 5, 30.0)")
            row = tx.row("get_task_by_key", queue="default", idempotency_key="k-1")
            tx.rows("insert_event", task_id=row["id"], type="enqueued", generation=None, worker_id=None,
                    detail={"queue": "default", "kind": "job"})
            tx.rows("insert_event", task_id=row["id"], type="note", generation=None, worker_id=None,
                    detail={"kept": True})
        assert [e.type for e in q.events(row["id"])] == ["enqueued", "enqueued", "note"]
        assert upgrade(q) == [v for v in _latest(q.dialect) if v > 2]
        events = q.events(row["id"])
        assert [e.type for e in events] == ["enqueued", "note"]
        assert events[0].detail["idempotency_key"] == "k-1" and events[1].detail == {"kept": True}


def _old_intent(q: leaseq.Queue, task_id: int, generation: int, worker_id: str, action: str) -> None:
    """An open intent as begin_effect wrote it before version 12 (no class, no argument digest)."""
    with q.store.transaction() as tx:
        tx.script("INSERT INTO leaseq_effects (task_id, generation, worker_id, action, idempotency_key) "
                  f"VALUES ({task_id}, {generation}, '{worker_id}', '{action}', 'k-{task_id}:{action}')")
        tx.script(f"UPDATE leaseq_tasks SET open_effects = open_effects + 1 WHERE id = {task_id}")
        tx.rows("insert_event", task_id=task_id, type="effect_intent", generation=generation, worker_id=worker_id,
                detail={"action": action})


def test_version_12_gives_existing_entries_their_task_class_so_they_route_as_before(dsn: str) -> None:
    """Version 12 gives each ledger entry its own class. Entries written before it
    take their task's: an open intent of a side_effect task still sends it to
    reconciliation, one of an idempotent task is still retried."""
    with leaseq.connect(dsn) as q:
        as_written(q)
        with q.store.transaction() as tx:
            tx.rows("migrations_create")
            for mig in load_migrations(q.dialect)[:11]:
                tx.script(mig.sql)
                tx.rows("migrations_record", version=mig.version, name=mig.name)
            # the worker as version 11 registered it (today's statement names columns of version 17)
            tx.script("INSERT INTO leaseq_workers (id, name) VALUES ('w-1', 'w')")
        w = leaseq.Worker(id="w-1", name="w")
        # running tasks as version 11 wrote them (written directly: today's statements name
        # columns of later versions)
        now = "now()" if q.dialect == "postgres" else "(julianday('now') - 2440587.5) * 86400.0"
        later = f"{now} + interval '60 seconds'" if q.dialect == "postgres" else f"{now} + 60"
        ids = {}
        for effect in ("side_effect", "idempotent"):
            with q.store.transaction() as tx:
                tx.script(f"""INSERT INTO leaseq_tasks (queue, kind, payload, effect, status, idempotency_key,
                                  max_attempts, lease_seconds, lease_owner, lease_expires_at, claimed_at,
                                  claim_generation, attempts)
                              VALUES ('default', 'job', '{{"e": "{effect}"}}', '{effect}', 'running', 'k-{effect}',
                                      5, 30, '{w.id}', {later}, {now}, 1, 1)""")
                ids[effect] = tx.row("get_task_by_key", queue="default", idempotency_key=f"k-{effect}")["id"]
            _old_intent(q, ids[effect], 1, w.id, "crm.update")
        assert upgrade(q) == [v for v in _latest(q.dialect) if v > 11]
        for effect, routed in (("side_effect", "needs_reconciliation"), ("idempotent", "queued")):
            task = q.get(ids[effect])
            c = leaseq.Claim(task_id=task.id, generation=1, worker_id=w.id, expires_at=task.lease_expires_at,
                             task=task)
            [entry] = q.effects(c.task_id)
            assert (entry.effect, entry.args_digest, entry.status) == (effect, None, "pending")
            assert q.fail(w, c, "boom", delay=0).status == routed


def test_version_7_widens_the_statuses_for_every_open_connection_and_keeps_the_trail(dsn: str) -> None:
    """Version 7 admits the waiting and never-started statuses. On SQLite the CHECK is
    widened in place: a connection opened before the upgrade must see the new
    definition, and no task's events or effects may go (a table rebuild would
    cascade-delete them)."""
    with leaseq.connect(dsn) as q, leaseq.connect(dsn) as other:
        as_written(q, other)
        with q.store.transaction() as tx:
            tx.rows("migrations_create")
            for mig in load_migrations(q.dialect)[:6]:
                tx.script(mig.sql)
                tx.rows("migrations_record", version=mig.version, name=mig.name)
            # a running side-effect task with its claim and an open intent, as version 6 wrote them
            # (written directly: today's statements name columns of later versions)
            now = "now()" if q.dialect == "postgres" else "(julianday('now') - 2440587.5) * 86400.0"
            later = f"{now} + interval '60 seconds'" if q.dialect == "postgres" else f"{now} + 60"
            tx.script("INSERT INTO leaseq_workers (id, name) VALUES ('w-1', 'w')")
            tx.script(f"""INSERT INTO leaseq_tasks (queue, kind, payload, effect, status, idempotency_key,
                              max_attempts, lease_seconds, lease_owner, lease_expires_at, claimed_at,
                              claim_generation, attempts, open_effects)
                          VALUES ('default', 'job', '{{"keep": true}}', 'side_effect', 'running', 'k-1', 5, 30,
                                  'w-1', {later}, {now}, 1, 1, 1)""")
            tx.script("""INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
                         VALUES (1, 'claimed', 1, 'w-1', '{}'), (1, 'effect_intent', 1, 'w-1', '{}')""")
            tx.script("""INSERT INTO leaseq_effects (task_id, generation, worker_id, action, idempotency_key)
                         VALUES (1, 1, 'w-1', 'mail.send', 'k-1:mail.send')""")
        task = q.get(1)
        before = [e.type for e in q.events(task.id)]
        assert before == ["enqueued", "claimed", "effect_intent"]
        with other.store.transaction() as tx:  # this connection now holds the version-6 schema
            assert tx.row("get_task", task_id=task.id)["status"] == "running"
        assert upgrade(q, other) == [v for v in _latest(q.dialect) if v > 6]
        assert [e.type for e in q.events(task.id)] == before and q.get(task.id).status == "running"
        upgraded = q.get(task.id)  # version 8's budget columns start empty on existing tasks
        assert (upgraded.timeout_seconds, upgraded.deadline_at, upgraded.snoozes) == (None, None, 0)
        assert (upgraded.limits, upgraded.units) == (None, 1)  # and the limits migration's: none, weight 1
        for status in ("waiting", "awaiting_approval", "denied", "expired"):
            extra = other.enqueue("job", {"s": status})
            with other.store.transaction() as tx:
                tx.script(as_owner(q))
                tx.script(f"UPDATE leaseq_tasks SET status = '{status}' WHERE id = {extra.id}")
            assert q.get(extra.id).status == status
        with pytest.raises(Exception, match="(?i)check"):
            with other.store.transaction() as tx:
                tx.script(as_owner(q))
                tx.script(f"UPDATE leaseq_tasks SET status = 'sleeping' WHERE id = {task.id}")


def test_version_10_adds_the_trace_context_and_old_tasks_carry_none(dsn: str) -> None:
    """Version 10 stores the caller's trace context with a task. A task written
    before it reads None, is claimed and completed as before, and a connection
    opened before the upgrade stores the new column at once."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with leaseq.connect(dsn) as q, leaseq.connect(dsn) as other:
        as_written(q, other)
        with q.store.transaction() as tx:
            tx.rows("migrations_create")
            for mig in load_migrations(q.dialect)[:9]:
                tx.script(mig.sql)
                tx.rows("migrations_record", version=mig.version, name=mig.name)
            tx.script("INSERT INTO leaseq_tasks (queue, kind, payload, effect, idempotency_key, max_attempts, "
                      "lease_seconds) VALUES ('default', 'job', '{\"old\": true}', 'read_only', 'k-9', 5, 30.0)")
        with other.store.transaction() as tx:  # this connection now holds the version-9 schema
            assert "trace_context" not in tx.row("get_task_by_key", queue="default", idempotency_key="k-9")
        assert upgrade(q, other) == [v for v in _latest(q.dialect) if v > 9]
        w = q.register_worker("w")
        [claim] = q.claim(w)
        assert claim.task.payload == {"old": True} and claim.task.trace_context is None
        q.complete(w, claim, "done")
        new = other.enqueue("job", {"new": True}, trace_context=traceparent)
        assert q.get(new.id).trace_context == traceparent



def test_upgrading_to_version_14_links_the_intents_recorded_before(dsn: str) -> None:
    """Version 14 adds parent_task_id and the requester's worker: an intent recorded before (its
    parent's ledger holds the child's id) gets both, from that ledger entry; other tasks get neither."""
    with leaseq.connect(dsn) as q:
        as_written(q)
        with q.store.transaction() as tx:
            tx.rows("migrations_create")
            for mig in load_migrations(q.dialect)[:13]:
                tx.script(mig.sql)
                tx.rows("migrations_record", version=mig.version, name=mig.name)
        columns = "(queue, kind, payload, effect, idempotency_key, max_attempts, lease_seconds, status)"
        with q.store.transaction() as tx:  # what a version-13 intent left
            for values in ("'agents', 'agent.run', '{}', 'idempotent', 'ticket-1', 5, 30.0, 'completed'",
                           "'payments', 'payments.refund', '{\"order\": 7}', 'side_effect', "
                           "'ticket-1/intent/refund', 5, 30.0, 'awaiting_approval'",
                           "'default', 'job', '{}', 'read_only', 'plain', 5, 30.0, 'queued'"):
                tx.script(f"INSERT INTO leaseq_tasks {columns} VALUES ({values})")
            parent, child, plain = (tx.row("get_task_by_key", queue=queue, idempotency_key=key)["id"]
                                    for queue, key in (("agents", "ticket-1"), ("payments", "ticket-1/intent/refund"),
                                                       ("default", "plain")))
            tx.script("INSERT INTO leaseq_effects (task_id, generation, worker_id, action, idempotency_key, status, "
                      f"response) VALUES ({parent}, 1, 'worker-1', 'intend:payments.refund', 'intent:refund', "
                      f"'done', '{{\"task_id\": {child}, \"kind\": \"payments.refund\", \"queue\": \"payments\"}}')")
            tx.script("INSERT INTO leaseq_approvals (task_id, digest, requested_by) "
                      f"VALUES ({child}, 'sha256:{'0' * 64}', 'task:{parent}')")
        assert upgrade(q) == [v for v in _latest(q.dialect) if v > 13]
        assert [q.get(i).parent_task_id for i in (parent, child, plain)] == [None, parent, None]
        req = q.approval(child)
        assert (req.requested_by, req.requested_worker, req.requested_token) == (f"task:{parent}", "worker-1", None)
        assert req.digest.startswith("v2:sha256:")  # shown as the version a decision takes

