-- leaseq schema, version 38, PostgreSQL: a task's request for more budget is
-- a request of its own, beside the gate it was enqueued with.
--
-- Until now a task had one row here: a task enqueued with
-- approval='required' and later paused for its budget had its gate's row
-- written over by the budget's request (decision, approver, note, deadline
-- and digest gone), and what read the gate afterwards (a retried enqueue of
-- the task, the approvals record) read the budget's request in its place.
-- Each row now names the request it is: 'gate' (asked at the enqueue, bound
-- to the task's digest) or 'budget' (a pause for more, written afresh at
-- each pause). A decision of the one never stands for the other, and the
-- record keeps both. A task has at most one undecided request at a time
-- (leaseq_approvals_open): every decision finds it by the task alone.

ALTER TABLE leaseq_approvals
    ADD COLUMN request text NOT NULL DEFAULT 'gate' CHECK (request IN ('gate', 'budget'));

UPDATE leaseq_approvals SET request = 'budget' WHERE reason = 'budget';

ALTER TABLE leaseq_approvals DROP CONSTRAINT leaseq_approvals_pkey;
ALTER TABLE leaseq_approvals ADD PRIMARY KEY (task_id, request);

CREATE UNIQUE INDEX leaseq_approvals_open ON leaseq_approvals (task_id) WHERE decision IS NULL;
