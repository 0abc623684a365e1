-- leaseq schema, version 26, SQLite: durable waits (see the PostgreSQL file).

ALTER TABLE leaseq_tasks ADD COLUMN wake_at REAL;
ALTER TABLE leaseq_tasks ADD COLUMN wait_signal TEXT;
CREATE INDEX leaseq_tasks_wake ON leaseq_tasks (wake_at) WHERE status = 'waiting' AND wake_at IS NOT NULL;

CREATE TABLE leaseq_signals (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id             INTEGER NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    name                TEXT NOT NULL,
    payload             TEXT,
    sent_by             TEXT NOT NULL,
    sent_at             REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    consumed_generation INTEGER,
    consumed_at         REAL,
    consumed_key        TEXT
);
CREATE INDEX leaseq_signals_pending ON leaseq_signals (task_id, name, id) WHERE consumed_at IS NULL;
