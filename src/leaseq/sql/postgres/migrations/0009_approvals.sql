-- leaseq schema, version 9, PostgreSQL: approval gates.
--
-- A task enqueued with approval="required" waits in 'awaiting_approval'
-- (holding no lease) until an operator approves it (then 'queued') or denies
-- it ('denied', terminal), or until its deadline passes unanswered (denied by
-- the maintenance job). Its row here records what was shown to the approver,
-- as a digest of the task's kind, payload and queue, who asked for it, and
-- who decided, how and when.
--
-- An approval is bound to that digest: the approver passes the digest they
-- were shown and the queue refuses a different one. The trigger below keeps
-- the bound task from changing under its approval: no statement may change
-- the kind, payload or queue of a gated task that is not finished (retention
-- may still clear the payload of a finished one).

CREATE TABLE leaseq_approvals (
    task_id      bigint PRIMARY KEY REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    digest       text NOT NULL,                   -- sha256:<hex> of {kind, payload, queue}
    requested_by text NOT NULL,                   -- who enqueued it (token name, OS user, task:<id>)
    requested_at timestamptz NOT NULL DEFAULT now(),
    deadline_at  timestamptz,                     -- denied by default after this (NULL: no deadline)
    decision     text CHECK (decision IN ('approved', 'denied')),
    decided_by   text,                            -- the approver's queue-issued identity
    decided_via  text,                            -- api, dashboard, cli, mcp, deadline
    note         text,                            -- the approver's note, or the reason of a denial
    decided_at   timestamptz
);

-- The deadline job reads only undecided requests with a deadline.
CREATE INDEX leaseq_approvals_due ON leaseq_approvals (deadline_at)
    WHERE decision IS NULL AND deadline_at IS NOT NULL;

CREATE FUNCTION leaseq_gated_task_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
       AND EXISTS (SELECT 1 FROM leaseq_approvals a WHERE a.task_id = OLD.id) THEN
        RAISE EXCEPTION 'task % is approval-gated: its kind, payload and queue cannot change', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER leaseq_tasks_gated_fixed
    BEFORE UPDATE OF kind, payload, queue ON leaseq_tasks
    FOR EACH ROW
    WHEN (NEW.kind IS DISTINCT FROM OLD.kind OR NEW.payload IS DISTINCT FROM OLD.payload
          OR NEW.queue IS DISTINCT FROM OLD.queue)
    EXECUTE FUNCTION leaseq_gated_task_fixed();
