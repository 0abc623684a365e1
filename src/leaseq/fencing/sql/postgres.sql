-- leaseq.fencing named queries, PostgreSQL (psycopg 3, %(name)s parameters).
--
-- Two tables, both prefixed leaseq_fence_ and independent of leaseq's queue
-- tables, so a downstream service can hold them in its own database:
--
--   leaseq_fence_tokens    the newest fencing token accepted per resource key
--   leaseq_fence_outcomes  the stored outcome of each idempotency key
--
-- FencedStore.apply runs, in one transaction:
--   lock_fence (or create_fence for a new key)   row lock held to commit
--   advance_fence                                 when the token is newer
--   reserve_key, else get_outcome                 when an idempotency key is given
--   ... the caller's write, on the same connection ...
--   record_outcome
-- The fence row lock serialises every apply on one resource key; the
-- reserved outcome row (uncommitted until the end) makes a concurrent apply
-- of the same idempotency key wait, then see the committed outcome.

-- name: schema_lock
-- Serialises concurrent migrate() runs (CREATE TABLE IF NOT EXISTS alone can
-- race on the catalogue) until the transaction ends.
SELECT pg_advisory_xact_lock(7431002301);

-- name: create_tokens_table
CREATE TABLE IF NOT EXISTS leaseq_fence_tokens (
    resource_key text PRIMARY KEY,
    newest_token bigint NOT NULL CHECK (newest_token >= 0),
    accepted_at  timestamptz NOT NULL DEFAULT now()
);

-- name: create_outcomes_table
CREATE TABLE IF NOT EXISTS leaseq_fence_outcomes (
    idempotency_key text PRIMARY KEY,
    resource_key    text NOT NULL,
    fencing_token   bigint,
    outcome         jsonb NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now()
);

-- name: lock_fence
-- FOR UPDATE: held until commit, so no other apply on this key can check or
-- advance the fence between our check and our write.
SELECT newest_token FROM leaseq_fence_tokens
WHERE resource_key = %(resource_key)s
FOR UPDATE;

-- name: create_fence
-- First token ever seen for a key. On a race with another first writer this
-- waits for it; if it committed, nothing is inserted and the caller locks
-- the row it created instead.
INSERT INTO leaseq_fence_tokens (resource_key, newest_token)
VALUES (%(resource_key)s, %(token)s)
ON CONFLICT (resource_key) DO NOTHING
RETURNING newest_token;

-- name: advance_fence
UPDATE leaseq_fence_tokens SET newest_token = %(token)s, accepted_at = now()
WHERE resource_key = %(resource_key)s AND newest_token < %(token)s;

-- name: newest_token
SELECT resource_key, newest_token, accepted_at FROM leaseq_fence_tokens
WHERE resource_key = %(resource_key)s;

-- name: reserve_key
-- Claims the idempotency key for this transaction. A concurrent apply with
-- the same key blocks here until we commit (then inserts nothing and reads
-- our outcome) or roll back (then reserves it itself).
INSERT INTO leaseq_fence_outcomes (idempotency_key, resource_key, fencing_token, outcome)
VALUES (%(idempotency_key)s, %(resource_key)s, %(token)s, 'null')
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: record_outcome
UPDATE leaseq_fence_outcomes SET outcome = CAST(%(outcome)s AS jsonb), recorded_at = now()
WHERE idempotency_key = %(idempotency_key)s;

-- name: get_outcome
SELECT idempotency_key, resource_key, fencing_token, outcome, recorded_at
FROM leaseq_fence_outcomes
WHERE idempotency_key = %(idempotency_key)s;
