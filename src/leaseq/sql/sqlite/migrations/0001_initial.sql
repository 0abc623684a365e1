-- leaseq schema, version 1, SQLite.
-- Times are REAL seconds since the Unix epoch, read from SQLite's own clock
-- (julianday('now')); JSON columns hold text. Otherwise the same contract
-- as the PostgreSQL schema.

CREATE TABLE leaseq_workers (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    registered_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    revoked_at    REAL
);

CREATE TABLE leaseq_queues (
    name       TEXT PRIMARY KEY,
    paused     INTEGER NOT NULL DEFAULT 0,
    changed_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    changed_by TEXT
);

CREATE TABLE leaseq_tasks (
    id                    INTEGER PRIMARY KEY AUTOINCREMENT,
    queue                 TEXT NOT NULL,
    kind                  TEXT NOT NULL,
    payload               TEXT NOT NULL DEFAULT 'null',
    effect                TEXT NOT NULL CHECK (effect IN ('read_only', 'idempotent', 'side_effect')),
    status                TEXT NOT NULL DEFAULT 'queued' CHECK (status IN
                          ('queued', 'running', 'completed', 'cancelled', 'dead', 'needs_reconciliation', 'blocked')),
    priority              INTEGER NOT NULL DEFAULT 0,
    available_at          REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    created_at            REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    updated_at            REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    lease_owner           TEXT,
    lease_expires_at      REAL,
    lease_seconds         REAL NOT NULL CHECK (lease_seconds > 0),
    claim_generation      INTEGER NOT NULL DEFAULT 0,
    claimed_at            REAL,
    heartbeat_count       INTEGER NOT NULL DEFAULT 0,
    last_heartbeat_at     REAL,
    longest_heartbeat_gap REAL NOT NULL DEFAULT 0,
    idempotency_key       TEXT NOT NULL,
    attempts              INTEGER NOT NULL DEFAULT 0,
    max_attempts          INTEGER NOT NULL CHECK (max_attempts > 0),
    open_effects          INTEGER NOT NULL DEFAULT 0,
    error_fingerprint     TEXT,
    error_streak          INTEGER NOT NULL DEFAULT 0,
    last_error            TEXT,
    result                TEXT,
    UNIQUE (queue, idempotency_key),
    CHECK ((status = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL))
);

CREATE INDEX leaseq_tasks_claimable ON leaseq_tasks (queue, priority DESC, available_at, id)
    WHERE status = 'queued';
CREATE INDEX leaseq_tasks_leases ON leaseq_tasks (lease_expires_at) WHERE status = 'running';
CREATE INDEX leaseq_tasks_owner ON leaseq_tasks (lease_owner) WHERE status = 'running';
CREATE INDEX leaseq_tasks_status ON leaseq_tasks (status, queue);

CREATE TABLE leaseq_effects (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id         INTEGER NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    generation      INTEGER NOT NULL,
    worker_id       TEXT,
    action          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'reconciled')),
    intent_at       REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    response        TEXT,
    response_at     REAL,
    UNIQUE (task_id, idempotency_key)
);

CREATE TABLE leaseq_events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id    INTEGER NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    type       TEXT NOT NULL,
    generation INTEGER,
    worker_id  TEXT,
    at         REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    detail     TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX leaseq_events_task ON leaseq_events (task_id, id);
