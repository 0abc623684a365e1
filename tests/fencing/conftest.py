"""Fixtures for the fencing kit: a migrated FencedStore on each backend."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import leaseq
from leaseq import roles
from leaseq.fencing import FencedStore


@pytest.fixture(params=["sqlite", "postgres"])
def fence_dsn(request: pytest.FixtureRequest, tmp_path) -> str:
    """A DSN for an empty database: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fence.db'}"
    return request.getfixturevalue("pg_schema_dsn")


@pytest.fixture
def store(fence_dsn: str) -> Iterator[FencedStore]:
    """A migrated store with a ``ledger`` table standing in for the service's own data."""
    fenced = FencedStore(fence_dsn)
    fenced.migrate()
    with fenced.transaction() as conn:
        conn.execute("CREATE TABLE ledger (account TEXT NOT NULL, amount INTEGER NOT NULL, note TEXT)")
    try:
        yield fenced
    finally:
        fenced.close()


def marker(store: FencedStore) -> str:
    """The parameter placeholder of the store's driver."""
    return "%s" if store.dialect == "postgres" else "?"


def add_entry(conn, store: FencedStore, account: str, amount: int, note: str = "") -> None:
    """Insert a ledger row through ``conn`` (the fence's connection)."""
    p = marker(store)
    conn.execute(f"INSERT INTO ledger (account, amount, note) VALUES ({p}, {p}, {p})", (account, amount, note))


def ledger(store: FencedStore) -> list[tuple]:
    """Every ledger row, in insertion order."""
    with store.transaction() as conn:
        return [tuple(r) for r in conn.execute("SELECT account, amount, note FROM ledger").fetchall()]


@pytest.fixture
def made_roles(q: leaseq.Queue) -> Iterator[list[str]]:
    """Names of roles made by a test, dropped afterwards."""
    made: list[str] = []
    yield made
    if made:
        from pg_modes import own_connection

        with own_connection(q.store.dsn, autocommit=True) as conn:
            for name in made:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
                conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def make_role(q: leaseq.Queue, made: list[str], kind: str) -> str:
    """A new PostgreSQL role of ``kind`` (``leaseq roles create``), dropped after the test; its DSN."""
    name = f"lq_{kind}_{uuid.uuid4().hex[:8]}"
    dsn = roles.create_role(q, kind, name)
    made.append(name)
    return dsn


@pytest.fixture
def verifier_dsn(q: leaseq.Queue, made_roles: list[str]) -> str:
    """What a downstream is given: a verifier role's DSN on PostgreSQL, the queue's file on SQLite."""
    if q.dialect == "sqlite":
        return q.store.dsn
    return make_role(q, made_roles, "verifier")
