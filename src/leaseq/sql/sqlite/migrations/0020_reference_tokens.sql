-- leaseq schema, version 20, SQLite: the same table as PostgreSQL's (see its
-- 0020 for what it means). Times are epoch seconds.

CREATE TABLE leaseq_action_tokens (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    token_hash      TEXT NOT NULL CHECK (length(token_hash) = 64),
    effect_id       INTEGER NOT NULL REFERENCES leaseq_effects (id) ON DELETE CASCADE,
    task_id         INTEGER NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    generation      INTEGER NOT NULL,
    action          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    resource        TEXT,
    issued_at       REAL NOT NULL,
    expires_at      REAL NOT NULL
);
CREATE INDEX leaseq_action_tokens_task ON leaseq_action_tokens (task_id);
CREATE INDEX leaseq_action_tokens_effect ON leaseq_action_tokens (effect_id);
