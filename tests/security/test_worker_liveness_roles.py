"""A worker role writes only its own worker's liveness and declarations.

Each statement is sent as raw SQL by a worker role (what an attacker holding
that role's credentials can do), naming a worker another role registered:
the definer functions refuse it and nothing changes.
"""

from __future__ import annotations

import json

import psycopg
import pytest

import leaseq

from .test_database_roles import admin, make_role, refused, snapshot  # noqa: F401 - fixtures

DECLARED = json.dumps([{"kind": "payroll.run", "queue": "default", "effect": "read_only", "actions": None,
                        "signature": None}])


@pytest.mark.parametrize("statement, params", [
    ("SELECT * FROM leaseq_q_worker_heartbeat(%s)", ()),
    ("SELECT * FROM leaseq_q_worker_stopped(%s, 'hijacked')", ()),
    ("SELECT * FROM leaseq_q_declare_worker_kinds(%s, %s::jsonb)", (DECLARED,)),
    ("UPDATE leaseq_workers SET stopped_at = now() WHERE id = %s", ()),
    ("INSERT INTO leaseq_worker_kinds (worker_id, kind, queue, effect) VALUES (%s, 'x', 'default', 'read_only')", ()),
])
def test_a_worker_role_cannot_touch_another_roles_worker(admin, make_role, statement, params) -> None:
    mine, theirs = make_role("worker"), make_role("worker")
    with leaseq.connect(theirs) as q:
        other = q.register_worker("other", heartbeat_seconds=1.0, lease_seconds=3.0)
    before = snapshot(admin)
    error = refused(mine, statement, (other.id, *params))
    assert "not registered by role" in error or "permission denied" in error, error
    assert snapshot(admin) == before
    with psycopg.connect(admin.store.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM leaseq_worker_kinds").fetchone()[0] == 0


def test_a_worker_role_records_its_own_liveness_and_kinds(admin, make_role) -> None:
    with leaseq.connect(make_role("worker")) as q:
        w = q.register_worker("mine", kinds=json.loads(DECLARED), heartbeat_seconds=1.0, lease_seconds=3.0)
        q.heartbeat_worker(w)
        assert q.kind_declaration("payroll.run")["worker_id"] == w.id
        q.stop_worker(w, "done")
    [seen] = admin.workers()
    assert (seen.state, seen.stop_reason, seen.kinds) == ("stopped", "done", ["payroll.run"])
