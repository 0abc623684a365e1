-- leaseq schema, version 11, PostgreSQL: tasks that wait for other tasks, and
-- the notification that wakes a caller waiting for a task's end.
--
-- leaseq_dependencies holds one row per (waiter, upstream) pair: the waiter
-- stays 'waiting' until every upstream is completed. has_dependents marks an
-- upstream that some task waits for, so that completing a task nobody waits
-- for stays one statement (complete_batch leaves such tasks to the caller's
-- second, settling transaction). on_failure says what becomes of the waiter
-- when an upstream ends without success: 'cancel' (cascading) or 'block'.

ALTER TABLE leaseq_tasks
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
    -- someone waits for this task's end (Queue.wait): its end is notified
    ADD COLUMN watched boolean NOT NULL DEFAULT false;

CREATE TABLE leaseq_dependencies (
    waiter     bigint NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    upstream   bigint NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    on_failure text NOT NULL DEFAULT 'cancel' CHECK (on_failure IN ('cancel', 'block')),
    PRIMARY KEY (waiter, upstream)
);
-- The waiters of an ended task, found from the upstream side.
CREATE INDEX leaseq_dependencies_upstream ON leaseq_dependencies (upstream);

-- A watched task that reaches a status Queue.wait returns on sends NOTIFY on
-- the channel leaseq_task_<id> (delivered at commit). Only watched tasks: an
-- unwatched completion pays nothing but this WHEN test, and never takes the
-- commit-time lock that NOTIFY needs.
CREATE FUNCTION leaseq_notify_task_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('leaseq_task_' || NEW.id, NEW.status);
    RETURN NULL;
END
$$;

CREATE TRIGGER leaseq_tasks_settled
    AFTER UPDATE OF status ON leaseq_tasks
    FOR EACH ROW
    WHEN (NEW.watched AND NEW.status IS DISTINCT FROM OLD.status
          AND NEW.status IN ('completed', 'dead', 'cancelled', 'needs_reconciliation', 'blocked', 'denied',
                             'expired'))
    EXECUTE FUNCTION leaseq_notify_task_settled();
