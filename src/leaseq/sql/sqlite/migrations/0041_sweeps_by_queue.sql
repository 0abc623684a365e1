-- leaseq schema, version 41, SQLite: every sweep reads one queue, as on
-- PostgreSQL (see its 0041): the indexes the claim's routing check and the
-- sweeps walk lead with the queue, and an action token carries its task's.

DROP INDEX leaseq_tasks_leases;
CREATE INDEX leaseq_tasks_leases ON leaseq_tasks (queue, lease_expires_at) WHERE status = 'running';

DROP INDEX leaseq_tasks_wake;
CREATE INDEX leaseq_tasks_wake ON leaseq_tasks (queue, wake_at) WHERE status = 'waiting' AND wake_at IS NOT NULL;

DROP INDEX leaseq_tasks_deadline;
CREATE INDEX leaseq_tasks_deadline ON leaseq_tasks (queue, deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('queued', 'waiting', 'awaiting_approval');

-- SQLite adds a NOT NULL column only with a default: every row is then given its task's queue.
ALTER TABLE leaseq_action_tokens ADD COLUMN queue TEXT NOT NULL DEFAULT '';
UPDATE leaseq_action_tokens
SET queue = coalesce((SELECT t.queue FROM leaseq_tasks t WHERE t.id = leaseq_action_tokens.task_id), '');
DROP INDEX leaseq_action_tokens_expires;
CREATE INDEX leaseq_action_tokens_expires ON leaseq_action_tokens (queue, expires_at);
