-- leaseq schema, version 20, PostgreSQL: action tokens as references, checked online.
-- An action token is a random string held by the worker; the queue keeps only
-- its SHA-256 and its claims, written by mint_action_token under the lease
-- guard, in the transaction that began (or re-read) the effect entry. A
-- downstream service asks verify_action_token (the verifier group's only
-- function) whether a token is genuine and its attempt still holds a live
-- lease, so a cancelled, revoked or superseded attempt's token is refused at
-- once. Rows go with their task.

CREATE TABLE leaseq_action_tokens (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_hash      text NOT NULL CHECK (length(token_hash) = 64),
    effect_id       bigint NOT NULL REFERENCES leaseq_effects (id) ON DELETE CASCADE,
    task_id         bigint NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    generation      bigint NOT NULL,
    action          text NOT NULL,
    idempotency_key text NOT NULL,
    resource        text,
    issued_at       timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL
);
CREATE INDEX leaseq_action_tokens_task ON leaseq_action_tokens (task_id);
CREATE INDEX leaseq_action_tokens_effect ON leaseq_action_tokens (effect_id);

-- A verifier role (leaseq roles create verifier NAME) is a downstream service's:
-- it may call verify_action_token and nothing else.
ALTER TABLE leaseq_db_roles DROP CONSTRAINT leaseq_db_roles_kind_check;
ALTER TABLE leaseq_db_roles ADD CONSTRAINT leaseq_db_roles_kind_check
    CHECK (kind IN ('worker', 'operator', 'viewer', 'verifier'));
