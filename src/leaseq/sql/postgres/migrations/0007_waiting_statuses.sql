-- leaseq schema, version 7, PostgreSQL: the statuses of tasks that wait, and
-- of tasks that end without running.
--
--   waiting            not claimable until the tasks it depends on complete
--   awaiting_approval  not claimable until an operator approves it
--   denied             an operator denied it (terminal)
--   expired            its deadline passed before it started (terminal)
--
-- A task in a waiting status holds no lease and no limit slot: only 'running'
-- has a lease (leaseq_tasks_lease_shape).

ALTER TABLE leaseq_tasks
    DROP CONSTRAINT leaseq_tasks_status_check,
    ADD CONSTRAINT leaseq_tasks_status_check CHECK (status IN
        ('queued', 'running', 'completed', 'cancelled', 'dead', 'needs_reconciliation', 'blocked',
         'waiting', 'awaiting_approval', 'denied', 'expired'));
