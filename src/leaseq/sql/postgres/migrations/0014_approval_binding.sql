-- leaseq schema, version 14, PostgreSQL: approvals bound to everything a
-- gated task runs with, decided in time and never by their requester; and
-- intents that know the task that recorded them.
--
-- THE DIGEST. New requests record a version 2 digest ('v2:sha256:<hex>',
-- leaseq.approval_digest): it covers the task's kind, payload and queue and
-- every option its execution depends on (effect, actions, priority,
-- max_attempts, lease_seconds, timeout_seconds, deadline_at, limits, units).
-- A request written before keeps its version 1 digest ('sha256:<hex>', of
-- the kind, payload and queue only), still checked against the task when it
-- is decided; the approver passes the task's version 2 digest, which the
-- inbox shows. The trigger of migration 9 is widened below: while a gated
-- task is unfinished, none of the columns its digest covers may change.
--
-- THE REQUESTER. requested_worker and requested_token name who asked, as
-- identities a decision is checked against (a request is never decided by
-- its requester): the worker that held the recording task's lease, for an
-- intent; the service token that enqueued the task, or whose worker recorded
-- the intent. requested_by stays the text shown to approvers.
--
-- THE DEADLINE. A decision is recorded only while the request's deadline has
-- not passed by the database clock, read as the statement judges the row;
-- that reading is decided_at. The claim refuses a task approved at or after
-- its deadline (leaseq_approvals_late: only a decision written by hand, or by
-- an older leaseq, can be there) and the deadline job ends it denied.
--
-- INTENTS. parent_task_id names the task whose handler recorded this one
-- (ctx.intend); it is filled in below for the intents recorded before, from
-- the recording task's ledger. Cancelling that task cancels its intents that
-- have not started; the others get parent_cancelled_at, which their executor
-- can read. Not a foreign key: retention may remove the parent first.

ALTER TABLE leaseq_approvals
    ADD COLUMN requested_worker text,
    ADD COLUMN requested_token  text;

CREATE INDEX leaseq_approvals_late ON leaseq_approvals (task_id)
    WHERE decision = 'approved' AND decided_at >= deadline_at;

ALTER TABLE leaseq_tasks
    ADD COLUMN parent_task_id      bigint,
    ADD COLUMN parent_cancelled_at timestamptz;

CREATE INDEX leaseq_tasks_parent ON leaseq_tasks (parent_task_id) WHERE parent_task_id IS NOT NULL;

-- The intents recorded so far: each is the response of an intend:<kind> entry of its parent's ledger.
UPDATE leaseq_tasks t
SET parent_task_id = e.task_id
FROM leaseq_effects e
WHERE e.action LIKE 'intend:%' AND e.status = 'done' AND jsonb_typeof(e.response -> 'task_id') = 'number'
  AND t.id = (e.response ->> 'task_id')::bigint AND t.id <> e.task_id;

UPDATE leaseq_approvals a
SET requested_worker = e.worker_id
FROM leaseq_effects e
WHERE e.action LIKE 'intend:%' AND e.status = 'done' AND jsonb_typeof(e.response -> 'task_id') = 'number'
  AND a.task_id = (e.response ->> 'task_id')::bigint AND a.requested_by = 'task:' || e.task_id;

CREATE OR REPLACE FUNCTION leaseq_gated_task_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
       AND EXISTS (SELECT 1 FROM leaseq_approvals a WHERE a.task_id = OLD.id) THEN
        RAISE EXCEPTION 'task % is approval-gated: what its approval digest covers cannot change', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER leaseq_tasks_gated_fixed ON leaseq_tasks;

CREATE TRIGGER leaseq_tasks_gated_fixed
    BEFORE UPDATE OF kind, payload, queue, effect, actions, priority, max_attempts, lease_seconds,
                     timeout_seconds, deadline_at, limits, units ON leaseq_tasks
    FOR EACH ROW
    WHEN (NEW.kind IS DISTINCT FROM OLD.kind OR NEW.payload IS DISTINCT FROM OLD.payload
          OR NEW.queue IS DISTINCT FROM OLD.queue OR NEW.effect IS DISTINCT FROM OLD.effect
          OR NEW.actions IS DISTINCT FROM OLD.actions OR NEW.priority IS DISTINCT FROM OLD.priority
          OR NEW.max_attempts IS DISTINCT FROM OLD.max_attempts
          OR NEW.lease_seconds IS DISTINCT FROM OLD.lease_seconds
          OR NEW.timeout_seconds IS DISTINCT FROM OLD.timeout_seconds
          OR NEW.deadline_at IS DISTINCT FROM OLD.deadline_at OR NEW.limits IS DISTINCT FROM OLD.limits
          OR NEW.units IS DISTINCT FROM OLD.units)
    EXECUTE FUNCTION leaseq_gated_task_fixed();
