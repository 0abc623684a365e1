-- leaseq schema, version 17, SQLite: the same columns and table as
-- PostgreSQL's (see its 0017 for what they mean). Times are epoch seconds.

ALTER TABLE leaseq_workers ADD COLUMN last_heartbeat_at REAL;
ALTER TABLE leaseq_workers ADD COLUMN heartbeat_seconds REAL CHECK (heartbeat_seconds > 0);
ALTER TABLE leaseq_workers ADD COLUMN lease_seconds REAL CHECK (lease_seconds > 0);
ALTER TABLE leaseq_workers ADD COLUMN stopped_at REAL;
ALTER TABLE leaseq_workers ADD COLUMN stop_reason TEXT;

CREATE TABLE leaseq_worker_kinds (
    worker_id TEXT NOT NULL REFERENCES leaseq_workers (id) ON DELETE CASCADE,
    kind      TEXT NOT NULL,
    queue     TEXT NOT NULL,
    effect    TEXT NOT NULL CHECK (effect IN ('read_only', 'idempotent', 'side_effect')),
    actions   TEXT,
    signature TEXT,
    PRIMARY KEY (worker_id, kind)
);
CREATE INDEX leaseq_worker_kinds_kind ON leaseq_worker_kinds (kind);
