-- leaseq schema, version 8, SQLite: budgets of a task's time, and the count
-- of its retries on request (see the PostgreSQL file for each column).
-- Times are REAL Unix seconds, as everywhere in this schema.

ALTER TABLE leaseq_tasks ADD COLUMN timeout_seconds REAL CHECK (timeout_seconds IS NULL OR timeout_seconds > 0);
ALTER TABLE leaseq_tasks ADD COLUMN deadline_at REAL;
ALTER TABLE leaseq_tasks ADD COLUMN snoozes INTEGER NOT NULL DEFAULT 0;

CREATE INDEX leaseq_tasks_deadline ON leaseq_tasks (deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('queued', 'waiting', 'awaiting_approval');
