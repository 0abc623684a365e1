-- leaseq schema, version 22, PostgreSQL: retention in two steps, and an
-- evidence record that outlives its task.
-- Retention first clears every column that can carry user data from ended
-- tasks (payload, result, last_error; effect responses; approval notes; the
-- free-text and argument keys of event details), recording when in
-- scrubbed_at; later it deletes the task with everything that hangs off it.
-- Before a task goes, its trail is copied to leaseq_evidence, each entry's
-- detail reduced to the keys leaseq.engine.schema.EVIDENCE_KEYS names (who
-- held which generation, who decided what, why each lease ended; never a
-- payload, result, error text or note). Evidence rows have no foreign key:
-- they stay after the task, until their own retention (counted from ended_at,
-- when the task ended) passes.

ALTER TABLE leaseq_tasks ADD COLUMN scrubbed_at timestamptz;

-- every ended status, not only completed and cancelled
DROP INDEX leaseq_tasks_finished;
CREATE INDEX leaseq_tasks_ended ON leaseq_tasks (updated_at)
    WHERE status IN ('completed', 'cancelled', 'dead', 'denied', 'expired');

CREATE TABLE leaseq_evidence (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     bigint NOT NULL,
    queue       text NOT NULL,
    kind        text NOT NULL,
    task_status text NOT NULL,
    ended_at    timestamptz NOT NULL,
    event_id    bigint,
    type        text NOT NULL,
    generation  bigint,
    worker_id   text,
    at          timestamptz NOT NULL,
    detail      jsonb NOT NULL DEFAULT '{}',
    kept_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX leaseq_evidence_ended ON leaseq_evidence (ended_at);
CREATE INDEX leaseq_evidence_task ON leaseq_evidence (task_id, id);

-- The audit entries of a task are found by their target when its user data is cleared.
CREATE INDEX leaseq_audit_target ON leaseq_audit (target);
