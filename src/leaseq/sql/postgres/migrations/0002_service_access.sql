-- leaseq schema, version 2, PostgreSQL: credentials and audit for the queue service.
--
-- A token is shown once when created; only the SHA-256 of the whole token is
-- kept (secret_hash). Workers remember the token that registered them, so
-- revoking a token revokes its workers and their leases stop renewing.

CREATE TABLE leaseq_tokens (
    id            text PRIMARY KEY,          -- public part of the token, safe to list and log
    name          text NOT NULL,
    role          text NOT NULL CHECK (role IN ('worker', 'viewer', 'operator', 'admin')),
    secret_hash   text NOT NULL,             -- sha256 hex of the full token; the token itself is never stored
    queues        text,                      -- comma-separated queues a worker token may use; NULL = any
    read_payloads boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now(),
    created_by    text,
    expires_at    timestamptz,
    revoked_at    timestamptz,
    revoked_by    text,
    last_used_at  timestamptz
);

ALTER TABLE leaseq_workers ADD COLUMN token_id text;
CREATE INDEX leaseq_workers_token ON leaseq_workers (token_id) WHERE token_id IS NOT NULL;

-- Who did what through the service: operator and admin actions, including
-- the ones that concern no task (tokens, pause, retention).
CREATE TABLE leaseq_audit (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor  text NOT NULL,
    action text NOT NULL,
    target text,
    detail jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX leaseq_audit_at ON leaseq_audit (at);
-- Retention scans finished tasks by age.
CREATE INDEX leaseq_tasks_finished ON leaseq_tasks (updated_at) WHERE status IN ('completed', 'cancelled');
