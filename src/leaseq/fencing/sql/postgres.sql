-- leaseq.fencing named queries, PostgreSQL (psycopg 3, %(name)s parameters).
--
-- Two tables, both prefixed leaseq_fence_ and independent of leaseq's queue
-- tables, so a downstream service can hold them in its own database:
--
--   leaseq_fence_attempts  the newest attempt accepted per resource key and
--                          task, as (lease epoch, generation), compared in
--                          that order (generations only order one task's
--                          attempts, so tasks never share a row)
--   leaseq_fence_outcomes  the stored outcome of each idempotency key, with
--                          the task whose attempt produced it
--
-- (leaseq_fence_tokens, one token per resource from before fences were per
-- task, is no longer read: its tokens named no task.)
--
-- FencedStore.apply runs, in one transaction:
--   lock_fence (or create_fence for a new key)   row lock held to commit
--   advance_fence                                 when the token is newer
--   reserve_key, else get_outcome                 when an idempotency key is given
--   ... the caller's write, on the same connection ...
--   record_outcome
-- The fence row lock serialises every apply of one task on one resource; the
-- reserved outcome row (uncommitted until the end) makes a concurrent apply
-- of the same idempotency key wait, then see the committed outcome.

-- name: schema_lock
-- Serialises concurrent migrate() runs (CREATE TABLE IF NOT EXISTS alone can
-- race on the catalogue) until the transaction ends.
SELECT pg_advisory_xact_lock(7431002301);

-- name: schema_lock_table
-- schema_lock without an advisory lock (the portable mode, ?portable=true):
-- taken once create_attempts_table has made the table, it serialises the
-- migrate() runs that follow (two first runs can still race to create it:
-- the loser runs again).
LOCK TABLE leaseq_fence_attempts IN SHARE ROW EXCLUSIVE MODE;

-- name: create_attempts_table
CREATE TABLE IF NOT EXISTS leaseq_fence_attempts (
    resource_key      text NOT NULL,
    task_id           bigint NOT NULL CHECK (task_id >= 0),
    newest_generation bigint NOT NULL CHECK (newest_generation >= 0),
    newest_epoch      bigint NOT NULL DEFAULT 0,
    accepted_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource_key, task_id)
);

-- name: create_outcomes_table
CREATE TABLE IF NOT EXISTS leaseq_fence_outcomes (
    idempotency_key text PRIMARY KEY,
    resource_key    text NOT NULL,
    fencing_token   bigint,
    outcome         jsonb NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    task_id         bigint,
    fencing_epoch   bigint
);

-- name: outcomes_have_task
-- Stores created before fences were per task lack the task column.
SELECT 1 AS present FROM pg_attribute
WHERE attrelid = 'leaseq_fence_outcomes'::regclass AND attname = 'task_id' AND NOT attisdropped;

-- name: add_outcomes_task
-- Their outcomes keep task_id NULL: bound to no task, as they were.
ALTER TABLE leaseq_fence_outcomes ADD COLUMN IF NOT EXISTS task_id bigint;

-- name: lock_fence
-- FOR UPDATE: held until commit, so no other apply of this task on this
-- resource can check or advance the fence between our check and our write.
SELECT newest_epoch, newest_generation FROM leaseq_fence_attempts
WHERE resource_key = %(resource_key)s AND task_id = %(task_id)s
FOR UPDATE;

-- name: create_fence
-- A task's first write to a resource. On a race with another first writer
-- this waits for it; if it committed, nothing is inserted and the caller
-- locks the row it created instead.
INSERT INTO leaseq_fence_attempts (resource_key, task_id, newest_epoch, newest_generation)
VALUES (%(resource_key)s, %(task_id)s, %(epoch)s, %(generation)s)
ON CONFLICT (resource_key, task_id) DO NOTHING
RETURNING newest_epoch, newest_generation;

-- name: advance_fence
UPDATE leaseq_fence_attempts SET newest_epoch = %(epoch)s, newest_generation = %(generation)s, accepted_at = now()
WHERE resource_key = %(resource_key)s AND task_id = %(task_id)s 
  AND (newest_epoch, newest_generation) < (%(epoch)s, %(generation)s);

-- name: newest_generation
SELECT resource_key, task_id, newest_epoch, newest_generation, accepted_at FROM leaseq_fence_attempts
WHERE resource_key = %(resource_key)s AND task_id = %(task_id)s;

-- name: reserve_key
-- Claims the idempotency key for this transaction. A concurrent apply with
-- the same key blocks here until we commit (then inserts nothing and reads
-- our outcome) or roll back (then reserves it itself).
INSERT INTO leaseq_fence_outcomes (idempotency_key, resource_key, task_id, fencing_token, fencing_epoch,
                                   outcome)
VALUES (%(idempotency_key)s, %(resource_key)s, %(task_id)s, %(generation)s, %(epoch)s, 'null')
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: record_outcome
UPDATE leaseq_fence_outcomes SET outcome = CAST(%(outcome)s AS jsonb), recorded_at = now()
WHERE idempotency_key = %(idempotency_key)s;

-- name: get_outcome
SELECT idempotency_key, resource_key, task_id, fencing_token, fencing_epoch, outcome, recorded_at
FROM leaseq_fence_outcomes
WHERE idempotency_key = %(idempotency_key)s;

-- name: fences_have_epoch
-- Stores created before lease epochs lack the epoch columns.
SELECT 1 AS present FROM pg_attribute
WHERE attrelid = 'leaseq_fence_attempts'::regclass AND attname = 'newest_epoch' AND NOT attisdropped;

-- name: add_fence_epoch
-- Every attempt they accepted was of epoch 0 (its token had the form "<task>.<generation>").
ALTER TABLE leaseq_fence_attempts ADD COLUMN IF NOT EXISTS newest_epoch bigint NOT NULL DEFAULT 0;

-- name: outcomes_have_epoch
SELECT 1 AS present FROM pg_attribute
WHERE attrelid = 'leaseq_fence_outcomes'::regclass AND attname = 'fencing_epoch' AND NOT attisdropped;

-- name: add_outcomes_epoch
ALTER TABLE leaseq_fence_outcomes ADD COLUMN IF NOT EXISTS fencing_epoch bigint;
