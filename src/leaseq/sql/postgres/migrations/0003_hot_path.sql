-- leaseq schema, version 3, PostgreSQL: lighter writes on the hot path.
--
-- 1. leaseq_tasks_status holds only finished and parked tasks, no longer
--    queued or running ones. Only the claimable index (leaseq_tasks_claimable)
--    can then serve "status = 'queued'", so a claim reads the queue in claim
--    order even before the table's first ANALYZE (with both indexes on
--    offer, a fresh table's estimate of one queued row made PostgreSQL read
--    the queue through this index and sort all of it on every claim). In the
--    same way only the leases index (leaseq_tasks_leases) serves a claim's
--    look for an expired lease, in deadline order, instead of a walk over
--    every running task and a sort. For that, leaseq_tasks_owner goes too:
--    the running tasks are few (workers times their concurrency), and the
--    leases index serves "whose leases are these" as well. Every claim and
--    completion stops paying for two index entries.
-- 2. Events no longer reference their task through a foreign key. The check
--    cost a lookup and a row lock on the task for each of the events every
--    task writes; leaseq deletes a task's events itself when it prunes the
--    task, and no statement writes an event for a task id that it did not
--    just read or write under lock.
-- 3. The "enqueued" event is no longer stored: the task row holds all it
--    said (queue, kind, effect, idempotency key, priority, created_at, none
--    of which ever changes), and list_events shows it from there. The copies
--    written before this version go, so no trail shows the entry twice.
--
-- All three run in the migration's transaction, which holds a lock on
-- leaseq_tasks while the smaller index is built and the old "enqueued" rows
-- are deleted (seconds for a few million finished tasks). Run `leaseq migrate`
-- when a pause of that length is acceptable.

DROP INDEX leaseq_tasks_status;
CREATE INDEX leaseq_tasks_status ON leaseq_tasks (status, queue) WHERE status NOT IN ('queued', 'running');
DROP INDEX leaseq_tasks_owner;

ALTER TABLE leaseq_events DROP CONSTRAINT leaseq_events_task_id_fkey;

DELETE FROM leaseq_events WHERE type = 'enqueued';
