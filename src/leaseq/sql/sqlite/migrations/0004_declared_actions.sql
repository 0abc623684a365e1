-- leaseq schema, version 4, SQLite: the actions a task may take (see the
-- PostgreSQL file). actions holds a JSON array as text, or NULL.

ALTER TABLE leaseq_tasks ADD COLUMN actions TEXT;
