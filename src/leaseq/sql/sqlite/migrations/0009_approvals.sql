-- leaseq schema, version 9, SQLite: approval gates.
-- Same contract as the PostgreSQL migration; times are REAL Unix seconds.

CREATE TABLE leaseq_approvals (
    task_id      INTEGER PRIMARY KEY REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    digest       TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    requested_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    deadline_at  REAL,
    decision     TEXT CHECK (decision IN ('approved', 'denied')),
    decided_by   TEXT,
    decided_via  TEXT,
    note         TEXT,
    decided_at   REAL
);

CREATE INDEX leaseq_approvals_due ON leaseq_approvals (deadline_at)
    WHERE decision IS NULL AND deadline_at IS NOT NULL;

-- The kind, payload and queue of a gated task that is not finished never change.
CREATE TRIGGER leaseq_tasks_gated_fixed
    BEFORE UPDATE OF kind, payload, queue ON leaseq_tasks
    FOR EACH ROW
    WHEN (NEW.kind IS NOT OLD.kind OR NEW.payload IS NOT OLD.payload OR NEW.queue IS NOT OLD.queue)
     AND OLD.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
     AND EXISTS (SELECT 1 FROM leaseq_approvals a WHERE a.task_id = OLD.id)
BEGIN
    SELECT RAISE(ABORT, 'leaseq: an approval-gated task''s kind, payload and queue cannot change');
END;
