-- leaseq schema, version 31, SQLite: budgets settled after the call (see the
-- PostgreSQL file). Windows are numbered by Unix time (UTC days); budget and
-- spent are JSON objects; a day of spend is its ISO date.

ALTER TABLE leaseq_limits ADD COLUMN per_minute INTEGER CHECK (per_minute > 0);
ALTER TABLE leaseq_limits ADD COLUMN per_hour INTEGER CHECK (per_hour > 0);
ALTER TABLE leaseq_limits ADD COLUMN per_day INTEGER CHECK (per_day > 0);
ALTER TABLE leaseq_limits ADD COLUMN minute_window INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leaseq_limits ADD COLUMN minute_used INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leaseq_limits ADD COLUMN hour_window INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leaseq_limits ADD COLUMN hour_used INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leaseq_limits ADD COLUMN day_window INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leaseq_limits ADD COLUMN day_used INTEGER NOT NULL DEFAULT 0;

ALTER TABLE leaseq_tasks ADD COLUMN budget TEXT;
ALTER TABLE leaseq_tasks ADD COLUMN spent TEXT;

CREATE TABLE leaseq_limit_charges (
    task_id    INTEGER NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    generation INTEGER NOT NULL,
    key        TEXT NOT NULL,
    reserved   INTEGER NOT NULL,
    consumed   INTEGER NOT NULL,
    claimed_at REAL NOT NULL,
    PRIMARY KEY (task_id, generation, key)
);

CREATE TABLE leaseq_limit_spend (
    key   TEXT NOT NULL,
    day   DATE NOT NULL,  -- the ISO date, as text
    units INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, day)
);

ALTER TABLE leaseq_approvals ADD COLUMN reason TEXT;
ALTER TABLE leaseq_approvals ADD COLUMN detail TEXT;
