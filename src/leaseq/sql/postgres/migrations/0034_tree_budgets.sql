-- leaseq schema, version 34, PostgreSQL: budgets that cover a task's tree.
--
-- A budget on a task (schema 31) covers the task and everything it spawns
-- (ctx.spawn: parent_id) or intends (ctx.intend: parent_task_id), and
-- theirs. budget_owners: the tasks whose budgets cover this one, root-first
-- (ascending ids: an ancestor is written before its descendants): the task
-- itself when it has a budget, after its budgeted ancestors; NULL when no
-- budget covers it (such a task's consume and ledger steps pay nothing for
-- budgets). A child is born with its parent's budget_owners.
--
-- leaseq_budgets: one row per budget owner and key, what the owner's budget
-- allows (budget) and what its tree has consumed of the key (spent: the
-- owner's own consumption and that of every task it covers). Written when
-- the budget is set (at enqueue), charged by every consume of the tree, in
-- owner order (each consume locks the rows it charges root-first, so
-- concurrent consumers of one tree never deadlock), raised by an approval.
-- Only consumes, the enqueue and an approval write it; it goes with its
-- owner (retention deletes the task).

ALTER TABLE leaseq_tasks ADD COLUMN budget_owners bigint[];

CREATE TABLE leaseq_budgets (
    owner_id bigint NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    key      text NOT NULL,
    budget   bigint NOT NULL,
    spent    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (owner_id, key)
);

UPDATE leaseq_tasks SET budget_owners = ARRAY[id] WHERE budget IS NOT NULL;

INSERT INTO leaseq_budgets (owner_id, key, budget, spent)
SELECT t.id, b.key, b.value::bigint, coalesce((t.spent ->> b.key)::bigint, 0)
FROM leaseq_tasks t, jsonb_each_text(t.budget) b
WHERE t.budget IS NOT NULL;
