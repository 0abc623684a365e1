-- leaseq schema, version 3, PostgreSQL: lighter writes on the hot path.
--
-- 1. leaseq_tasks_status no longer holds queued tasks. Only the claimable
--    index (leaseq_tasks_claimable) can then serve "status = 'queued'", so a
--    claim reads the queue in claim order even before the table's first
--    ANALYZE (with both indexes on offer, a fresh table's estimate of one
--    queued row made PostgreSQL read the queue through this index and sort
--    all of it on every claim). Every claim and completion also stops paying
--    for an index entry here.
-- 2. Events no longer reference their task through a foreign key. The check
--    cost a lookup and a row lock on the task for each of the two or three
--    events every task writes; leaseq deletes a task's events itself when it
--    prunes the task, and no statement writes an event for a task id that it
--    did not just read or write under lock.
--
-- Both are plain DDL in the migration's transaction: they hold a lock on
-- leaseq_tasks while the smaller index is built (seconds for a few million
-- finished tasks). Run `leaseq migrate` when a pause of that length is
-- acceptable.

DROP INDEX leaseq_tasks_status;
CREATE INDEX leaseq_tasks_status ON leaseq_tasks (status, queue) WHERE status <> 'queued';

ALTER TABLE leaseq_events DROP CONSTRAINT leaseq_events_task_id_fkey;

-- 3. The "enqueued" event is no longer stored: the task row holds all it
--    said (queue, kind, effect, idempotency key, priority, created_at, none
--    of which ever changes), and list_events shows it from there. The copies
--    written before this version go, so no trail shows the entry twice.
DELETE FROM leaseq_events WHERE type = 'enqueued';
