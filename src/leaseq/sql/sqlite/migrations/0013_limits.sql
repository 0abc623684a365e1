-- leaseq schema, version 13, SQLite: limits shared by every worker.
-- Same contract as the PostgreSQL migration (see it for the columns); limits
-- is a JSON array of keys, times are REAL Unix seconds.

ALTER TABLE leaseq_tasks ADD COLUMN limits TEXT;
ALTER TABLE leaseq_tasks ADD COLUMN units INTEGER NOT NULL DEFAULT 1 CHECK (units > 0);

CREATE TABLE leaseq_limits (
    key         TEXT PRIMARY KEY,
    max_running INTEGER CHECK (max_running > 0),
    per_second  REAL CHECK (per_second > 0),
    burst       REAL CHECK (burst >= 1),
    counts      TEXT NOT NULL DEFAULT 'tasks' CHECK (counts IN ('tasks', 'units')),
    running     INTEGER NOT NULL DEFAULT 0,
    tokens      REAL NOT NULL DEFAULT 0,
    refilled_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    changed_at  REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    changed_by  TEXT,
    CHECK ((per_second IS NULL) = (burst IS NULL))
);
