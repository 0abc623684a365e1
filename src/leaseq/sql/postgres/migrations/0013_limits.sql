-- leaseq schema, version 13, PostgreSQL: limits shared by every worker.
--
-- A task names the limits it counts against (limits: NULL when it names
-- none) and its weight (units, for limits that count units, such as a
-- provider's token budget). leaseq_limits holds one row per limit key:
--
--   max_running   at most this many live leases (or units in them) at once
--   per_second    a rate bucket refilled by the database clock, holding at
--   burst         most burst tokens; each claim takes its cost from it
--   counts        'tasks' (each lease costs 1) or 'units' (its task's units)
--   running       what live leases hold now: taken by the claim statement,
--                 given back by the statement that ends the lease (complete,
--                 fail, release, expiry routing, cancel)
--   tokens        the bucket as it stood at refilled_at
--
-- The claim locks the rows of its candidates' keys (in key order) and judges
-- them as last committed, so concurrent claims never overshoot. A task
-- naming a key without a row is not limited by it.

ALTER TABLE leaseq_tasks
    ADD COLUMN limits text[],
    ADD COLUMN units  bigint NOT NULL DEFAULT 1 CHECK (units > 0);

CREATE TABLE leaseq_limits (
    key         text PRIMARY KEY,
    max_running bigint CHECK (max_running > 0),
    per_second  double precision CHECK (per_second > 0),
    burst       double precision CHECK (burst >= 1),
    counts      text NOT NULL DEFAULT 'tasks' CHECK (counts IN ('tasks', 'units')),
    running     bigint NOT NULL DEFAULT 0,
    tokens      double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    changed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    changed_by  text,
    CONSTRAINT leaseq_limits_rate CHECK ((per_second IS NULL) = (burst IS NULL))
);
