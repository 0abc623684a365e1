-- leaseq schema, version 6, PostgreSQL: the maintenance leader.
--
-- Maintenance that must run once per database (the expired-lease sweep,
-- retention) runs on one `leaseq serve` replica at a time: the holder of
-- this row's lease. A replica takes the row when it is free or its lease has
-- run out, renews it well before its end, and gives it up when it stops. The
-- lease is judged by the database's clock, as task leases are. term counts
-- the changes of holder: a new leader always has a higher term than the one
-- it replaced. A lease row rather than a session advisory lock: it works on
-- SQLite as well, survives a transaction-mode pooler (which gives no session
-- to hold a lock in), and a replica that is frozen, not dead, loses it.

CREATE TABLE leaseq_leader (
    name       text PRIMARY KEY,                 -- what is led: 'maintenance'
    holder     text NOT NULL,                    -- the replica id of the leader
    term       bigint NOT NULL,
    elected_at timestamptz NOT NULL DEFAULT now(),
    renewed_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
