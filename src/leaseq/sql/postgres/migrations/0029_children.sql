-- leaseq schema, version 29, PostgreSQL: child tasks (ctx.spawn, ctx.wait_for).
--
--   parent_id      the task whose handler spawned this one (ctx.spawn); NULL
--                  for any other task (an intent's parent is parent_task_id)
--   wait_children  the children a waiting task waits for (ctx.wait_for,
--                  ctx.wait_for_all); NULL: none. Whatever ends the last of
--                  them (a completion, a failure, a cancel, an expiry) makes
--                  the parent claimable again, in the same transaction.
--
-- A spawned child is born with has_dependents: its end always takes the
-- settling path, which wakes a parent waiting for it. The index finds a
-- task's children (cancelling a task cancels its children that have not
-- ended, and theirs).
ALTER TABLE leaseq_tasks ADD COLUMN parent_id bigint, ADD COLUMN wait_children bigint[];
CREATE INDEX leaseq_tasks_children ON leaseq_tasks (parent_id) WHERE parent_id IS NOT NULL;
