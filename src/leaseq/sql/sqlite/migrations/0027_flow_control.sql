-- leaseq schema, version 27, SQLite: the same columns, indexes and table as
-- PostgreSQL's (see its 0027). Writes run one at a time in BEGIN IMMEDIATE:
-- the upsert of leaseq_flow_keys changes nothing of the order, and is kept
-- so both backends run the same steps.

ALTER TABLE leaseq_tasks ADD COLUMN singleton_key TEXT;
ALTER TABLE leaseq_tasks ADD COLUMN debounce_key TEXT;

CREATE INDEX leaseq_tasks_singleton ON leaseq_tasks (queue, singleton_key, id)
    WHERE singleton_key IS NOT NULL AND status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired');
CREATE INDEX leaseq_tasks_debounce ON leaseq_tasks (queue, debounce_key, id) WHERE debounce_key IS NOT NULL;

CREATE TABLE leaseq_flow_keys (
    scope     TEXT NOT NULL CHECK (scope IN ('singleton', 'debounce')),
    queue     TEXT NOT NULL,
    key       TEXT NOT NULL,
    locked_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    PRIMARY KEY (scope, queue, key)
);
