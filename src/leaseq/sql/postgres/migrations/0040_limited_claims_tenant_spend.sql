-- leaseq schema, version 40, PostgreSQL: the queues whose claims test limits
-- and singleton keys; the settled spend per tenant.
--
-- A queue of one tenant's backlog (one fairness key queued) is claimed by
-- claim_fair_one; where none of the queue's tasks names a limit or a
-- singleton key, none of that statement's steps for them (the claimable
-- test's probes of each, the limits judged, their slots taken) has anything
-- to do, and claim_fair_one_plain is that claim without them: a plan a
-- fraction of the size, to start at every call. It may claim from a queue
-- only while the queue has no row here: a row per queue a task naming a
-- limit or a singleton key was ever written to (inserted, or moved or
-- changed to name one), written by the trigger below in the writing
-- transaction, so a claim sees the row whenever it sees the task. As schema
-- 39's leaseq_full_claims, a row is never taken away (the safe side).

CREATE TABLE leaseq_limited_claims (
    queue text PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION leaseq_mark_limited_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- no lock once the row exists: concurrent enqueues of limited tasks never wait on each other
    INSERT INTO leaseq_limited_claims (queue) VALUES (NEW.queue) ON CONFLICT (queue) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER leaseq_tasks_limited_claim
    AFTER INSERT OR UPDATE OF queue, limits, singleton_key ON leaseq_tasks
    FOR EACH ROW
    WHEN (NEW.limits IS NOT NULL OR NEW.singleton_key IS NOT NULL)
    EXECUTE FUNCTION leaseq_mark_limited_claim();

INSERT INTO leaseq_limited_claims (queue)
SELECT DISTINCT queue FROM leaseq_tasks
WHERE limits IS NOT NULL OR singleton_key IS NOT NULL
ON CONFLICT (queue) DO NOTHING;

-- The usage settled by ctx.consume per limit key and UTC day (schema 31), now
-- also per tenant: the fairness key of the task that consumed ('' for a task
-- without one), so a team sees what each tenant spent (leaseq limits spend,
-- /metrics). The rows so far are no tenant's.
ALTER TABLE leaseq_limit_spend ADD COLUMN tenant text NOT NULL DEFAULT '';
ALTER TABLE leaseq_limit_spend DROP CONSTRAINT leaseq_limit_spend_pkey;
ALTER TABLE leaseq_limit_spend ADD PRIMARY KEY (key, day, tenant);
