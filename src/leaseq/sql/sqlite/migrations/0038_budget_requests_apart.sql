-- leaseq schema, version 38, SQLite: a task's request for more budget is a
-- request of its own, beside the gate it was enqueued with (see the
-- PostgreSQL file). SQLite cannot change a primary key in place: the table
-- is built anew, and the triggers that read it are dropped first and made
-- again as they were (0014, 0016).

DROP TRIGGER leaseq_tasks_gated_fixed;
DROP TRIGGER leaseq_tasks_gated_resources_fixed;

CREATE TABLE leaseq_approvals_38 (
    task_id          INTEGER NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    request          TEXT NOT NULL DEFAULT 'gate' CHECK (request IN ('gate', 'budget')),
    digest           TEXT NOT NULL,
    requested_by     TEXT NOT NULL,
    requested_at     REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    deadline_at      REAL,
    decision         TEXT CHECK (decision IN ('approved', 'denied')),
    decided_by       TEXT,
    decided_via      TEXT,
    note             TEXT,
    decided_at       REAL,
    requested_worker TEXT,
    requested_token  TEXT,
    reason           TEXT,
    detail           TEXT,
    PRIMARY KEY (task_id, request)
);

INSERT INTO leaseq_approvals_38 (task_id, request, digest, requested_by, requested_at, deadline_at, decision,
                                 decided_by, decided_via, note, decided_at, requested_worker, requested_token,
                                 reason, detail)
SELECT task_id, CASE WHEN reason = 'budget' THEN 'budget' ELSE 'gate' END, digest, requested_by, requested_at,
       deadline_at, decision, decided_by, decided_via, note, decided_at, requested_worker, requested_token,
       reason, detail
FROM leaseq_approvals;

DROP TABLE leaseq_approvals;
ALTER TABLE leaseq_approvals_38 RENAME TO leaseq_approvals;

CREATE INDEX leaseq_approvals_due ON leaseq_approvals (deadline_at)
    WHERE decision IS NULL AND deadline_at IS NOT NULL;
CREATE INDEX leaseq_approvals_late ON leaseq_approvals (task_id)
    WHERE decision = 'approved' AND decided_at >= deadline_at;
CREATE UNIQUE INDEX leaseq_approvals_open ON leaseq_approvals (task_id) WHERE decision IS NULL;

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

CREATE TRIGGER leaseq_tasks_gated_resources_fixed
    BEFORE UPDATE OF resources ON leaseq_tasks
    FOR EACH ROW
    WHEN NEW.resources IS NOT OLD.resources
     AND OLD.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
     AND EXISTS (SELECT 1 FROM leaseq_approvals a WHERE a.task_id = OLD.id)
BEGIN
    SELECT RAISE(ABORT, 'leaseq: what an approval-gated task''s digest covers cannot change');
END;
