-- leaseq schema, version 11, SQLite: tasks that wait for other tasks. See the
-- PostgreSQL file. SQLite has no notifications: Queue.wait polls, so there
-- is no watched column and no trigger.

ALTER TABLE leaseq_tasks ADD COLUMN has_dependents INTEGER NOT NULL DEFAULT 0;

CREATE TABLE leaseq_dependencies (
    waiter     INTEGER NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    upstream   INTEGER NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    on_failure TEXT NOT NULL DEFAULT 'cancel' CHECK (on_failure IN ('cancel', 'block')),
    PRIMARY KEY (waiter, upstream)
) WITHOUT ROWID;
CREATE INDEX leaseq_dependencies_upstream ON leaseq_dependencies (upstream);
