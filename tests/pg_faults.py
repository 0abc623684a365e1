"""Dropping real PostgreSQL connections (pg_terminate_backend): only a test's own, found by a unique
application_name. Shared by tests/db and tests/fencing."""

from __future__ import annotations

import os
import uuid

import psycopg

#: The server the PostgreSQL tests use (they skip or fail without it: see conftest.py).
PG_DSN = os.environ.get("LEASEQ_TEST_PG_DSN", "")


def tagged(dsn: str) -> tuple[str, str]:
    """``dsn`` with a unique ``application_name``, and that name."""
    name = f"leaseq-test-{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in dsn else "?"
    return f"{dsn}{sep}application_name={name}", name


def backends(name: str) -> set[int]:
    """The server pids of every connection opened under application_name ``name``."""
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        return {r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)).fetchall()}


def terminate(*, name: str | None = None, pid: int | None = None) -> int:
    """``pg_terminate_backend`` every connection named ``name`` (or the one ``pid``); waits for them to end.

    Returns how many were terminated. Only this test's connections are
    touched: other tests share the server.
    """
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        if pid is not None:
            rows = conn.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,)).fetchall()
        else:
            rows = conn.execute("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                                "WHERE application_name = %s AND pid <> pg_backend_pid()", (name,)).fetchall()
    assert all(r[0] for r in rows), "a backend did not end within 10 s"
    return len(rows)
