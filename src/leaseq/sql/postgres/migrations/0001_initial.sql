-- leaseq schema, version 1, PostgreSQL.
-- Lifecycle (status), current authority (lease_owner, lease_expires_at,
-- claim_generation) and action identity (idempotency_key) are separate
-- columns on purpose: they change for different reasons.

CREATE TABLE leaseq_workers (
    id            text PRIMARY KEY,          -- issued by the queue, never chosen by the worker
    name          text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at    timestamptz
);

CREATE TABLE leaseq_queues (
    name       text PRIMARY KEY,
    paused     boolean NOT NULL DEFAULT false,
    changed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    changed_by text
);

CREATE TABLE leaseq_tasks (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue                 text NOT NULL,
    kind                  text NOT NULL,
    payload               jsonb NOT NULL DEFAULT 'null',
    effect                text NOT NULL CHECK (effect IN ('read_only', 'idempotent', 'side_effect')),
    status                text NOT NULL DEFAULT 'queued' CHECK (status IN
                          ('queued', 'running', 'completed', 'cancelled', 'dead', 'needs_reconciliation', 'blocked')),
    priority              integer NOT NULL DEFAULT 0,
    available_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    lease_owner           text,
    lease_expires_at      timestamptz,
    lease_seconds         double precision NOT NULL CHECK (lease_seconds > 0),
    claim_generation      bigint NOT NULL DEFAULT 0,
    claimed_at            timestamptz,
    heartbeat_count       integer NOT NULL DEFAULT 0,
    last_heartbeat_at     timestamptz,
    longest_heartbeat_gap double precision NOT NULL DEFAULT 0,
    idempotency_key       text NOT NULL,
    attempts              integer NOT NULL DEFAULT 0,
    max_attempts          integer NOT NULL CHECK (max_attempts > 0),
    open_effects          integer NOT NULL DEFAULT 0,
    error_fingerprint     text,
    error_streak          integer NOT NULL DEFAULT 0,
    last_error            text,
    result                jsonb,
    CONSTRAINT leaseq_tasks_queue_key UNIQUE (queue, idempotency_key),
    -- a running task always has an owner and a deadline; nothing else has either
    CONSTRAINT leaseq_tasks_lease_shape CHECK ((status = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL))
);

-- The claimable set, in claim order. Partial: finished tasks never enter it.
CREATE INDEX leaseq_tasks_claimable ON leaseq_tasks (queue, priority DESC, available_at, id)
    WHERE status = 'queued';
-- Running leases by deadline, for routing expired ones.
CREATE INDEX leaseq_tasks_leases ON leaseq_tasks (lease_expires_at) WHERE status = 'running';
CREATE INDEX leaseq_tasks_owner ON leaseq_tasks (lease_owner) WHERE status = 'running';
CREATE INDEX leaseq_tasks_status ON leaseq_tasks (status, queue);

CREATE TABLE leaseq_effects (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    generation      bigint NOT NULL,
    worker_id       text,
    action          text NOT NULL,
    idempotency_key text NOT NULL,
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'reconciled')),
    intent_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    response        jsonb,
    response_at     timestamptz,
    CONSTRAINT leaseq_effects_task_key UNIQUE (task_id, idempotency_key)
);

CREATE TABLE leaseq_events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id    bigint NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    type       text NOT NULL,
    generation bigint,
    worker_id  text,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    detail     jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX leaseq_events_task ON leaseq_events (task_id, id);
