-- leaseq schema, version 16, SQLite: the resources a task may name (see the
-- PostgreSQL file). resources holds a JSON array as text, or NULL.

ALTER TABLE leaseq_tasks ADD COLUMN resources TEXT;
ALTER TABLE leaseq_effects ADD COLUMN resource TEXT;

-- The approval digest covers the declared resources: while a gated task is
-- unfinished they cannot change either (see 0014).
CREATE TRIGGER leaseq_tasks_gated_resources_fixed
    BEFORE UPDATE OF resources ON leaseq_tasks
    FOR EACH ROW
    WHEN NEW.resources IS NOT OLD.resources
     AND OLD.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
     AND EXISTS (SELECT 1 FROM leaseq_approvals a WHERE a.task_id = OLD.id)
BEGIN
    SELECT RAISE(ABORT, 'leaseq: what an approval-gated task''s digest covers cannot change');
END;
