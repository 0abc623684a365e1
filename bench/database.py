"""The benchmark's own PostgreSQL database, fresh schemas per trial, and server-side counters.

Nothing here touches the database a DSN points at beyond creating and
dropping a uniquely named database next to it (or, where that is not
allowed, a uniquely named schema in it).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` (URL form) with its ``search_path`` set to ``schema``."""
    sep = "&" if "?" in dsn else "?"
    return f"{dsn}{sep}options={quote(f'-csearch_path={schema}')}"


def _database_url(dsn: str, dbname: str) -> str:
    """The URL of database ``dbname`` on the server the URL ``dsn`` names."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise SystemExit(f"--dsn: expected a postgresql:// URL, got {dsn!r}")
    return urlunsplit(parts._replace(path=f"/{dbname}"))


@dataclass
class Counters:
    """Server-side counters of the benchmark database at one instant."""

    at: float
    transactions: int
    tuples_updated: int
    tuples_inserted: int
    backend_cpu: float  # CPU seconds used so far by the backends connected to our database


class BenchDatabase:
    """A database created for one benchmark run and dropped afterwards.

    ``schema()`` gives each trial a fresh, empty schema (dropped on exit), so
    tables, indexes and statistics never carry over between trials.
    """

    def __init__(self, server_dsn: str):
        self.server_dsn = server_dsn
        self.name = f"leaseq_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.dsn = _database_url(server_dsn, self.name)

    def drop(self) -> None:
        """Drop the database, disconnecting anything still attached."""
        with psycopg.connect(self.server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def __enter__(self) -> BenchDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()

    @contextmanager
    def schema(self, label: str) -> Iterator[str]:
        """A DSN whose search_path is a new empty schema; dropped afterwards."""
        name = f"{label.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        try:
            yield with_search_path(self.dsn, name)
        finally:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                # Workers of a failed trial may still hold locks: end them first.
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE datname = current_database() AND pid <> pg_backend_pid()")
                conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
                conn.execute(f'DROP ROLE IF EXISTS "bench_worker_{name}"')  # leaseq-roles' login role

    # -- measurements ----------------------------------------------------------

    def clock(self) -> float:
        """The database's clock, as Unix seconds."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]

    def probe(self) -> psycopg.Connection:
        """A connection for reading counters; each statement on it is one transaction of its own."""
        return psycopg.connect(self.dsn, autocommit=True)

    @staticmethod
    def counters(probe: psycopg.Connection) -> Counters:
        """Transactions and tuples from ``pg_stat_database``, client backends' CPU from ``/proc``.

        Three statements (three transactions) on ``probe``."""
        probe.execute("SELECT pg_stat_clear_snapshot()")
        xacts, upd, ins = probe.execute(
            "SELECT xact_commit + xact_rollback, tup_updated, tup_inserted FROM pg_stat_database "
            "WHERE datname = current_database()").fetchone()
        pids = [r[0] for r in probe.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'")]
        return Counters(time.monotonic(), xacts, upd, ins, sum(process_cpu(pid) for pid in pids))

    @staticmethod
    def maintenance_running(probe: psycopg.Connection) -> bool:
        """Whether autovacuum works in our database (its transactions count in pg_stat_database). One statement."""
        return probe.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                             "AND backend_type <> 'client backend'").fetchone()[0] > 0

    def backend_cpu(self) -> dict[int, float]:
        """CPU seconds so far of each backend connected to our database (not this query's own)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'")]
        return {pid: process_cpu(pid) for pid in pids}

    def wait_stats_flushed(self) -> None:
        """PostgreSQL 15 publishes a backend's counters at most once a second."""
        time.sleep(1.1)


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (0 if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_facts(dsn: str) -> dict[str, str]:
    """PostgreSQL version and the settings that shape these numbers."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        facts = {"postgresql": conn.execute("SHOW server_version").fetchone()[0]}
        for name in ("synchronous_commit", "fsync", "shared_buffers", "max_connections", "shared_preload_libraries"):
            facts[name] = conn.execute(f"SHOW {name}").fetchone()[0]
    return facts


def display_dsn(dsn: str) -> str:
    """The DSN for reports: any password replaced."""
    parts = urlsplit(dsn)
    if parts.password:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    return urlunsplit(parts)
