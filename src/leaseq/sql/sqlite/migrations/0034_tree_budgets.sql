-- leaseq schema, version 34, SQLite: budgets that cover a task's tree (see the
-- PostgreSQL migration). budget_owners is a JSON array of task ids, root-first.

ALTER TABLE leaseq_tasks ADD COLUMN budget_owners TEXT;

CREATE TABLE leaseq_budgets (
    owner_id INTEGER NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    key      TEXT NOT NULL,
    budget   INTEGER NOT NULL,
    spent    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (owner_id, key)
);

UPDATE leaseq_tasks SET budget_owners = json_array(id) WHERE budget IS NOT NULL;

INSERT INTO leaseq_budgets (owner_id, key, budget, spent)
SELECT t.id, b.key, b.value, coalesce(json_extract(t.spent, '$."' || b.key || '"'), 0)
FROM leaseq_tasks AS t, json_each(t.budget) AS b
WHERE t.budget IS NOT NULL;
