-- leaseq schema, version 12, SQLite: the class and the arguments of each
-- ledger entry, for tool calls (see the PostgreSQL file).

ALTER TABLE leaseq_effects ADD COLUMN effect TEXT NOT NULL DEFAULT 'side_effect'
    CHECK (effect IN ('read_only', 'idempotent', 'side_effect'));
ALTER TABLE leaseq_effects ADD COLUMN args_digest TEXT;

UPDATE leaseq_effects
SET effect = (SELECT t.effect FROM leaseq_tasks t WHERE t.id = leaseq_effects.task_id)
WHERE (SELECT t.effect FROM leaseq_tasks t WHERE t.id = leaseq_effects.task_id) <> 'side_effect';
