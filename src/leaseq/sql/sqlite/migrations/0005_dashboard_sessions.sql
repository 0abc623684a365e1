-- leaseq schema, version 5, SQLite: dashboard sessions.
-- Same contract as the PostgreSQL migration; times are REAL Unix seconds.

CREATE TABLE leaseq_sessions (
    id_hash    TEXT PRIMARY KEY,
    token_id   TEXT NOT NULL REFERENCES leaseq_tokens (id),
    created_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    expires_at REAL NOT NULL
);
CREATE INDEX leaseq_sessions_token ON leaseq_sessions (token_id);
CREATE INDEX leaseq_sessions_expires ON leaseq_sessions (expires_at);
