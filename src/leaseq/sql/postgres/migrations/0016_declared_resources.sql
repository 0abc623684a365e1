-- leaseq schema, version 16, PostgreSQL: the resources a task may name.
--
-- resources is the JSON array of resource keys a task declared at enqueue
-- (enqueue(..., resources=[...])), or NULL for a task that declared none.
-- An effect may name (bind its action token to) only a resource its task
-- declared: a task that declared none names none. The guard is in the
-- effect statements themselves (the effect_allowed template of
-- queries.sql), so a worker role calling them directly is held to it too.
-- An effect records the resource it named, and its token is bound to it.

ALTER TABLE leaseq_tasks ADD COLUMN resources jsonb;
ALTER TABLE leaseq_effects ADD COLUMN resource text;

-- The approval digest covers the declared resources: while a gated task is
-- unfinished they cannot change either (see 0014).
CREATE TRIGGER leaseq_tasks_gated_resources_fixed
    BEFORE UPDATE OF resources ON leaseq_tasks
    FOR EACH ROW
    WHEN (NEW.resources IS DISTINCT FROM OLD.resources)
    EXECUTE FUNCTION leaseq_gated_task_fixed();
