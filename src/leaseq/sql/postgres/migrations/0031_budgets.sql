-- leaseq schema, version 31, PostgreSQL: budgets settled after the call.
--
-- WINDOWS. A limit may hold totals over fixed windows of the database's
-- clock (Unix time, so UTC days): per_minute, per_hour, per_day (NULL: no
-- such window). Each window counts what was taken in it (<w>_used) and which
-- window that was (<w>_window: the window's number, floor(epoch / length));
-- a count of an older window reads as 0. A claim takes its task's cost (its
-- units, or 1) in each window as it does from the rate bucket, and hands out
-- no task whose limit has a window already spent (used >= its total).
--
-- SETTLED USAGE. ctx.consume(limit, units) charges what a call actually
-- used, after the call, under the lease, recorded in the task's ledger (a
-- replayed attempt charges nothing twice). For a limit the task names, the
-- claim's reservation is drawn down first: leaseq_limit_charges holds, per
-- attempt and key, what the claim reserved and what was consumed, and the
-- statement that ends the lease credits the unused rest of the reservation
-- back to the bucket and to each window still the claim's (the row is then
-- deleted). What exceeds the reservation is charged when it is consumed.
-- leaseq_limit_spend: settled usage per key and UTC day.
--
-- BUDGETS. A task may carry a budget (budget: {key: units}) covering every
-- attempt; spent: {key: units} is what its attempts consumed. A consume that
-- takes spent past the budget ends the attempt cleanly and sends the task to
-- awaiting_approval; its request says why (reason 'budget') and the figures
-- (detail). Approving may raise the budget; the task resumes from its ledger.

ALTER TABLE leaseq_limits
    ADD COLUMN per_minute    bigint CHECK (per_minute > 0),
    ADD COLUMN per_hour      bigint CHECK (per_hour > 0),
    ADD COLUMN per_day       bigint CHECK (per_day > 0),
    ADD COLUMN minute_window bigint NOT NULL DEFAULT 0,
    ADD COLUMN minute_used   bigint NOT NULL DEFAULT 0,
    ADD COLUMN hour_window   bigint NOT NULL DEFAULT 0,
    ADD COLUMN hour_used     bigint NOT NULL DEFAULT 0,
    ADD COLUMN day_window    bigint NOT NULL DEFAULT 0,
    ADD COLUMN day_used      bigint NOT NULL DEFAULT 0;

ALTER TABLE leaseq_tasks
    ADD COLUMN budget jsonb,
    ADD COLUMN spent  jsonb;

CREATE TABLE leaseq_limit_charges (
    task_id    bigint NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    generation bigint NOT NULL,
    key        text NOT NULL,
    reserved   bigint NOT NULL,
    consumed   bigint NOT NULL,
    claimed_at timestamptz NOT NULL,
    PRIMARY KEY (task_id, generation, key)
);

CREATE TABLE leaseq_limit_spend (
    key   text NOT NULL,
    day   date NOT NULL,
    units bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (key, day)
);

ALTER TABLE leaseq_approvals
    ADD COLUMN reason text,
    ADD COLUMN detail jsonb;
