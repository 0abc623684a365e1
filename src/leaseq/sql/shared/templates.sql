-- leaseq SQL templates written once for both dialects (PostgreSQL and SQLite).
--
-- The loader (leaseq/store/queries.py) reads this file before each dialect's
-- queries.sql, so a query of either file expands these as it does its own
-- templates (/* TEMPLATE: <name> */ on a line of its own). A rule that both
-- backends apply in the same words is written here, once; a dialect may not
-- define a template of the same name. Only SQL both dialects run the same
-- way belongs here (no clock, no casts, no locking clause).

-- template: unsettled_side_effect
-- THE RECOVERY POLICY'S FIRST RULE, the one place it is written: an attempt
-- that ends (a failure, a retry on request, a durable wait, an expired
-- lease, a retry requested by an operator) with a side_effect call that has
-- an intent and no recorded response goes to needs_reconciliation: running
-- it again could repeat the call. The call's class is its ledger entry's
-- (ctx.tool's effect=; ctx.effect takes the task's), so a side_effect task
-- with only an open read_only or idempotent call is retried. A WHEN branch
-- of the CASE that sets the task's status (the task is t).
WHEN t.open_effects > 0 AND EXISTS (
    SELECT 1 FROM leaseq_effects e
    WHERE e.task_id = t.id AND e.status = 'pending' AND e.effect = 'side_effect')
    THEN 'needs_reconciliation'
