"""Helpers for the service tests: table snapshots and waiting on the database clock."""

from __future__ import annotations

import sqlite3
import time
from datetime import datetime
from typing import Any

import leaseq
from leaseq.store import parse_dsn

from pg_modes import own_connection
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
    with own_connection(target) as conn:
        conn.execute("UPDATE leaseq_tasks SET updated_at = updated_at - %s * interval '1 second' "
                     "WHERE id = ANY(%s)", (seconds, task_ids))


def dashboard_login(url: str, token: str) -> Any:
    """An ``httpx.Client`` logged in to the dashboard through its form (GET /login, then POST)."""
    import re

    import httpx

    client = httpx.Client(base_url=url, timeout=10, headers={"Origin": url})  # as a browser posts a form
    form = client.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    resp = client.post("/login", data={"token": token, "csrf": csrf})
    assert resp.status_code == 303 and resp.headers["location"] == "/", (resp.status_code, resp.text[:300])
    return client


def page_csrf(client: Any, path: str = "/") -> str:
    """The session-bound CSRF token of a dashboard page's forms."""
    import re

    return re.search(r'name="csrf" value="([0-9a-f]{64})"', client.get(path).text).group(1)


def settle_by_tenant(q: leaseq.Queue, limit_key: str, spend: dict[str, int]) -> None:
    """Settle ``spend[tenant]`` units of ``limit_key`` today under each tenant: a task with that
    fairness key (``""``: none) consumes them (``ctx.consume``'s call) and completes."""
    w = q.register_worker("spender")
    for tenant in spend:
        q.enqueue("spend", {"tenant": tenant}, queue="spend", fairness_key=tenant or None)
    left = dict(spend)
    while left:
        claims = q.claim(w, queue="spend", limit=100)
        assert claims, f"no task left to claim for {sorted(left)[:5]}"
        for c in claims:
            q.consume(w, c, f"spend:{c.task_id}:consume:0", limit_key, left.pop(c.task.payload["tenant"]))
            q.complete(w, c)


def move_spend_back(dsn: str, days: int) -> None:
    """Move every settled spend row ``days`` days into the past (a test's own write)."""
    dialect, target = parse_dsn(dsn)
    if dialect == "sqlite":
        conn = sqlite3.connect(target)
        try:
            with conn:
                conn.execute(f"UPDATE leaseq_limit_spend SET day = date(day, '-{int(days)} days')")
        finally:
            conn.close()
        return
    with own_connection(target) as conn:
        conn.execute("SET ROLE leaseq_owner")
        conn.execute("UPDATE leaseq_limit_spend SET day = day - %s", (days,))
