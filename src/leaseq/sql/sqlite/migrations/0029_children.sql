-- leaseq schema, version 29, SQLite: child tasks (see the PostgreSQL file).
-- wait_children is a JSON array of task ids.

ALTER TABLE leaseq_tasks ADD COLUMN parent_id INTEGER;
ALTER TABLE leaseq_tasks ADD COLUMN wait_children TEXT;
CREATE INDEX leaseq_tasks_children ON leaseq_tasks (parent_id) WHERE parent_id IS NOT NULL;
