-- leaseq schema, version 3, SQLite: leaseq_tasks_status no longer holds
-- queued tasks, as on PostgreSQL: only the claimable index serves
-- "status = 'queued'", and claims and completions stop paying for an entry
-- here. (The events' foreign key stays: SQLite cannot drop a constraint
-- without rebuilding the table, and its check is cheap in process.)

DROP INDEX leaseq_tasks_status;
CREATE INDEX leaseq_tasks_status ON leaseq_tasks (status, queue) WHERE status <> 'queued';
