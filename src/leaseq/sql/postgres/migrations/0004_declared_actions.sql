-- leaseq schema, version 4, PostgreSQL: the actions a task may take.
--
-- actions is the JSON array of action names a task declared at enqueue
-- (@app.task(..., actions=[...]), enqueue(..., actions=[...])), or NULL for
-- a task that declared none. begin_effect refuses an action the task did not
-- declare; a NULL list allows any action of an idempotent or side_effect
-- task, and a read_only task may begin no action at all. Existing tasks get
-- NULL: they keep working as before.

ALTER TABLE leaseq_tasks ADD COLUMN actions jsonb;
