-- leaseq schema, version 39, SQLite: nothing to change. PostgreSQL records
-- the queues whose claims need the full statement (leaseq_full_claims, see
-- its file) so that the others run a smaller one, claim_plain; SQLite's
-- claim (claim_fair) reads none of the steps a queue without keys does not
-- use, and plans each statement once per connection.
SELECT 1;
