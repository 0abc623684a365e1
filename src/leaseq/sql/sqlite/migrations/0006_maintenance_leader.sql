-- leaseq schema, version 6, SQLite: the maintenance leader.
-- Same contract as the PostgreSQL migration; times are REAL Unix seconds.

CREATE TABLE leaseq_leader (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    term       INTEGER NOT NULL,
    elected_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    renewed_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    expires_at REAL NOT NULL
);
