"""Deep queues and long histories for the depth workload, written in bulk SQL.

Enqueueing 10^6 tasks through any client would take minutes and measure
nothing we care about here, so these rows are generated server-side with
the shape leaseq itself writes: queued tasks (a task row is its own
``enqueued`` entry), and finished tasks with their ``claimed`` and
``completed`` events. The rows land in leaseq's own tables (migrated by leaseq first).
Afterwards the tables are vacuumed and analysed, as autovacuum would have
done on a queue that grew to this size over time.
"""

from __future__ import annotations

import psycopg

HISTORY_TASKS = """
INSERT INTO leaseq_tasks (queue, kind, payload, effect, status, idempotency_key, max_attempts, lease_seconds,
                          claim_generation, attempts, claimed_at, result, created_at, available_at, updated_at)
SELECT 'default', 'noop', jsonb_build_object('i', g), 'read_only', 'completed', 'h' || g, 5, 30,
       1, 1, now() - interval '1 hour', 'null', now() - interval '1 hour', now() - interval '1 hour', now()
FROM generate_series(1, %(n)s) AS g
"""

HISTORY_EVENTS = """
INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
SELECT t.id, e.type, e.generation, e.worker_id, e.detail
FROM leaseq_tasks t
CROSS JOIN LATERAL (VALUES
    ('claimed', 1, 'history-worker', jsonb_build_object('attempt', 1, 'lease_seconds', 30,
                                                       'lease_expires_at', t.claimed_at + interval '30 seconds')),
    ('completed', 1, 'history-worker', jsonb_build_object('attempt', 1, 'heartbeats', 0, 'last_heartbeat_at', NULL,
                                                         'longest_heartbeat_gap', 0))
) AS e(type, generation, worker_id, detail)
WHERE t.status = 'completed'
"""

QUEUED_TASKS = """
INSERT INTO leaseq_tasks (queue, kind, payload, effect, idempotency_key, max_attempts, lease_seconds)
SELECT 'default', 'noop', jsonb_build_object('i', g), 'read_only', 'q' || g, 5, 30
FROM generate_series(1, %(n)s) AS g
"""


def fill_leaseq(dsn: str, *, queued: int, finished: int = 0) -> None:
    """Add ``finished`` completed tasks (older) and ``queued`` due tasks to a migrated leaseq schema."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if finished:
            with conn.transaction():
                conn.execute(HISTORY_TASKS, {"n": finished})
                conn.execute(HISTORY_EVENTS)
        with conn.transaction():
            conn.execute(QUEUED_TASKS, {"n": queued})
        conn.execute("VACUUM (ANALYZE) leaseq_tasks")
        conn.execute("VACUUM (ANALYZE) leaseq_events")
