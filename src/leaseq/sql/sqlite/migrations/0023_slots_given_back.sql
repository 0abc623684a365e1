-- leaseq schema, version 23, SQLite: the same column as PostgreSQL's (see its
-- 0023): the claim generation whose limit slots were given back.

ALTER TABLE leaseq_tasks ADD COLUMN slots_released_generation INTEGER;
UPDATE leaseq_tasks SET slots_released_generation = claim_generation
WHERE status <> 'running' AND claim_generation > 0;

-- Action tokens expired an hour and more are deleted by the sweep (see PostgreSQL's 0023).
CREATE INDEX leaseq_action_tokens_expires ON leaseq_action_tokens (expires_at);
