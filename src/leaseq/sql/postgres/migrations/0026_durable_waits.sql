-- leaseq schema, version 26, PostgreSQL: durable waits. A handler that
-- sleeps (ctx.sleep) or waits for a signal (ctx.wait_for_signal) ends its
-- attempt: the lease is released, and the task rests in 'waiting' holding
-- no lease and no worker slot.
--
--   wake_at      when a waiting task becomes claimable again, by the
--                database's clock (a sleep's end, a signal wait's timeout);
--                NULL: no time (a signal wait without a timeout, or a task
--                waiting for the tasks it depends on)
--   wait_signal  the name of the signal the task waits for (NULL: none); a
--                signal of that name makes it claimable at once
--
-- The claim routes due sleepers first (as it routes expired leases): a
-- probe of leaseq_tasks_wake, whose rows are the timed waits only.
ALTER TABLE leaseq_tasks ADD COLUMN wake_at timestamptz;
ALTER TABLE leaseq_tasks ADD COLUMN wait_signal text;
CREATE INDEX leaseq_tasks_wake ON leaseq_tasks (wake_at) WHERE status = 'waiting' AND wake_at IS NOT NULL;

-- Signals sent to a task (q.signal): kept until an attempt that waits for
-- one of that name consumes it, each consumed once (consumed_at set, under
-- the consuming attempt's lease), with the sender's authenticated identity.
CREATE TABLE leaseq_signals (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id             bigint NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    name                text NOT NULL,
    payload             jsonb,
    sent_by             text NOT NULL,
    sent_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    consumed_generation bigint,
    consumed_at         timestamptz,
    consumed_key        text
);
CREATE INDEX leaseq_signals_pending ON leaseq_signals (task_id, name, id) WHERE consumed_at IS NULL;
