-- leaseq schema, version 15, PostgreSQL: authority in the database.
-- Each worker identity records the database role that registered it: a
-- worker role may act only as the identities it registered (the functions
-- of leaseq.store.functions check it). leaseq_db_roles records the login
-- roles `leaseq roles create` made, each with its kind and, for a scoped
-- role, the queues it may reach.

ALTER TABLE leaseq_workers ADD COLUMN db_role text DEFAULT session_user;

CREATE TABLE leaseq_db_roles (
    role       text PRIMARY KEY,
    kind       text NOT NULL CHECK (kind IN ('worker', 'operator', 'viewer')),
    queues     text[],
    created_by text NOT NULL DEFAULT session_user,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
