-- leaseq schema, version 32, SQLite: code versions (see the PostgreSQL file).
-- compatible_versions is a JSON array of text.

ALTER TABLE leaseq_tasks ADD COLUMN code_version TEXT;
ALTER TABLE leaseq_workers ADD COLUMN code_version TEXT;
ALTER TABLE leaseq_workers ADD COLUMN compatible_versions TEXT;
