"""The queue's PostgreSQL fails over to its streaming standby: real servers, SIGKILL, promotion.

Each test starts a private primary and a streaming standby of it
(``pg_basebackup -R``) from the PostgreSQL server binaries, and every
client (the queue, workers, the downstream fence's lease check, the action
token verifier) is given one multi-host DSN naming both, with
``target_session_attrs=read-write``: after the promotion they find the new
primary on their own. The primary is SIGKILLed (postmaster and backends at
once) and the standby promoted.

- Asynchronous replication, the last claim deliberately not replicated
  (the standby's WAL receiver is stopped first): the promoted standby hands
  the task out again *under the same generation*. The lease epoch tells the
  two attempts apart: the old attempt's writes are refused downstream once
  the new holder exists (by the plain fence once the new holder wrote, by
  the fence with the online lease check and by the token verifier at once).
- Synchronous replication, workers running (direct ones, and a remote one
  through `leaseq serve`, all on the multi-host DSN): nothing acknowledged is
  lost, no generation is held by two attempts, nothing is accepted
  downstream twice, and no ledger write that hit the dying primary is
  charged to its task.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import leaseq
from leaseq import auth
from leaseq.client import RemoteQueue
from leaseq.fencing import FencedStore, InvalidActionToken, QueueLeaseCheck, QueueVerifier, StaleToken
from leaseq.worker import WorkerRuntime
from leaseq_chaos.pgserver import ThrowawayPostgres, free_port
from system_tools import require_tool

from .support import Runner, Service, wait_for


def _sql(server: ThrowawayPostgres, query: str) -> object:
    with psycopg.connect(server.dsn(), autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(query).fetchone()
    return None if row is None else row[0]


def replayed(primary: ThrowawayPostgres, standby: ThrowawayPostgres) -> None:
    """Wait until the standby has replayed everything the primary has written so far."""
    lsn = _sql(primary, "SELECT pg_current_wal_lsn()")
    wait_for(lambda: _sql(standby, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"), 15,
             "the standby to replay the primary's WAL")


def cut_replication(standby: ThrowawayPostgres) -> None:
    """Stop the standby's WAL receiver: from now on it sees nothing the primary writes."""
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
        conn.execute("SELECT pg_reload_conf()")
    wait_for(lambda: _sql(standby, "SELECT count(*) = 0 FROM pg_stat_wal_receiver"), 15,
             "the standby's WAL receiver to stop")


def fail_over(primary: ThrowawayPostgres, standby: ThrowawayPostgres) -> None:
    primary.kill()
    standby.promote()


@pytest.fixture
def servers() -> Iterator[list[ThrowawayPostgres]]:
    require_tool("pg_ctl")
    started: list[ThrowawayPostgres] = []
    yield started
    for server in reversed(started):
        server.stop()


def pair(servers: list[ThrowawayPostgres], *, synchronous: bool) -> tuple[ThrowawayPostgres, ThrowawayPostgres, str]:
    """A primary, its streaming standby, and the multi-host DSN naming both (libpq keyword form)."""
    primary = ThrowawayPostgres(max_connections=60)
    servers.append(primary)
    primary.start()
    standby = primary.standby(synchronous=synchronous)
    servers.append(standby)
    dsn = (f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres dbname=postgres "
           "target_session_attrs=read-write connect_timeout=2")
    return primary, standby, dsn


def test_async_failover_hands_a_generation_out_twice_and_the_epoch_refuses_the_old_attempt(
        servers, tmp_path: Path) -> None:
    primary, standby, dsn = pair(servers, synchronous=False)
    q = leaseq.connect(dsn)
    plain = FencedStore(f"sqlite:///{tmp_path / 'plain.db'}")               # the fence alone
    checked = FencedStore(f"sqlite:///{tmp_path / 'checked.db'}", lease_check=QueueLeaseCheck(q))
    verifier = QueueVerifier(dsn)
    try:
        q.migrate()
        for store in (plain, checked):
            store.migrate()
        task = q.enqueue("pay", {"order": 17}, effect="side_effect", lease_seconds=60, actions=["orders.pay"])
        replayed(primary, standby)
        cut_replication(standby)

        # On the old primary: A claims the task and writes downstream; none of it reaches the standby.
        a = q.register_worker("a")
        [claim_a] = q.claim(a)
        fx_a = q.begin_effect(a, claim_a, "orders.pay", "pay:17")
        assert claim_a.generation == 1 and claim_a.epoch > 0
        assert verifier.verify(fx_a.token).fencing_token == claim_a.fencing_token
        for store in (plain, checked):
            assert store.apply("order:17", claim_a.fencing_token, lambda conn: "a") == "a"

        fail_over(primary, standby)

        # The new primary never saw A's claim: the task is queued at generation 0, and B gets
        # generation 1 again. Only the epoch (the promoted standby's new timeline) tells them apart.
        b = wait_for(lambda: _try(lambda: q.register_worker("b")), 20, "the queue on the new primary")
        [claim_b] = q.claim(b)
        assert (claim_b.task_id, claim_b.generation) == (task.id, claim_a.generation)
        assert claim_b.epoch > claim_a.epoch and claim_b.fencing_token != claim_a.fencing_token

        # The fence with the online lease check refuses A at once: generation 1 is running with a
        # live lease, but it is B's, of another epoch.
        with pytest.raises(StaleToken, match="no longer holds its lease"):
            checked.apply("order:17", claim_a.fencing_token, lambda conn: "a again")
        # A's action token was minted on the old primary: the new one does not know it.
        with pytest.raises(InvalidActionToken) as refused:
            verifier.verify(fx_a.token)
        assert refused.value.reason == "unknown_token"
        fx_b = q.begin_effect(b, claim_b, "orders.pay", "pay:17")
        assert verifier.verify(fx_b.token).fencing_token == claim_b.fencing_token
        # The plain fence: B's write is accepted (epoch first: B's attempt is the newer), and from
        # then on A's is refused, though its generation equals B's.
        for store in (plain, checked):
            assert store.apply("order:17", claim_b.fencing_token, lambda conn: "b") == "b"
        with pytest.raises(StaleToken, match="before its attempt"):
            plain.apply("order:17", claim_a.fencing_token, lambda conn: "a again")
        assert plain.newest_attempt("order:17", task.id) == (task.id, claim_b.epoch, claim_b.generation)
        # The queue's own guard refuses A's completion: the lease is B's.
        with pytest.raises(leaseq.LeaseqError):
            q.complete(a, claim_a, {"by": "a"})
        q.complete(b, claim_b, {"by": "b"})
        assert q.get(task.id).result == {"by": "b"}
    finally:
        verifier.close()
        plain.close()
        checked.close()
        q.close()


def _try(call):
    try:
        return call()
    except leaseq.BackendUnavailable:
        return None


TASKS = 60


def _handlers(app: leaseq.App, shop: FencedStore, runs_db: Path) -> None:
    @app.task("pay", effect="side_effect", lease_seconds=10, actions=["orders.pay"], max_attempts=5)
    def pay(ctx: leaseq.TaskContext, order: int) -> dict:
        # One row per handler run that got this far: which attempt ran, and where.
        with sqlite3.connect(runs_db, timeout=30) as db:
            db.execute("INSERT INTO runs VALUES (?, ?, ?, ?)",
                       (ctx.task_id, ctx.claim.epoch, ctx.generation, ctx.claim.worker_id))
        time.sleep(0.03)
        with ctx.effect("orders.pay", key=f"pay:{order}") as fx:
            def charge(conn: sqlite3.Connection) -> str:
                conn.execute("INSERT INTO charges VALUES (?, ?)", (order, fx.fencing_token))
                return fx.fencing_token
            fx.record(shop.apply(f"order:{order}", fx.fencing_token, charge, idempotency_key=fx.idempotency_key))
        return {"order": order}


def test_sync_failover_under_direct_and_remote_workers_loses_nothing_acknowledged(servers, tmp_path: Path) -> None:
    primary, standby, dsn = pair(servers, synchronous=True)
    q = leaseq.connect(dsn)
    shop = FencedStore(f"sqlite:///{tmp_path / 'shop.db'}")
    runs_db = tmp_path / "runs.db"
    with sqlite3.connect(runs_db) as db:
        db.execute("CREATE TABLE runs (task_id INTEGER, epoch INTEGER, generation INTEGER, worker TEXT)")
    service = None
    runners: list[Runner] = []
    try:
        q.migrate()
        shop.migrate()
        with shop.transaction() as conn:
            conn.execute("CREATE TABLE charges (order_id INTEGER, token TEXT)")
        token, _ = auth.create_token(q, name="remote", role="worker", all_queues=True, created_by="test")
        service = Service(dsn, free_port(), tmp_path / "service.log").start()

        direct = leaseq.App(dsn, name="direct")
        remote = leaseq.App(name="remote")       # never connects: its worker goes through the service
        for app in (direct, remote):
            _handlers(app, shop, runs_db)
        runners += [Runner(direct.worker(concurrency=3, poll_interval=0.05)) for _ in range(2)]
        runners.append(Runner(WorkerRuntime(remote, RemoteQueue(service.url, token, timeout=5),
                                            concurrency=3, poll_interval=0.05)))
        tasks = [q.enqueue("pay", {"order": n}, effect="side_effect", lease_seconds=10, actions=["orders.pay"],
                           max_attempts=5) for n in range(TASKS)]

        def completed() -> set[int]:
            return {t.id for t in q.list_tasks(status="completed", limit=1000)}

        done_before = wait_for(lambda: ids if len(ids := completed()) >= TASKS // 3 else None, 30,
                               "a third of the tasks completed")
        fail_over(primary, standby)
        wait_for(lambda: _try(lambda: len(completed()) == TASKS), 40, "every task completed after the failover")
        stats = [r.runtime.stats for r in runners]
        for runner in runners:
            runner.stop()
        runners.clear()

        # Nothing acknowledged lost: every enqueue and every completion seen before the failover.
        final = {t.id: q.get(t.id) for t in tasks}
        assert done_before <= {i for i, t in final.items() if t.status == "completed"}
        assert all(t.status == "completed" for t in final.values())
        # No ledger write that hit the dying primary was charged to its task.
        assert sum(s.failed for s in stats) == 0
        assert not [e for t in tasks for e in q.events(t.id) if e.type == "failed"]
        # No generation held by two attempts, nothing accepted downstream twice.
        with sqlite3.connect(runs_db) as db:
            runs = db.execute("SELECT task_id, generation, count(*) FROM runs GROUP BY 1, 2 HAVING count(*) > 1"
                              ).fetchall()
            epochs = {row[0] for row in db.execute("SELECT DISTINCT epoch FROM runs")}
        assert runs == []
        with shop.transaction() as conn:
            charges = conn.execute("SELECT order_id, count(*) FROM charges GROUP BY 1").fetchall()
        assert sorted(charges) == [(n, 1) for n in range(TASKS)]
        assert len(epochs) == 2, epochs     # claims were made on both sides of the failover
    finally:
        for runner in runners:
            runner.runtime.stop()
        if service is not None:
            service.close()
        shop.close()
        q.close()
