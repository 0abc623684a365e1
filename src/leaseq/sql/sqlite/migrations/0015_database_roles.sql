-- leaseq schema, version 15, SQLite: the same columns as PostgreSQL's. On
-- SQLite, whoever can open the file has full authority: there are no
-- database roles, so db_role stays empty and leaseq_db_roles unused (kept so
-- both backends hold the same tables).

ALTER TABLE leaseq_workers ADD COLUMN db_role TEXT;

CREATE TABLE leaseq_db_roles (
    role       TEXT PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('worker', 'operator', 'viewer')),
    queues     TEXT,
    created_by TEXT NOT NULL,
    created_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    revoked_at REAL
);
