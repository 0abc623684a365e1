-- leaseq schema, version 24, SQLite: nothing to change. On PostgreSQL this
-- version sets autovacuum and fill factor for the tables every claim changes;
-- a SQLite file reuses the pages its deleted rows free without being told.
SELECT 1;
