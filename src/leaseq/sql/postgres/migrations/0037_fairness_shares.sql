-- leaseq schema, version 37, PostgreSQL: the fairness keys' charges in shares.
--
-- Every claim under a fairness key charges the key (leaseq_fairness, schema
-- 33). With one row per key, every claim that served a key waited for the
-- claim before it to commit (its row lock, held through the commit's WAL
-- flush): claimers beside each other took turns, and a queue that used keys
-- drained at about 0.6 of the same queue without them. Now each key's row
-- is split in shares, one per claiming connection's share number (its
-- backend's process id modulo 64; a backend runs one transaction at a time),
-- and a key's virtual time is read as the sum of its shares:
--
--   base      where a claim started the key (a new key, or one back from
--             idle, starts level with the others) less the service it had
--             been charged then; the key's virtual time is the largest base
--             of its shares plus the service of all of them. NULL: no claim
--             on this connection started it (a claim that found another's
--             claim of the key's earlier tasks in flight, its rows skipped,
--             adds its service only: the start it read was behind them)
--   vstart    about the virtual time at which the key was last served (the
--             virtual start of the last task a claim handed out under it)
--   service   the sum of 1/weight of the tasks claimed under it
--   claimed   how many tasks were
--
-- Both are kept as a maximum (base, vstart) or a sum (service, claimed), so
-- two claims charge in either order with the same outcome, and claims on
-- different connections never wait on each other. leaseq_fairness is now a
-- view of the shares, one row per key, with the columns it had (vtime:
-- base plus service).

ALTER TABLE leaseq_fairness RENAME TO leaseq_fairness_shares;
ALTER TABLE leaseq_fairness_shares ADD COLUMN shard integer NOT NULL DEFAULT 0,
                                   ADD COLUMN base double precision;
UPDATE leaseq_fairness_shares SET base = vtime - service;
ALTER TABLE leaseq_fairness_shares ALTER COLUMN shard DROP DEFAULT, ALTER COLUMN vstart DROP NOT NULL,
                                   DROP COLUMN vtime;
ALTER TABLE leaseq_fairness_shares DROP CONSTRAINT leaseq_fairness_pkey;
ALTER TABLE leaseq_fairness_shares ADD CONSTRAINT leaseq_fairness_shares_pkey PRIMARY KEY (queue, priority, key, shard);
ALTER INDEX leaseq_fairness_vstart RENAME TO leaseq_fairness_shares_vstart;

CREATE VIEW leaseq_fairness AS
SELECT queue, priority, key, max(base) + sum(service) AS vtime, max(vstart) AS vstart, sum(service) AS service,
       sum(claimed)::bigint AS claimed, max(served_at) AS served_at
FROM leaseq_fairness_shares
GROUP BY queue, priority, key;
