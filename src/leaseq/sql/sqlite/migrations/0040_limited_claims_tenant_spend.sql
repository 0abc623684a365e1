-- leaseq schema, version 40, SQLite: nothing to change. PostgreSQL records
-- the queues whose claims test limits and singleton keys
-- (leaseq_limited_claims, see its file) so that a queue of one tenant's
-- backlog without them runs a smaller one-key claim, claim_fair_one_plain;
-- SQLite's claim (claim_fair) tests a limit or a singleton key only for a
-- task that names one, and plans each statement once per connection.
SELECT 1;
