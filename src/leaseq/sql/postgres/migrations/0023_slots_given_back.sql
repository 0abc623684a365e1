-- leaseq schema, version 23, PostgreSQL: a task records the claim generation
-- whose limit slots were given back.
-- A lease's slots come back once, in the transaction that ends it. The
-- statement that gives them back (release_limits, or complete_batch's own)
-- names tasks, not limit keys, and takes back only what an ended lease of
-- that generation still holds: a task no longer running whose
-- slots_released_generation is not yet its claim_generation. Named twice, or
-- named by a role that never held it, a task gives nothing back twice: the
-- limit's count of running leases stays the truth.
-- Tasks whose lease already ended gave their slots back when it ended.

ALTER TABLE leaseq_tasks ADD COLUMN slots_released_generation bigint;
UPDATE leaseq_tasks SET slots_released_generation = claim_generation
WHERE status <> 'running' AND claim_generation > 0;

-- Action tokens expired an hour and more are deleted by the sweep, a batch at
-- a time (prune_action_tokens), found by their expiry.
CREATE INDEX leaseq_action_tokens_expires ON leaseq_action_tokens (expires_at);
