"""leaseq behind a pooler in transaction mode (PgBouncer, ``?pooler=transaction``) and in the
portable mode (``?portable=true``).

Each transaction through a transaction-mode pooler may run on any of its few
server connections, shared with every other client: a statement prepared on
one (psycopg's ``_pg3_0``...) is missing on the next or collides with another
client's of the same name, a ``SET`` reaches strangers, and a LISTEN hears
nothing. These tests run real clients through a real PgBouncer (Debian's
``pgbouncer``, started per test: about 0.1 s) with two server connections.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq.core.errors import ConfigError
from leaseq.db.dsn import LISTEN_DSN_ENV, PostgresMode, postgres_mode, split_leaseq_options
from pg_modes import own_connection

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


def test_the_dsn_declares_the_mode_and_libpq_never_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LISTEN_DSN_ENV, raising=False)
    dsn = "postgresql://u@h:6432/db?application_name=a%26b&pooler=transaction&sslmode=disable"
    conninfo, mode = postgres_mode(dsn)
    assert conninfo == "postgresql://u@h:6432/db?application_name=a%26b&sslmode=disable"
    assert mode == PostgresMode(pooled=True) and not mode.session_state and not mode.listens
    monkeypatch.setenv(LISTEN_DSN_ENV, "postgresql://u@h:5432/db")
    assert postgres_mode(dsn)[1].listen_dsn == "postgresql://u@h:5432/db" and postgres_mode(dsn)[1].listens
    # the portable mode never listens, and a direct DSN listens on its own connections
    assert postgres_mode("postgresql://h/db?portable=true")[1] == PostgresMode(portable=True)
    assert postgres_mode("postgresql://h/db")[1] == PostgresMode()
    assert postgres_mode("postgresql://h/db", pooler="transaction")[1].pooled  # the keyword declares it too
    assert split_leaseq_options("postgresql://h/db") == ("postgresql://h/db", {})
    with pytest.raises(ConfigError, match="statement mode"):
        postgres_mode("postgresql://h/db?pooler=statement")
    with pytest.raises(ConfigError, match="portable=true or portable=false"):
        postgres_mode("postgresql://h/db?portable=maybe")
    with pytest.raises(ConfigError, match="does not LISTEN"):
        postgres_mode("postgresql://h/db?portable=1", listen_dsn="postgresql://h/db")


def test_a_roles_dsn_keeps_the_mode_of_the_dsn_it_was_made_on() -> None:
    """``leaseq roles create`` on a pooled or portable DSN prints one the role reaches the server
    the same way with (libpq refused the options: the role was made, and its DSN never printed)."""
    from leaseq import roles

    made = roles.role_dsn("postgresql://admin@h:6432/db?application_name=a&pooler=transaction&portable=true",
                          "lq_w", "s3cret")
    assert made == "postgresql://lq_w:s3cret@h:6432/db?application_name=a&pooler=transaction&portable=true"
    assert postgres_mode(made)[1] == PostgresMode(pooled=True, portable=True)


def _clients(dsn: str, clients: int, tasks: int) -> tuple[list[int], list[str]]:
    """``clients`` queues, each enqueuing ``tasks`` then claiming and completing until none is left."""
    done: list[int] = []
    errors: list[str] = []
    start = threading.Barrier(clients)

    def client(i: int) -> None:
        try:
            q = leaseq.connect(dsn, max_size=2)
            try:
                w = q.register_worker(f"client-{i}")
                start.wait(30)
                for n in range(tasks):
                    q.enqueue("job", {"n": n})
                idle = 0
                while idle < 3:
                    claims = q.claim(w, limit=3)
                    idle = 0 if claims else idle + 1
                    for c in claims:
                        q.complete(w, c, {"by": i})
                        done.append(c.task_id)
            finally:
                q.close()
        except Exception as exc:  # every client's first error, reported by the test
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return done, errors


def test_clients_sharing_two_server_connections_complete_every_task(pgbouncer: Any) -> None:
    """Six clients, two server connections: no prepared statement, nothing lost (about 1.5 s).
    Without ``pooler=transaction`` the clients fail at once on each other's prepared statements."""
    dsn = pgbouncer.dsn() + "?pooler=transaction"
    with leaseq.connect(dsn) as q:
        q.migrate()
    done, errors = _clients(dsn, clients=6, tasks=15)
    assert errors == []
    assert sorted(done) == list(range(1, 6 * 15 + 1))
    with leaseq.connect(dsn) as q:
        assert {t.status for t in q.list_tasks(limit=200)} == {"completed"}


def test_an_undeclared_pooler_is_named_in_the_error(pgbouncer: Any) -> None:
    """The same clients without ``?pooler=transaction``: they meet each other's prepared
    statements on the shared server connections, and each one's error names the cause and
    the DSN option (a ``ConfigError``, which stops a worker) instead of a driver error that
    reads as an outage and is retried."""
    dsn = pgbouncer.dsn()
    with leaseq.connect(dsn + "?pooler=transaction") as q:
        q.migrate()
    _, errors = _clients(dsn, clients=6, tasks=15)
    assert errors, "no client met another's prepared statement"
    for error in errors:
        assert error.startswith("ConfigError: dsn: the server connection changed between prepared "
                                "statements"), error
        assert "?pooler=transaction" in error


def test_no_setting_is_left_on_a_shared_server_connection(pgbouncer: Any) -> None:
    dsn = pgbouncer.dsn() + "?pooler=transaction"
    with leaseq.connect(dsn) as q:
        q.migrate()
        w = q.register_worker("w")
        q.enqueue("job")
        for c in q.claim(w, limit=1):
            q.complete(w, c)
    # another client of the pooler, on the server connections leaseq used
    with psycopg.connect(pgbouncer.dsn(), autocommit=True, prepare_threshold=None) as other:
        for _ in range(4):
            row = other.execute("SHOW plan_cache_mode").fetchone()
            assert row == ("auto",)


def test_waits_poll_without_a_listen_dsn(pgbouncer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No LISTEN through the pooler: the queue declares it cannot notify, an idle worker polls
    and sees a new task within a fraction of a second, and a wait returns soon after the end."""
    monkeypatch.delenv(LISTEN_DSN_ENV, raising=False)
    dsn = pgbouncer.dsn() + "?pooler=transaction"
    with leaseq.connect(dsn) as q:
        q.migrate()
        assert not q.capabilities.listen_notify and not q.store.capabilities.listen_notify
        assert q.capabilities.idle_poll_interval <= 0.2
        task = q.enqueue("job")
        w = q.register_worker("w")

        def finish() -> None:
            time.sleep(0.3)
            for c in q.claim(w, limit=1):
                q.complete(w, c)

        threading.Thread(target=finish).start()
        started = time.monotonic()
        ended = q.wait(task.id, timeout=10)
        assert ended.status == "completed"
        assert time.monotonic() - started < 2.0


def test_a_listen_dsn_wakes_waiters_through_the_pooler(pgbouncer: Any, pg_direct_schema_dsn: str) -> None:
    """Notifications sent through the pooler (at commit) reach a LISTEN on the direct connection."""
    dsn = pgbouncer.dsn() + "?pooler=transaction"
    with leaseq.connect(dsn, listen_dsn=pg_direct_schema_dsn) as q:
        q.migrate()
        assert q.capabilities.listen_notify
        listener = q.listener(["default"])
        try:
            q.enqueue("job")
            started = time.monotonic()
            assert listener.wait(10) is True
            assert time.monotonic() - started < 5
        finally:
            listener.close()


def test_a_commit_whose_server_connection_dropped_is_backend_unavailable(pgbouncer: Any) -> None:
    """PgBouncer answers a COMMIT whose server connection was dropped under it with two results
    (psycopg's InternalError, with no SQLSTATE): that is BackendUnavailable, retried as a dropped
    direct connection is, not an unknown error that stops a worker; the next transaction works."""
    from pg_faults import tagged, terminate

    dsn, name = tagged(pgbouncer.dsn() + "?pooler=transaction")
    with leaseq.connect(dsn) as q:
        q.migrate()
        task = q.enqueue("job")
        with pytest.raises(leaseq.BackendUnavailable, match="the connection broke during received 2 results"):
            with q.store.transaction() as tx:
                assert tx.row("get_task", task_id=task.id) is not None
                assert terminate(name=name) >= 1  # the server connection this transaction runs on
        assert q.get(task.id).status == "queued"


def test_a_worker_role_has_a_pool_of_its_own(pg_schema_dsn: str, tmp_path: Any) -> None:
    """Per-role pools: a worker role logs in through the pooler and its calls are its own
    (the definer functions check ``session_user``: the pool's server connections are the role's)."""
    from pgbouncer import SchemaBouncer
    from system_tools import require_tool

    from conftest import _pg_or_skip, _schema_of
    from leaseq import roles

    binary = require_tool("pgbouncer")
    with leaseq.connect(pg_schema_dsn) as admin:
        admin.migrate()
        name = f"lq_worker_{uuid.uuid4().hex[:8]}"
        roles.create_role(admin, "worker", name, queues=["jobs"], password="secret")
        admin.enqueue("job", queue="jobs")
        admin.enqueue("job", queue="other")
        bouncer = SchemaBouncer(binary, _pg_or_skip(), _schema_of(pg_schema_dsn), users=("postgres", name))
        try:
            with leaseq.connect(bouncer.dsn(user=name, password="secret") + "?pooler=transaction") as q:
                w = q.register_worker("scoped")
                claims = q.claim(w, queue="jobs", limit=5)
                assert [c.task.queue for c in claims] == ["jobs"]
                q.complete(w, claims[0])
                with pytest.raises(Exception, match="may not reach queue other"):
                    q.claim(w, queue="other", limit=5)  # the role's scope holds through the pooler
        finally:
            bouncer.stop()
            with own_connection(pg_schema_dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
                conn.execute(f'DROP OWNED BY "{name}"')
                conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def test_the_portable_mode_migrates_without_an_advisory_lock(pg_direct_schema_dsn: str) -> None:
    """A session holding the advisory lock ``migrate`` takes on PostgreSQL does not hold back a
    portable migrate: it locks its bookkeeping table instead. (The holder's session is a direct
    one in every mode: a transaction-mode pooler would hand its lock's server connection on.)"""
    plain = pg_direct_schema_dsn
    with psycopg.connect(plain, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(7431002201)")
        finished = threading.Event()

        def migrate() -> None:
            with leaseq.connect(plain + "&portable=true") as q:
                q.migrate()
                finished.set()

        thread = threading.Thread(target=migrate)
        thread.start()
        try:
            assert finished.wait(20), "the portable migrate waited on the advisory lock"
        finally:
            holder.execute("SELECT pg_advisory_unlock(7431002201)")
            thread.join(30)
    with leaseq.connect(plain + "&portable=true") as q:
        assert not q.capabilities.listen_notify and not q.store.capabilities.advisory_locks
        assert q.schema_version() > 0


def test_the_generic_plan_travels_with_each_function(pg_schema_dsn: str) -> None:
    """The ``plan: generic`` statements keep their generic plans where no session is configured
    (a pooled or portable queue, an application's own connection): the setting is the function's."""
    from leaseq.store.functions import function_name
    from leaseq.store.postgres import GENERIC_PLAN

    with leaseq.connect(pg_schema_dsn) as q:
        q.migrate()
    with own_connection(pg_schema_dsn) as conn:
        config = {name: set(settings or ()) for name, settings in conn.execute(
            "SELECT proname, proconfig FROM pg_proc WHERE pronamespace = current_schema()::regnamespace "
            "AND proname LIKE 'leaseq\\_q\\_%'").fetchall()}
    assert GENERIC_PLAN
    for query in GENERIC_PLAN:
        assert "plan_cache_mode=force_generic_plan" in config[function_name(query)], query
