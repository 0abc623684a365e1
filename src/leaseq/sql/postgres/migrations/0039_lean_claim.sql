-- leaseq schema, version 39, PostgreSQL: the queues whose claims need the full statement.
--
-- A claim of a queue whose tasks name no fairness key, no limit and no
-- singleton key needs none of claim_batch's steps for them; claim_plain is
-- that claim, a plan a fraction of claim_batch's. It may claim from a queue
-- only while the queue has no row here: a row per queue a task with such a
-- key was ever written to (inserted, or moved or changed to name one),
-- written by the trigger below in the writing transaction, so a claim sees
-- the row whenever it sees the task. A row is never taken away: a queue
-- that used keys once keeps the full claim (the safe side).

CREATE TABLE leaseq_full_claims (
    queue text PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION leaseq_mark_full_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- no lock once the row exists: concurrent enqueues of keyed tasks never wait on each other
    INSERT INTO leaseq_full_claims (queue) VALUES (NEW.queue) ON CONFLICT (queue) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER leaseq_tasks_full_claim
    AFTER INSERT OR UPDATE OF queue, fairness_key, limits, singleton_key ON leaseq_tasks
    FOR EACH ROW
    WHEN (NEW.fairness_key IS NOT NULL OR NEW.limits IS NOT NULL OR NEW.singleton_key IS NOT NULL)
    EXECUTE FUNCTION leaseq_mark_full_claim();

INSERT INTO leaseq_full_claims (queue)
SELECT DISTINCT queue FROM leaseq_tasks
WHERE fairness_key IS NOT NULL OR limits IS NOT NULL OR singleton_key IS NOT NULL
ON CONFLICT (queue) DO NOTHING;
