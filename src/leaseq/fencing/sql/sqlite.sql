-- leaseq.fencing named queries, SQLite (sqlite3, :name parameters).
--
-- Same names and parameters as postgres.sql; see its header for the order
-- FencedStore.apply runs them in. Every apply runs inside BEGIN IMMEDIATE,
-- which takes the database's single write lock before the first read, so
-- the fence check, the caller's write and the records cannot interleave
-- with another writer: no row locks are needed.
-- Times are REAL Unix seconds from SQLite's own clock.

-- name: schema_lock
SELECT 1;

-- name: schema_lock_table
-- (the portable mode's lock on PostgreSQL; SQLite's write lock serialises migrate() already)
SELECT 1;

-- name: create_attempts_table
CREATE TABLE IF NOT EXISTS leaseq_fence_attempts (
    resource_key      TEXT NOT NULL,
    task_id           INTEGER NOT NULL CHECK (task_id >= 0),
    newest_generation INTEGER NOT NULL CHECK (newest_generation >= 0),
    newest_epoch      INTEGER NOT NULL DEFAULT 0,
    accepted_at       REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    PRIMARY KEY (resource_key, task_id)
);

-- name: create_outcomes_table
CREATE TABLE IF NOT EXISTS leaseq_fence_outcomes (
    idempotency_key TEXT PRIMARY KEY,
    resource_key    TEXT NOT NULL,
    fencing_token   INTEGER,
    outcome         TEXT NOT NULL,
    recorded_at     REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    task_id         INTEGER,
    fencing_epoch   INTEGER
);

-- name: outcomes_have_task
SELECT 1 AS present FROM pragma_table_info('leaseq_fence_outcomes') WHERE name = 'task_id';

-- name: add_outcomes_task
ALTER TABLE leaseq_fence_outcomes ADD COLUMN task_id INTEGER;

-- name: lock_fence
SELECT newest_epoch, newest_generation FROM leaseq_fence_attempts
WHERE resource_key = :resource_key AND task_id = :task_id;

-- name: create_fence
INSERT INTO leaseq_fence_attempts (resource_key, task_id, newest_epoch, newest_generation)
VALUES (:resource_key, :task_id, :epoch, :generation)
ON CONFLICT (resource_key, task_id) DO NOTHING
RETURNING newest_epoch, newest_generation;

-- name: advance_fence
UPDATE leaseq_fence_attempts
SET newest_epoch = :epoch, newest_generation = :generation, accepted_at = (julianday('now') - 2440587.5) * 86400.0
WHERE resource_key = :resource_key AND task_id = :task_id 
  AND (newest_epoch, newest_generation) < (:epoch, :generation);

-- name: newest_generation
SELECT resource_key, task_id, newest_epoch, newest_generation, accepted_at FROM leaseq_fence_attempts
WHERE resource_key = :resource_key AND task_id = :task_id;

-- name: reserve_key
INSERT INTO leaseq_fence_outcomes (idempotency_key, resource_key, task_id, fencing_token, fencing_epoch,
                                   outcome)
VALUES (:idempotency_key, :resource_key, :task_id, :generation, :epoch, 'null')
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: record_outcome
UPDATE leaseq_fence_outcomes
SET outcome = :outcome, recorded_at = (julianday('now') - 2440587.5) * 86400.0
WHERE idempotency_key = :idempotency_key;

-- name: get_outcome
SELECT idempotency_key, resource_key, task_id, fencing_token, fencing_epoch, outcome, recorded_at
FROM leaseq_fence_outcomes
WHERE idempotency_key = :idempotency_key;

-- name: fences_have_epoch
SELECT 1 AS present FROM pragma_table_info('leaseq_fence_attempts') WHERE name = 'newest_epoch';

-- name: add_fence_epoch
ALTER TABLE leaseq_fence_attempts ADD COLUMN newest_epoch INTEGER NOT NULL DEFAULT 0;

-- name: outcomes_have_epoch
SELECT 1 AS present FROM pragma_table_info('leaseq_fence_outcomes') WHERE name = 'fencing_epoch';

-- name: add_outcomes_epoch
ALTER TABLE leaseq_fence_outcomes ADD COLUMN fencing_epoch INTEGER;
