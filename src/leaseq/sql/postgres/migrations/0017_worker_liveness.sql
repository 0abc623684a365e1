-- leaseq schema, version 17, PostgreSQL: workers announce what they serve, and
-- say they are alive.
-- A worker records at registration the renewal interval it heartbeats at and
-- the lease length after which a silent worker counts as lost; its runtime
-- then writes last_heartbeat_at every interval, and stopped_at with the
-- reason when it exits cleanly. A worker's state (alive, late, lost, stopped,
-- revoked) is computed from these at read time by the database's clock
-- (leaseq.core.model.worker_state), never by a sweep.
-- leaseq_worker_kinds holds the kinds each registration serves with their
-- declared options: the effect, the actions and the payload signature (see
-- leaseq.signature.describe), read by the CLI and the service to check an
-- enqueue before anything is written.

ALTER TABLE leaseq_workers
    ADD COLUMN last_heartbeat_at timestamptz,
    ADD COLUMN heartbeat_seconds double precision CHECK (heartbeat_seconds > 0),
    ADD COLUMN lease_seconds     double precision CHECK (lease_seconds > 0),
    ADD COLUMN stopped_at        timestamptz,
    ADD COLUMN stop_reason       text;

CREATE TABLE leaseq_worker_kinds (
    worker_id text NOT NULL REFERENCES leaseq_workers (id) ON DELETE CASCADE,
    kind      text NOT NULL,
    queue     text NOT NULL,
    effect    text NOT NULL CHECK (effect IN ('read_only', 'idempotent', 'side_effect')),
    actions   jsonb,
    signature jsonb,
    PRIMARY KEY (worker_id, kind)
);
CREATE INDEX leaseq_worker_kinds_kind ON leaseq_worker_kinds (kind);
