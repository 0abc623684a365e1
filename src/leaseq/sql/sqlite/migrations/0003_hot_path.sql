-- leaseq schema, version 3, SQLite: lighter writes on the hot path (see the
-- PostgreSQL file for the reasons).
--
-- 1. leaseq_tasks_status holds only finished and parked tasks: only the
--    claimable index serves "status = 'queued'", only the leases index serves
--    the look for expired leases (leaseq_tasks_owner goes for that too), and
--    claims and completions stop paying for two index entries. (The events'
--    foreign key stays: SQLite cannot drop a constraint without rebuilding
--    the table, and its check is cheap in process.)
-- 2. The "enqueued" event is no longer stored: the task row is that entry
--    (list_events). The copies written before this version go.

DROP INDEX leaseq_tasks_status;
CREATE INDEX leaseq_tasks_status ON leaseq_tasks (status, queue) WHERE status NOT IN ('queued', 'running');
DROP INDEX leaseq_tasks_owner;

DELETE FROM leaseq_events WHERE type = 'enqueued';
