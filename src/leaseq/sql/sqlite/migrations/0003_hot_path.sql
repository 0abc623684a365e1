-- leaseq schema, version 3, SQLite: leaseq_tasks_status no longer holds
-- queued tasks, as on PostgreSQL: only the claimable index serves
-- "status = 'queued'", and claims and completions stop paying for an entry
-- here. (The events' foreign key stays: SQLite cannot drop a constraint
-- without rebuilding the table, and its check is cheap in process.)

DROP INDEX leaseq_tasks_status;
CREATE INDEX leaseq_tasks_status ON leaseq_tasks (status, queue) WHERE status <> 'queued';

-- 3. The "enqueued" event is no longer stored: the task row holds all it
--    said (queue, kind, effect, idempotency key, priority, created_at, none
--    of which ever changes), and list_events shows it from there. The copies
--    written before this version go, so no trail shows the entry twice.
DELETE FROM leaseq_events WHERE type = 'enqueued';
