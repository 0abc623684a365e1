-- leaseq schema, version 5, PostgreSQL: dashboard sessions.
--
-- A dashboard login makes a session of its own instead of keeping the API
-- token in the browser. The session id lives only in the browser's cookie;
-- the database keeps its SHA-256, so a copy of this table logs nobody in.
-- A session ends when it expires, at logout (its row is deleted) and when
-- the token it was made from is revoked (its rows are deleted with it).

CREATE TABLE leaseq_sessions (
    id_hash    text PRIMARY KEY,                 -- sha256 hex of the session id
    token_id   text NOT NULL REFERENCES leaseq_tokens (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX leaseq_sessions_token ON leaseq_sessions (token_id);
CREATE INDEX leaseq_sessions_expires ON leaseq_sessions (expires_at);
