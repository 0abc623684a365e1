-- leaseq schema, version 8, PostgreSQL: budgets of a task's time, and the
-- count of its retries on request.
--
--   timeout_seconds  how long one attempt may run (NULL: as long as its lease
--                    is renewed); the worker cancels an attempt that runs
--                    longer and gives its lease up with reason "timeout"
--   deadline_at      the latest time the task may start (NULL: no deadline);
--                    claims skip a task past it, and the sweep moves it to
--                    'expired' with a "deadline_passed" event
--   snoozes          how many times a handler asked for a later retry
--                    (leaseq.Retry); past the queue's max_snoozes the request
--                    counts as a failure

ALTER TABLE leaseq_tasks
    ADD COLUMN timeout_seconds double precision CHECK (timeout_seconds IS NULL OR timeout_seconds > 0),
    ADD COLUMN deadline_at timestamptz,
    ADD COLUMN snoozes integer NOT NULL DEFAULT 0;

-- The overdue sweep's look-up: only tasks with a deadline that have not
-- started yet (or wait to start again) enter it, in deadline order.
CREATE INDEX leaseq_tasks_deadline ON leaseq_tasks (deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('queued', 'waiting', 'awaiting_approval');
