"""SQLite: owner-only files, and a failing ROLLBACK that never hides the original error.

Both the queue's store and the fenced store open their files through
leaseq.db.sqlite, so each guard is tested on both.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator

import pytest

import leaseq
from leaseq.fencing import FencedStore


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The common default umask, under which sqlite3 alone creates files 0644."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_queue_database_and_its_wal_files_are_owner_only(tmp_path, umask_022):
    path = tmp_path / "queue.db"
    q = leaseq.connect(f"sqlite:///{path}")
    try:
        q.migrate()
        q.enqueue("job", {"secret": "payload"})
        for name in ("queue.db", "queue.db-wal", "queue.db-shm"):
            assert (tmp_path / name).exists(), name
            assert mode(tmp_path / name) == 0o600, f"{name}: {oct(mode(tmp_path / name))}"
    finally:
        q.close()


def test_a_new_fence_database_and_its_wal_files_are_owner_only(tmp_path, umask_022):
    path = tmp_path / "fence.db"
    store = FencedStore(f"sqlite:///{path}")
    try:
        store.migrate()
        store.apply("order:1", "1.1", lambda conn: None, idempotency_key="k1")
        for name in ("fence.db", "fence.db-wal", "fence.db-shm"):
            assert mode(tmp_path / name) == 0o600, f"{name}: {oct(mode(tmp_path / name))}"
    finally:
        store.close()


def test_an_existing_database_keeps_the_permissions_its_owner_gave_it(tmp_path, umask_022):
    path = tmp_path / "shared.db"
    sqlite3.connect(path).close()
    os.chmod(path, 0o640)
    q = leaseq.connect(f"sqlite:///{path}")
    try:
        q.migrate()
        assert mode(path) == 0o640
    finally:
        q.close()


# A trigger that ends the whole transaction (RAISE(ROLLBACK)): SQLite rolls
# back by itself, so a second, unconditional ROLLBACK fails with "cannot
# rollback - no transaction is active" and would replace the real error.
POISON_TASKS = """
CREATE TRIGGER poison BEFORE INSERT ON leaseq_tasks WHEN NEW.kind = 'poison'
BEGIN SELECT RAISE(ROLLBACK, 'poison refused by trigger'); END;
"""


def test_a_failing_rollback_does_not_hide_the_queue_error(tmp_path):
    path = tmp_path / "queue.db"
    q = leaseq.connect(f"sqlite:///{path}")
    try:
        q.migrate()
        with sqlite3.connect(path) as conn:
            conn.executescript(POISON_TASKS)
        for _ in range(3):  # and the connection stays usable after each
            with pytest.raises(sqlite3.IntegrityError, match="poison refused by trigger"):
                q.enqueue("poison", {})
            assert q.get(q.enqueue("job", {}).id).kind == "job"
    finally:
        q.close()


def test_a_failing_rollback_does_not_hide_the_fenced_write_error(tmp_path):
    store = FencedStore(f"sqlite:///{tmp_path / 'fence.db'}")
    try:
        store.migrate()
        with store.transaction() as conn:
            conn.execute("CREATE TABLE ledger (amount INTEGER NOT NULL)")
            conn.execute("CREATE TRIGGER poison BEFORE INSERT ON ledger WHEN NEW.amount < 0 "
                         "BEGIN SELECT RAISE(ROLLBACK, 'negative amount refused'); END")

        def write(amount: int):
            return lambda conn: conn.execute("INSERT INTO ledger (amount) VALUES (?)", (amount,)) and amount

        with pytest.raises(sqlite3.IntegrityError, match="negative amount refused"):
            store.apply("account:a", "1.5", write(-1), idempotency_key="k-bad")
        assert store.newest_generation("account:a", 1) is None and store.outcome("k-bad") is None
        assert store.apply("account:a", "1.5", write(7), idempotency_key="k-good") == 7
        with store.transaction() as conn:
            assert conn.execute("SELECT amount FROM ledger").fetchall() == [(7,)]
    finally:
        store.close()


def test_a_write_that_ends_the_fence_transaction_itself_is_refused(tmp_path):
    store = FencedStore(f"sqlite:///{tmp_path / 'fence.db'}")
    try:
        store.migrate()
        with pytest.raises(RuntimeError, match="COMMIT"):
            store.apply("account:a", "1.5", lambda conn: conn.execute("COMMIT"))
        assert store.apply("account:a", "1.5", lambda conn: "ok") == "ok"
    finally:
        store.close()


def test_a_database_locked_past_the_busy_timeout_is_backend_unavailable(tmp_path):
    path = tmp_path / "queue.db"
    leaseq.connect(f"sqlite:///{path}").migrate()
    q = leaseq.connect(f"sqlite:///{path}", busy_timeout=0.2)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(leaseq.BackendUnavailable, match="database is locked"):
            q.enqueue("job", {})
        holder.execute("ROLLBACK")
        q.enqueue("job", {})
    finally:
        holder.close()
        q.close()


def test_the_q_fixtures_copied_file_is_a_fresh_migration(q, dsn, tmp_path):
    """tests/conftest.py's ``q`` copies one migrated SQLite file per test process instead of
    migrating each test's file: the copy must hold what a migration of a new file holds (the
    migrations' own timestamps apart), or every SQLite test would run on another schema."""
    if not dsn.startswith("sqlite:///"):
        pytest.skip("the copy is SQLite's; PostgreSQL schemas are emptied and reused (pg_migrated_dsn)")
    fresh = tmp_path / "fresh.db"
    queue = leaseq.connect(f"sqlite:///{fresh}")
    try:
        queue.migrate()
    finally:
        queue.close()

    def contents(path: str) -> list[str]:
        conn = sqlite3.connect(path)
        try:
            conn.execute("UPDATE leaseq_migrations SET applied_at = 0")
            return list(conn.iterdump())
        finally:
            conn.rollback()
            conn.close()

    assert contents(dsn[len("sqlite:///"):]) == contents(str(fresh))
