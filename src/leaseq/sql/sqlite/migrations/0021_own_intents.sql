-- leaseq schema, version 21, SQLite: the same column as PostgreSQL's (see its
-- 0021 for what it means).

ALTER TABLE leaseq_tokens ADD COLUMN own_intents INTEGER NOT NULL DEFAULT 0 CHECK (own_intents IN (0, 1));
