-- leaseq schema, version 33, PostgreSQL: fair share across tenants.
-- fairness_key: the tenant (or any group) a task is served for
-- (enqueue(..., fairness_key=..., fairness_weight=...)); fairness_weight: its
-- share, a positive number (1 by default; NULL for a task without a key).
-- Within one priority the claim serves the keys with tasks queued in
-- weighted round robin: each key's virtual time runs on by 1/weight for
-- every task claimed under it, and the key that is furthest behind is served
-- first. The tasks without a key are one more key between them.
--
-- The claimable index now holds the queued tasks without a fairness key
-- only, and leaseq_tasks_fair those with one, in claim order within each
-- key: a queue that names no key reads the claimable index as before and
-- finds leaseq_tasks_fair empty (one probe), and each queued task is in
-- exactly one of the two. Building both reads the whole table once, in the
-- migration's transaction (seconds for a few million finished tasks): run
-- `leaseq migrate` when a pause of that length is acceptable.
--
-- leaseq_fairness: one row per (queue, priority, key) a claim has served:
-- the key's virtual time at that priority (vtime), about the virtual time at
-- which it was last served there (vstart: the priority's virtual time is the
-- latest of these, and no key starts more than one task's cost behind it),
-- and what it was served (service: the sum of 1/weight; claimed: tasks).
-- Only claims write it, each locking the rows it charges in key order.

ALTER TABLE leaseq_tasks ADD COLUMN fairness_key text, ADD COLUMN fairness_weight double precision;

DROP INDEX leaseq_tasks_claimable;
CREATE INDEX leaseq_tasks_claimable ON leaseq_tasks (queue, priority DESC, available_at, id)
    WHERE status = 'queued' AND fairness_key IS NULL;
CREATE INDEX leaseq_tasks_fair ON leaseq_tasks (queue, fairness_key, priority DESC, available_at, id)
    WHERE status = 'queued' AND fairness_key IS NOT NULL;

CREATE TABLE leaseq_fairness (
    queue     text NOT NULL,
    priority  integer NOT NULL,
    key       text NOT NULL,
    vtime     double precision NOT NULL DEFAULT 0,
    vstart    double precision NOT NULL DEFAULT 0,
    service   double precision NOT NULL DEFAULT 0,
    claimed   bigint NOT NULL DEFAULT 0,
    served_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, priority, key)
);
CREATE INDEX leaseq_fairness_vstart ON leaseq_fairness (queue, priority, vstart);
