-- leaseq schema, version 12, PostgreSQL: the class and the arguments of each
-- ledger entry, for tool calls (ctx.tool).
--
-- effect is what the one call does to the world (read_only, idempotent,
-- side_effect), no longer only the task's class: expired-lease and failure
-- routing treat an entry without a response as ambiguous only when it is a
-- side_effect, so a task whose open call was a model request or a read is
-- simply retried. An entry begun with ctx.effect takes its task's class, so
-- existing entries get their task's class and route exactly as before.
--
-- args_digest is the SHA-256 of a tool call's arguments (NULL for ctx.effect):
-- a retry that reaches the same call position with other arguments diverged
-- from the recorded run, and its replay is refused (ToolCallDiverged).

ALTER TABLE leaseq_effects
    ADD COLUMN effect text NOT NULL DEFAULT 'side_effect'
        CHECK (effect IN ('read_only', 'idempotent', 'side_effect')),
    ADD COLUMN args_digest text;

UPDATE leaseq_effects e SET effect = t.effect
FROM leaseq_tasks t
WHERE t.id = e.task_id AND t.effect <> 'side_effect';
