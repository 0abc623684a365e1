-- leaseq schema, version 14, SQLite: approvals bound to everything a gated
-- task runs with, decided in time and never by their requester; and intents
-- that know the task that recorded them. Same contract as the PostgreSQL
-- migration (see it for each part); times are REAL Unix seconds.

ALTER TABLE leaseq_approvals ADD COLUMN requested_worker TEXT;
ALTER TABLE leaseq_approvals ADD COLUMN requested_token TEXT;

CREATE INDEX leaseq_approvals_late ON leaseq_approvals (task_id)
    WHERE decision = 'approved' AND decided_at >= deadline_at;

ALTER TABLE leaseq_tasks ADD COLUMN parent_task_id INTEGER;
ALTER TABLE leaseq_tasks ADD COLUMN parent_cancelled_at REAL;

CREATE INDEX leaseq_tasks_parent ON leaseq_tasks (parent_task_id) WHERE parent_task_id IS NOT NULL;

-- The intents recorded so far: each is the response of an intend:<kind> entry of its parent's ledger.
UPDATE leaseq_tasks
SET parent_task_id = (
    SELECT e.task_id FROM leaseq_effects e
    WHERE e.action LIKE 'intend:%' AND e.status = 'done' AND json_type(e.response, '$.task_id') = 'integer'
      AND json_extract(e.response, '$.task_id') = leaseq_tasks.id AND e.task_id <> leaseq_tasks.id
    ORDER BY e.id LIMIT 1)
WHERE id IN (SELECT json_extract(e.response, '$.task_id') FROM leaseq_effects e
             WHERE e.action LIKE 'intend:%' AND e.status = 'done'
               AND json_type(e.response, '$.task_id') = 'integer');

UPDATE leaseq_approvals
SET requested_worker = (
    SELECT e.worker_id FROM leaseq_effects e
    WHERE e.action LIKE 'intend:%' AND e.status = 'done' AND json_type(e.response, '$.task_id') = 'integer'
      AND json_extract(e.response, '$.task_id') = leaseq_approvals.task_id
      AND leaseq_approvals.requested_by = 'task:' || e.task_id
    ORDER BY e.id LIMIT 1)
WHERE requested_by LIKE 'task:%';

-- While a gated task is unfinished, nothing its approval digest covers changes.
DROP TRIGGER leaseq_tasks_gated_fixed;

CREATE TRIGGER leaseq_tasks_gated_fixed
    BEFORE UPDATE OF kind, payload, queue, effect, actions, priority, max_attempts, lease_seconds,
                     timeout_seconds, deadline_at, limits, units ON leaseq_tasks
    FOR EACH ROW
    WHEN (NEW.kind IS NOT OLD.kind OR NEW.payload IS NOT OLD.payload OR NEW.queue IS NOT OLD.queue
          OR NEW.effect IS NOT OLD.effect OR NEW.actions IS NOT OLD.actions OR NEW.priority IS NOT OLD.priority
          OR NEW.max_attempts IS NOT OLD.max_attempts OR NEW.lease_seconds IS NOT OLD.lease_seconds
          OR NEW.timeout_seconds IS NOT OLD.timeout_seconds OR NEW.deadline_at IS NOT OLD.deadline_at
          OR NEW.limits IS NOT OLD.limits OR NEW.units IS NOT OLD.units)
     AND OLD.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
     AND EXISTS (SELECT 1 FROM leaseq_approvals a WHERE a.task_id = OLD.id)
BEGIN
    SELECT RAISE(ABORT, 'leaseq: what an approval-gated task''s digest covers cannot change');
END;
