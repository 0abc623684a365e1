-- leaseq schema, version 22, SQLite: the same columns, index and table as
-- PostgreSQL's (see its 0022 for what they mean). Times are epoch seconds.

ALTER TABLE leaseq_tasks ADD COLUMN scrubbed_at REAL;

DROP INDEX leaseq_tasks_finished;
CREATE INDEX leaseq_tasks_ended ON leaseq_tasks (updated_at)
    WHERE status IN ('completed', 'cancelled', 'dead', 'denied', 'expired');

CREATE TABLE leaseq_evidence (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id     INTEGER NOT NULL,
    queue       TEXT NOT NULL,
    kind        TEXT NOT NULL,
    task_status TEXT NOT NULL,
    ended_at    REAL NOT NULL,
    event_id    INTEGER,
    type        TEXT NOT NULL,
    generation  INTEGER,
    worker_id   TEXT,
    at          REAL NOT NULL,
    detail      TEXT NOT NULL DEFAULT '{}',
    kept_at     REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);
CREATE INDEX leaseq_evidence_ended ON leaseq_evidence (ended_at);
CREATE INDEX leaseq_evidence_task ON leaseq_evidence (task_id, id);

-- The audit entries of a task are found by their target when its user data is cleared.
CREATE INDEX leaseq_audit_target ON leaseq_audit (target);
