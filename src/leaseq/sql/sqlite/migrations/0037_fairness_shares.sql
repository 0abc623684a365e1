-- leaseq schema, version 37, SQLite: nothing to change. PostgreSQL splits
-- each fairness key's row in shares (see its file) so that claims on
-- different connections do not wait on each other; SQLite writes one
-- transaction at a time, and keeps one row per key (leaseq_fairness).
SELECT 1;
