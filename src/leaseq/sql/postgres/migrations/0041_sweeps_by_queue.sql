-- leaseq schema, version 41, PostgreSQL: every sweep reads one queue.
--
-- A server that distributes leaseq's tables by queue (Citus, a queue the
-- unit of distribution) runs FOR UPDATE ... SKIP LOCKED only in a statement
-- that reads one shard. Every such read of the worker path now names its
-- queue: the claim's routing check (claim_head: an expired lease or a due
-- sleeper of the claiming queue), and the sweeps (lock_expired,
-- lock_sleepers, lock_overdue, prune_action_tokens), which take a queue; the
-- sweep of every queue asks sweep_queues which queues have work. The indexes
-- those reads walk lead with the queue, in place of the ones that read every
-- queue at once (no statement reads across queues in their order any more).

DROP INDEX leaseq_tasks_leases;
CREATE INDEX leaseq_tasks_leases ON leaseq_tasks (queue, lease_expires_at) WHERE status = 'running';

DROP INDEX leaseq_tasks_wake;
CREATE INDEX leaseq_tasks_wake ON leaseq_tasks (queue, wake_at) WHERE status = 'waiting' AND wake_at IS NOT NULL;

DROP INDEX leaseq_tasks_deadline;
CREATE INDEX leaseq_tasks_deadline ON leaseq_tasks (queue, deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('queued', 'waiting', 'awaiting_approval');

-- An action token carries its task's queue (a task never changes queue; the
-- token goes with its task), written by mint_action_token.
ALTER TABLE leaseq_action_tokens ADD COLUMN queue text;
UPDATE leaseq_action_tokens k SET queue = t.queue FROM leaseq_tasks t WHERE t.id = k.task_id;
ALTER TABLE leaseq_action_tokens ALTER COLUMN queue SET NOT NULL;
DROP INDEX leaseq_action_tokens_expires;
CREATE INDEX leaseq_action_tokens_expires ON leaseq_action_tokens (queue, expires_at);
