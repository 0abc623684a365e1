-- leaseq schema, version 42, PostgreSQL: the lease epoch's cluster part, read
-- once per server session instead of at every claim.
--
-- A claim's epoch (schema 25) is the cluster's initdb time in seconds (the
-- high 32 bits of its system identifier) times 1,000,000, plus the WAL
-- timeline now inserted on. The system identifier is read from pg_control, a
-- file opened, read and checked at each read (about 15 us, at every claim).
-- It cannot change under a running server: a promoted standby keeps its
-- primary's, and a point-in-time restore, a dump restored into a new cluster
-- or an upgrade starts another server, whose sessions read it again. So this
-- function is declared IMMUTABLE: PostgreSQL evaluates it once, when it
-- plans the claim (each session's cached plan of each claim statement holds
-- the value), and never at execution. The timeline, which a promotion or a
-- restore changes under a running server, is still read at every claim.
-- No role can forge what a session caches: the value lives in the session's
-- plan of the claim's own function (owned by leaseq_owner, search_path
-- fixed), not in a setting or a table the caller could write; a worker role
-- may create no function here, and PostgreSQL never looks a function up in
-- pg_temp unless it is named there.
CREATE OR REPLACE FUNCTION leaseq_cluster_epoch() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ((pg_control_system()).system_identifier >> 32) * 1000000 $$;

REVOKE ALL ON FUNCTION leaseq_cluster_epoch() FROM PUBLIC;
