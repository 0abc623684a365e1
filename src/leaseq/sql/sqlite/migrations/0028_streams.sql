-- leaseq schema, version 28, SQLite: task progress streams (see the PostgreSQL file).

CREATE TABLE leaseq_stream_items (
    task_id    INTEGER NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    type       TEXT NOT NULL CHECK (type IN ('reset', 'item')),
    item       TEXT,
    ledger_key TEXT,
    worker_id  TEXT,
    at         REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    PRIMARY KEY (task_id, seq)
);
