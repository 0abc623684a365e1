-- leaseq schema, version 40, SQLite: the settled spend per tenant.
--
-- PostgreSQL also records the queues whose claims test limits and singleton
-- keys (leaseq_limited_claims, see its file) so that a queue of one tenant's
-- backlog without them runs a smaller one-key claim, claim_fair_one_plain;
-- SQLite's claim (claim_fair) tests a limit or a singleton key only for a
-- task that names one, and plans each statement once per connection.
--
-- The usage settled by ctx.consume per limit key and UTC day (schema 31), now
-- also per tenant: the fairness key of the task that consumed ('' for a task
-- without one). SQLite cannot change a primary key in place: the table is
-- made anew, its rows so far no tenant's.
CREATE TABLE leaseq_limit_spend_by_tenant (
    key    TEXT NOT NULL,
    day    DATE NOT NULL,  -- the ISO date, as text
    tenant TEXT NOT NULL DEFAULT '',
    units  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, day, tenant)
);
INSERT INTO leaseq_limit_spend_by_tenant (key, day, tenant, units)
SELECT key, day, '', units FROM leaseq_limit_spend;
DROP TABLE leaseq_limit_spend;
ALTER TABLE leaseq_limit_spend_by_tenant RENAME TO leaseq_limit_spend;
