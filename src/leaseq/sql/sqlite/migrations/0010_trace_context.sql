-- leaseq schema, version 10, SQLite: the caller's trace context, carried in
-- the task (see the PostgreSQL file).

ALTER TABLE leaseq_tasks ADD COLUMN trace_context TEXT;
