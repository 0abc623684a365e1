"""Helpers for the service tests: table snapshots and waiting on the database clock."""

from __future__ import annotations

import sqlite3
import time
from datetime import datetime
from typing import Any

import leaseq
from leaseq.store import parse_dsn

from snapshots import snapshot  # noqa: E402,F401  (shared with the other folders)


def wait_until(q: leaseq.Queue, moment: datetime, *, timeout: float = 5.0) -> None:
    """Return once the database clock has passed ``moment`` (leases are judged by it)."""
    deadline = time.monotonic() + timeout
    while q.now() <= moment:
        if time.monotonic() > deadline:
            raise AssertionError(f"database clock did not pass {moment} within {timeout}s")
        time.sleep(0.02)


def error_of(resp: Any) -> dict[str, Any]:
    """The ``error`` object of a JSON error response (asserting it is one)."""
    body = resp.json()
    assert set(body) == {"error"}, body
    assert {"code", "message"} <= set(body["error"]), body
    return body["error"]


def age_tasks(dsn: str, task_ids: list[int], seconds: float) -> None:
    """Move tasks' ``updated_at`` back by ``seconds`` (a test's own write, to make them old)."""
    dialect, target = parse_dsn(dsn)
    if dialect == "sqlite":
        conn = sqlite3.connect(target)
        try:
            with conn:
                conn.executemany("UPDATE leaseq_tasks SET updated_at = updated_at - ? WHERE id = ?",
                                 [(seconds, i) for i in task_ids])
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(target) as conn:
        conn.execute("UPDATE leaseq_tasks SET updated_at = updated_at - %s * interval '1 second' "
                     "WHERE id = ANY(%s)", (seconds, task_ids))
