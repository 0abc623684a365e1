-- leaseq schema, version 25, SQLite: the same columns as PostgreSQL's (see
-- its 0025). One SQLite file has one history (a copy restored from a backup
-- is the operator's to keep apart): every claim's epoch stays 0.

ALTER TABLE leaseq_tasks ADD COLUMN claim_epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leaseq_action_tokens ADD COLUMN claim_epoch INTEGER NOT NULL DEFAULT 0;
