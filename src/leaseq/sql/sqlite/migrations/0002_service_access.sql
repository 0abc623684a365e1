-- leaseq schema, version 2, SQLite: credentials and audit for the queue service.
-- Same contract as the PostgreSQL migration; times are REAL Unix seconds.

CREATE TABLE leaseq_tokens (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('worker', 'viewer', 'operator', 'admin')),
    secret_hash   TEXT NOT NULL,
    queues        TEXT,
    read_payloads INTEGER NOT NULL DEFAULT 0,
    created_at    REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    created_by    TEXT,
    expires_at    REAL,
    revoked_at    REAL,
    revoked_by    TEXT,
    last_used_at  REAL
);

ALTER TABLE leaseq_workers ADD COLUMN token_id TEXT;
CREATE INDEX leaseq_workers_token ON leaseq_workers (token_id) WHERE token_id IS NOT NULL;

CREATE TABLE leaseq_audit (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    at     REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    actor  TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX leaseq_audit_at ON leaseq_audit (at);
CREATE INDEX leaseq_tasks_finished ON leaseq_tasks (updated_at) WHERE status IN ('completed', 'cancelled');
