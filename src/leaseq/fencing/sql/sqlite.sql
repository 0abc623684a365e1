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

-- name: create_tokens_table
CREATE TABLE IF NOT EXISTS leaseq_fence_tokens (
    resource_key TEXT PRIMARY KEY,
    newest_token INTEGER NOT NULL CHECK (newest_token >= 0),
    accepted_at  REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

-- name: create_outcomes_table
CREATE TABLE IF NOT EXISTS leaseq_fence_outcomes (
    idempotency_key TEXT PRIMARY KEY,
    resource_key    TEXT NOT NULL,
    fencing_token   INTEGER,
    outcome         TEXT NOT NULL,
    recorded_at     REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

-- name: lock_fence
SELECT newest_token FROM leaseq_fence_tokens
WHERE resource_key = :resource_key;

-- name: create_fence
INSERT INTO leaseq_fence_tokens (resource_key, newest_token)
VALUES (:resource_key, :token)
ON CONFLICT (resource_key) DO NOTHING
RETURNING newest_token;

-- name: advance_fence
UPDATE leaseq_fence_tokens
SET newest_token = :token, accepted_at = (julianday('now') - 2440587.5) * 86400.0
WHERE resource_key = :resource_key AND newest_token < :token;

-- name: newest_token
SELECT resource_key, newest_token, accepted_at FROM leaseq_fence_tokens
WHERE resource_key = :resource_key;

-- name: reserve_key
INSERT INTO leaseq_fence_outcomes (idempotency_key, resource_key, fencing_token, outcome)
VALUES (:idempotency_key, :resource_key, :token, 'null')
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: record_outcome
UPDATE leaseq_fence_outcomes
SET outcome = :outcome, recorded_at = (julianday('now') - 2440587.5) * 86400.0
WHERE idempotency_key = :idempotency_key;

-- name: get_outcome
SELECT idempotency_key, resource_key, fencing_token, outcome, recorded_at
FROM leaseq_fence_outcomes
WHERE idempotency_key = :idempotency_key;
