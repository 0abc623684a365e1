-- leaseq schema, version 33, SQLite: the same columns, indexes and table as
-- PostgreSQL's (see its 0033): fair share across tenants.

ALTER TABLE leaseq_tasks ADD COLUMN fairness_key TEXT;
ALTER TABLE leaseq_tasks ADD COLUMN fairness_weight REAL;

DROP INDEX leaseq_tasks_claimable;
CREATE INDEX leaseq_tasks_claimable ON leaseq_tasks (queue, priority DESC, available_at, id)
    WHERE status = 'queued' AND fairness_key IS NULL;
CREATE INDEX leaseq_tasks_fair ON leaseq_tasks (queue, fairness_key, priority DESC, available_at, id)
    WHERE status = 'queued' AND fairness_key IS NOT NULL;

CREATE TABLE leaseq_fairness (
    queue     TEXT NOT NULL,
    priority  INTEGER NOT NULL,
    key       TEXT NOT NULL,
    vtime     REAL NOT NULL DEFAULT 0,
    vstart    REAL NOT NULL DEFAULT 0,
    service   REAL NOT NULL DEFAULT 0,
    claimed   INTEGER NOT NULL DEFAULT 0,
    served_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    PRIMARY KEY (queue, priority, key)
);
CREATE INDEX leaseq_fairness_vstart ON leaseq_fairness (queue, priority, vstart);
