-- leaseq schema, version 25, PostgreSQL: every claim records the lease epoch
-- of the database history it was made in.
-- The epoch changes whenever the history may have been cut: a standby
-- promoted after a failover, a restore to a point in time (both start a new
-- WAL timeline), a dump restored into a new cluster (a new system
-- identifier). claim_batch writes it (the cluster's initdb time in seconds
-- times 1,000,000, plus the current WAL timeline); fences compare it before
-- the generation, so an attempt made before a failover orders below every
-- attempt made after it, even when the promoted standby never saw its claim
-- and handed out its generation again. An action token carries the epoch of
-- the claim it was minted under.
-- Claims made before this migration keep epoch 0: their fencing tokens keep
-- the form "<task>.<generation>" and still match their task rows.

ALTER TABLE leaseq_tasks ADD COLUMN claim_epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE leaseq_action_tokens ADD COLUMN claim_epoch bigint NOT NULL DEFAULT 0;
