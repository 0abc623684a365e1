"""Shared fixtures: one real database per test, on every backend.

PostgreSQL tests need ``LEASEQ_TEST_PG_DSN`` (for example
``postgresql://postgres@127.0.0.1:5432/test``); without it they skip, unless
``LEASEQ_REQUIRE_PG=1`` is set (CI sets it), in which case they fail.
Each PostgreSQL test gets a schema of its own, dropped afterwards; a test of the
``q`` fixture gets a migrated one, emptied afterwards for a later test of the same
process unless the test changed more than its rows (see ``pg_migrated_dsn``), in
every mode (``LEASEQ_TEST_PG_MODE``: see ``pg_mode_migrated_dsn``).

Under pytest-xdist (``-n N``) each worker process gets a database of its own
on that server (``<db>_gw0``, ``<db>_gw1``, ...: created afresh when the worker
starts, dropped when it ends), and ``LEASEQ_TEST_PG_DSN`` is pointed at it for
the worker and everything it starts. Schemas do not isolate what PostgreSQL
scopes to a database: NOTIFY channels (``leaseq_work``, ``leaseq_task_<id>``,
where ids start at 1 in every schema) and advisory locks. Tests marked
``serial`` run on their own, after the parallel part (see the README).
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

import leaseq

PG_DSN = os.environ.get("LEASEQ_TEST_PG_DSN")
REQUIRE_PG = os.environ.get("LEASEQ_REQUIRE_PG") == "1"
#: How the PostgreSQL tests reach their schema (``LEASEQ_TEST_PG_MODE``: see pg_modes.py).
from pg_modes import POOLED, PORTABLE  # noqa: E402
BACKENDS = ["sqlite", "postgres"]
#: The database this xdist worker created for itself (dropped when it ends).
_WORKER_DB: tuple[str, str] | None = None


def _worker_database(dsn: str, worker: str) -> tuple[str, str, str] | None:
    """``(admin DSN, database name, DSN of that database)`` for xdist worker ``worker``, or
    None when ``dsn`` is not a URL naming a database."""
    parts = urlsplit(dsn)
    base = parts.path.lstrip("/")
    if parts.scheme not in ("postgresql", "postgres") or not base or "/" in base:
        return None
    # the run's own (its controller's pid): runs side by side on one server never share one
    name = f"{base}_{worker}_{os.getppid()}"
    return dsn, name, urlunsplit(parts._replace(path=f"/{name}"))


def _left_by_ended_runs(conn: object, base: str) -> list[str]:
    """Worker databases of runs whose controller is gone (killed before it dropped them)."""
    names = [r[0] for r in conn.execute(  # type: ignore[attr-defined]
        "SELECT datname FROM pg_database WHERE datname LIKE %s", (f"{base}\\_gw%\\_%",)).fetchall()]
    return [n for n in names if n.rsplit("_", 1)[1].isdigit() and not os.path.exists(f"/proc/{n.rsplit('_', 1)[1]}")]


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist: a fresh database of this worker's own, for its tests and their subprocesses."""
    global PG_DSN, _WORKER_DB
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or not PG_DSN:
        return
    found = _worker_database(PG_DSN, worker)
    if found is None:
        return
    import psycopg

    admin, name, dsn = found
    with psycopg.connect(admin, autocommit=True) as conn:
        for stale in _left_by_ended_runs(conn, urlsplit(PG_DSN).path.lstrip("/")):
            conn.execute(f'DROP DATABASE IF EXISTS "{stale}" WITH (FORCE)')
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    _WORKER_DB = (admin, name)
    PG_DSN = os.environ["LEASEQ_TEST_PG_DSN"] = dsn


#: Seconds each test file took (setup, call and teardown of its tests, summed across the run's
#: processes), gathered where reports arrive (the xdist controller, or the one process).
_FILE_SECONDS: dict[str, float] = {}
#: How many of the slowest files the summary names (``LEASEQ_TEST_SLOWEST_FILES``; 0: none).
SLOWEST_FILES = int(os.environ.get("LEASEQ_TEST_SLOWEST_FILES", "15"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The files the run spent most time in (a test's slowness is --durations'; a file's many
    tests that are each quick add up where the time budget goes)."""
    if SLOWEST_FILES <= 0 or os.environ.get("PYTEST_XDIST_WORKER") or not _FILE_SECONDS:
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"slowest {SLOWEST_FILES} files (of {total:.0f} s in tests)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:SLOWEST_FILES]:
        terminalreporter.write_line(f"{seconds:8.1f}s {100 * seconds / total:5.1f}%  {path}")


def pytest_unconfigure(config: pytest.Config) -> None:
    _drop_emptied()
    if _WORKER_DB is None:
        return
    import psycopg

    admin, name = _WORKER_DB
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.Error:  # the next run drops it first
        pass


def _pg_or_skip() -> str:
    if PG_DSN:
        return PG_DSN
    if REQUIRE_PG:
        pytest.fail("LEASEQ_REQUIRE_PG=1 but LEASEQ_TEST_PG_DSN is not set")
    pytest.skip("PostgreSQL tests need LEASEQ_TEST_PG_DSN=postgresql://user@host:port/db")


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` with its search_path set to ``schema``."""
    sep = "&" if "?" in dsn else "?"
    return f"{dsn}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture
def pg_schema_dsn() -> Iterator[str]:
    """A DSN for a fresh, empty PostgreSQL schema (dropped after the test), reached as
    ``LEASEQ_TEST_PG_MODE`` says (directly by default)."""
    import psycopg

    base = _pg_or_skip()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    bouncer = None
    try:
        if POOLED:
            from pgbouncer import SchemaBouncer
            from system_tools import require_tool

            bouncer = SchemaBouncer(require_tool("pgbouncer"), base, schema)
            yield bouncer.dsn() + "?pooler=transaction" + ("&portable=true" if PORTABLE else "")
        elif PORTABLE:
            yield with_search_path(base, schema) + "&portable=true"
        else:
            yield with_search_path(base, schema)
    finally:
        if bouncer is not None:
            bouncer.stop()
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


#: Migrated schemas this process emptied after a test, each with its shape, ready for the next test
#: that asks for a migrated queue: a migration costs about half a second of the server's time,
#: emptying a schema a few milliseconds.
_EMPTIED: list[tuple[str, str]] = []
#: What a test could change of a schema beyond its rows: functions (bodies, rights, settings),
#: relations (columns, options, rights, row security), triggers, constraints, policies, owners.
#: A schema whose shape changed during a test is dropped, not used again.
_SHAPE = """
SELECT md5(concat_ws('|',
    (SELECT string_agg(concat_ws(':', p.proname, md5(p.prosrc), p.proowner, p.prosecdef, p.proacl, p.proconfig),
                       ',' ORDER BY p.oid)
     FROM pg_proc p WHERE p.pronamespace = n.oid),
    (SELECT string_agg(concat_ws(':', c.relname, c.relkind, c.relowner, c.relrowsecurity, c.relacl, c.reloptions),
                       ',' ORDER BY c.oid)
     FROM pg_class c WHERE c.relnamespace = n.oid),
    (SELECT string_agg(concat_ws(':', a.attrelid, a.attname, a.atttypid), ',' ORDER BY a.attrelid, a.attnum)
     FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
     WHERE c.relnamespace = n.oid AND a.attnum > 0 AND NOT a.attisdropped),
    (SELECT string_agg(concat_ws(':', tg.tgname, tg.tgenabled), ',' ORDER BY tg.oid)
     FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid WHERE c.relnamespace = n.oid),
    (SELECT string_agg(concat_ws(':', co.conname, md5(pg_get_constraintdef(co.oid))), ',' ORDER BY co.oid)
     FROM pg_constraint co WHERE co.connamespace = n.oid),
    (SELECT string_agg(po.polname, ',' ORDER BY po.oid)
     FROM pg_policy po JOIN pg_class c ON c.oid = po.polrelid WHERE c.relnamespace = n.oid),
    n.nspowner, n.nspacl))
FROM pg_namespace n WHERE n.nspname = %s
"""


def _shape(conn: object, schema: str) -> str:
    row = conn.execute(_SHAPE, (schema,)).fetchone()  # type: ignore[attr-defined]
    return str(row[0]) if row else ""


@pytest.fixture
def pg_migrated_dsn() -> Iterator[str]:
    """A DSN for a migrated PostgreSQL schema holding no rows but the migrations' own, reached
    directly (:func:`pg_mode_migrated_dsn`, the ``q`` fixture's: as the mode says). The schema
    is emptied after the test and used again by a later test of this process, unless the test
    changed its shape (:data:`_SHAPE`) or left a connection to it open (its connections carry
    the schema's name as their ``application_name``; one still closing has
    :data:`CLOSING_SECONDS` to go); then it is dropped."""
    import psycopg

    base = _pg_or_skip()
    if _EMPTIED:
        schema, shape = _EMPTIED.pop()
    else:
        schema = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        dsn = with_search_path(base, schema)
        queue = leaseq.connect(dsn)
        try:
            queue.migrate()
        finally:
            queue.close()
        with psycopg.connect(base, autocommit=True) as conn:
            shape = _shape(conn, schema)
    try:
        yield with_search_path(base, schema) + f"&application_name={schema}"
    finally:
        _empty_or_drop(base, schema, shape)


@pytest.fixture
def pg_mode_migrated_dsn(pg_migrated_dsn: str) -> Iterator[str]:
    """:func:`pg_migrated_dsn` (a migrated schema emptied after an earlier test of this process),
    reached as ``LEASEQ_TEST_PG_MODE`` says: the ``q`` fixture's in every mode. The portable mode
    has the same schema as the direct one, reached with ``&portable=true``; through PgBouncer, a
    PgBouncer of this test's own in front of it, stopped before the schema is emptied, so no
    server connection, and nothing left on one, outlives the test (starting one costs a few
    milliseconds, a migration about half a second)."""
    if not POOLED:
        yield pg_migrated_dsn + ("&portable=true" if PORTABLE else "")
        return
    from pgbouncer import SchemaBouncer
    from system_tools import require_tool

    schema = _option(pg_migrated_dsn, "application_name")
    bouncer = SchemaBouncer(require_tool("pgbouncer"), _pg_or_skip(), schema)
    try:
        # the application_name reaches the server connections: the teardown's wait for the
        # test's connections to close finds them until the PgBouncer is gone
        yield bouncer.dsn() + f"?pooler=transaction&application_name={schema}" + ("&portable=true" if PORTABLE else "")
    finally:
        bouncer.stop()


def _option(dsn: str, name: str) -> str:
    """The value of query option ``name`` of ``dsn``."""
    from urllib.parse import parse_qs

    return parse_qs(urlsplit(dsn).query)[name][0]


#: How long the teardown waits for a test's last connections to its schema to close before it
#: drops the schema instead of emptying it: a service the test stopped closes its pool and its
#: listener a moment after the test (uvicorn winds down in ticks of 0.1 s), and a migration
#: for the next test costs several times that wait.
CLOSING_SECONDS = 2.0


def _connections_closed(conn: object, schema: str) -> bool:
    """Whether every connection to ``schema`` (named by its ``application_name``) has closed,
    waiting up to :data:`CLOSING_SECONDS` for those still closing."""
    deadline = time.monotonic() + CLOSING_SECONDS
    while True:
        busy = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",  # type: ignore[attr-defined]
                            (schema,)).fetchone()
        if not (busy and busy[0]):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def _empty_or_drop(base: str, schema: str, shape: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        if not _connections_closed(conn, schema) or _shape(conn, schema) != shape:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            return
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename <> 'leaseq_migrations'",
            (schema,)).fetchall()]
        sequences = [r[0] for r in conn.execute(
            "SELECT sequencename FROM pg_sequences WHERE schemaname = %s", (schema,)).fetchall()]
        with conn.transaction():
            # neither the triggers (the lease columns' guard) nor the foreign keys: every row goes
            conn.execute("SET LOCAL session_replication_role = replica")
            for table in tables:
                conn.execute(f"DELETE FROM {schema}.{table}")
            for sequence in sequences:
                conn.execute(f"ALTER SEQUENCE {schema}.{sequence} RESTART")
    _EMPTIED.append((schema, shape))


def _drop_emptied() -> None:
    if not _EMPTIED or not PG_DSN:
        return
    import psycopg

    try:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            for schema, _ in _EMPTIED:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    except psycopg.Error:  # the worker's database is dropped with it
        pass
    _EMPTIED.clear()


@pytest.fixture
def pgbouncer(pg_schema_dsn: str) -> Iterator[object]:
    """A PgBouncer of this test's own in transaction mode, in front of a fresh schema
    (its ``dsn()`` names no leaseq option: the test adds ``?pooler=transaction``)."""
    from pgbouncer import SchemaBouncer
    from system_tools import require_tool

    binary = require_tool("pgbouncer")
    schema = _schema_of(pg_schema_dsn)
    bouncer = SchemaBouncer(binary, _pg_or_skip(), schema, pool_size=2)
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture
def pg_direct_schema_dsn(pg_schema_dsn: str) -> str:
    """A DSN reaching :func:`pg_schema_dsn`'s schema directly, in every mode (no PgBouncer, no
    leaseq option): for what a pooler cannot carry (LISTEN, a session's advisory lock)."""
    return with_search_path(_pg_or_skip(), _schema_of(pg_schema_dsn))


def _schema_of(dsn: str) -> str:
    from pg_modes import own_connection

    with own_connection(dsn) as conn:
        row = conn.execute("SELECT current_schema()").fetchone()
    assert row is not None and row[0], f"no schema behind {dsn}"
    return str(row[0])


@pytest.fixture(params=BACKENDS)
def dsn(request: pytest.FixtureRequest, tmp_path) -> str:
    """A DSN for an empty database: a SQLite file, or a PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'leaseq.db'}"
    if "q" in request.fixturenames:  # migrated anyway: one emptied after an earlier test
        return request.getfixturevalue("pg_mode_migrated_dsn")
    return request.getfixturevalue("pg_schema_dsn")


@pytest.fixture(scope="session")
def sqlite_migrated_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database every migration has run on, made once per test process and copied by
    the ``q`` fixture: migrating a new SQLite file costs about 35 ms of CPU, a copy about 1 ms (the
    same reuse as :func:`pg_migrated_dsn` on PostgreSQL). Only the migrations' own timestamps
    differ from a file migrated by the test itself."""
    path = tmp_path_factory.mktemp("sqlite-migrated") / "leaseq.db"
    queue = leaseq.connect(f"sqlite:///{path}")
    try:
        queue.migrate()
    finally:
        queue.close()
    leftovers = [p.name for p in path.parent.iterdir() if p != path]
    assert leftovers == [], f"the closed database left {leftovers}: a copy of the file alone would miss them"
    return path


@pytest.fixture
def q(dsn: str, request: pytest.FixtureRequest) -> Iterator[leaseq.Queue]:
    """A migrated queue on each backend. When the test passes, every task's evidence trail is
    replayed against the model of the lease protocol (see :func:`check_trails`)."""
    if dsn.startswith("sqlite:///") and "?" not in dsn and not Path(dsn[len("sqlite:///"):]).exists():
        shutil.copyfile(request.getfixturevalue("sqlite_migrated_file"), dsn[len("sqlite:///"):])
    queue = leaseq.connect(dsn)
    queue.migrate()
    try:
        yield queue
        check_trails(queue, request)
    finally:
        queue.close()


def check_trails(queue: leaseq.Queue, request: pytest.FixtureRequest) -> None:
    """Fail the test if a task's evidence trail holds an event the model of the lease protocol
    does not allow (leaseq_chaos.traces). A test that writes rows by hand, making a history no
    transaction of leaseq could make, opts out with ``@pytest.mark.trails_unchecked("why")``."""
    if request.node.get_closest_marker("trails_unchecked") is not None:
        return
    report = getattr(request.node, "rep_call", None)
    if report is None or not report.passed:
        return  # the test's own failure says more
    from leaseq_chaos.traces import describe, validate_queue

    found = validate_queue(queue)
    if found:
        pytest.fail("evidence trails the lease model does not allow:\n"
                    + "\n".join(describe(v) for v in found[:10]), pytrace=False)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Each phase's report kept on the test item (``rep_setup``, ``rep_call``), for fixtures to read."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


#: A test running longer than this (seconds) is taken for hung: its process prints every
#: thread's stack and every running event loop's tasks, then exits, so a hang fails the run
#: at once with what it waited on, rather than running out CI's time with nothing to read.
HANG_SECONDS = float(os.environ.get("LEASEQ_TEST_HANG_SECONDS",
                                    "3600" if os.environ.get("LEASEQ_CHAOS_LONG") else "600"))


@pytest.fixture(autouse=True)
def _hang_watchdog(request: pytest.FixtureRequest) -> Iterator[None]:
    finished = threading.Event()

    def watch() -> None:
        if finished.wait(HANG_SECONDS):
            return
        capture = request.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=False)
        out = sys.__stderr__
        print(f"\n!!! {request.node.nodeid} still running after {HANG_SECONDS:.0f}s: taken for hung", file=out)
        faulthandler.dump_traceback(file=out, all_threads=True)
        for loop in [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()]:
            for task in asyncio.all_tasks(loop):
                print(f"--- {task.get_name()}, awaiting:", file=out)
                awaited: object = task.get_coro()
                while awaited is not None:  # the whole chain of awaits, innermost last
                    frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
                    if frame is None:
                        print(f"    {awaited!r}", file=out)
                        break
                    print(f"    {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}", file=out)
                    awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        out.flush()
        os._exit(3)

    threading.Thread(target=watch, name="test-hang-watchdog", daemon=True).start()
    yield
    finished.set()
