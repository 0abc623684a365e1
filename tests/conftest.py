"""Shared fixtures: one real database per test, on every backend.

PostgreSQL tests need ``LEASEQ_TEST_PG_DSN`` (for example
``postgresql://postgres@127.0.0.1:5432/test``); without it they skip, unless
``LEASEQ_REQUIRE_PG=1`` is set (CI sets it), in which case they fail.
Each PostgreSQL test gets a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest

import leaseq

PG_DSN = os.environ.get("LEASEQ_TEST_PG_DSN")
REQUIRE_PG = os.environ.get("LEASEQ_REQUIRE_PG") == "1"
BACKENDS = ["sqlite", "postgres"]


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
    """A DSN for a fresh, empty PostgreSQL schema (dropped after the test)."""
    import psycopg

    base = _pg_or_skip()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_search_path(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(params=BACKENDS)
def dsn(request: pytest.FixtureRequest, tmp_path) -> str:
    """A DSN for an empty database: a SQLite file, or a PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'leaseq.db'}"
    return request.getfixturevalue("pg_schema_dsn")


@pytest.fixture
def q(dsn: str) -> Iterator[leaseq.Queue]:
    """A migrated queue on each backend."""
    queue = leaseq.connect(dsn)
    queue.migrate()
    try:
        yield queue
    finally:
        queue.close()
