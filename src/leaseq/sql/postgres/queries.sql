-- leaseq named queries, PostgreSQL (psycopg 3, %(name)s parameters).
--
-- Every query is one block headed "-- name: <query>". The SQLite file holds
-- the same names with the same parameters; tests/unit/test_queries.py keeps
-- the two in step. A block's leading comment may carry annotations, read by
-- the loader (leaseq/store/queries.py) and by that test:
--
--   -- guard: lease            writes (or locks for a write) on the strength of
--                              a lease: expands the lease guard below
--   -- guard: none -- <why>    takes a worker id, is not lease-backed, says why
--   -- plan: generic           prepared, and always run with its generic plan
--   -- plan: generic up to <n> <array parameter>
--                              generic while the array names at most n
--                              elements, else planned for its values then
--   -- no-op: <why>            nothing to run on this backend
--   -- unused: <params> -- <why>  parameters this dialect does not need
--
-- A query that takes a worker id without a guard annotation fails the test,
-- and so does a "guard: lease" query whose expanded text lacks the guard.
--
-- "plan: generic": the statements every claim and completion runs are
-- prepared on their first use on a connection and always run with the
-- prepared statement's generic plan (plan_cache_mode = force_generic_plan on
-- leaseq's pooled connections): PostgreSQL would otherwise plan the claim
-- afresh at every call, which costs more than running it. Each is written to
-- have one good plan whatever its parameters (tests/bench/test_claim_plan.py
-- reads their generic plans). The setting holds for every statement sent
-- with parameters, prepared or not: an unprepared one is planned generically
-- too.
--
-- Time is always the database's (now(), or clock_timestamp() where the
-- moment of judgement matters): a worker's clock is never consulted.

-- template: lease_guard(generation=%(generation)s)
-- THE LEASE GUARD, the one place it is written. Every write made on the
-- strength of a lease expands it (/* TEMPLATE: lease_guard */): the task is
-- running, held by this worker, under this generation (a batch statement
-- passes the generation column of its (task, generation) pairs), and its
-- lease is live by the database's clock. Zero rows back means the caller
-- has lost the lease; nothing was changed.
-- The clock is clock_timestamp(), read as each row is judged, not now() (the
-- start of the transaction): a long statement that began before the deadline
-- (a renewal of a thousand leases) must not renew a lease after a completion
-- that began later was refused for it, so that a refusal stays final.
AND t.status = 'running'
AND t.lease_owner = %(worker_id)s
AND t.claim_generation = {generation}
AND t.lease_expires_at >= clock_timestamp()

-- template: give_back_slots(ended=ended)
-- LIMITS: THE SLOTS GIVEN BACK, the one place it is written: the limit slots
-- the rows of {ended} (a CTE with the ended tasks' id, claim_generation,
-- limits and units) held, as the CTEs that follow it in a WITH: settled (the
-- reservations of the ended attempts that settled their usage), freed (per
-- key), held (the limit rows, locked in key order, as claim_batch locks
-- them) and released (the keys whose count of running leases came down).
-- BUDGETS (schema 31): an attempt that consumed (ctx.consume) against a
-- limit it names drew its claim's reservation down; what it left unused
-- comes back here, to the bucket and to each window still the claim's.
-- Where no ended lease names a limit (the common case), neither write runs:
-- the EXISTS names no row of the write, so it is judged once, before the
-- first row is read, and the steps under it (the charges' join, freed's
-- keys, the limit rows) are never started.
settled AS (
    DELETE FROM leaseq_limit_charges c
    USING {ended} e
    WHERE e.limits IS NOT NULL AND c.task_id = e.id AND c.generation = e.claim_generation
      AND EXISTS (SELECT 1 FROM {ended} x WHERE x.limits IS NOT NULL)
    RETURNING c.key, greatest(0, c.reserved - c.consumed) AS credit, extract(epoch FROM c.claimed_at) AS claimed
), freed AS (
    SELECT k.key, count(*) AS tasks, sum(e.units) AS units
    FROM {ended} e CROSS JOIN LATERAL unnest(e.limits) AS k(key)
    GROUP BY k.key
), held AS (
    SELECT l.key FROM leaseq_limits l WHERE l.key IN (SELECT key FROM freed) ORDER BY l.key FOR UPDATE
), released AS (
    UPDATE leaseq_limits l
    SET running = greatest(0, l.running - CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END),
        tokens = l.tokens + CASE WHEN l.per_second IS NULL THEN 0
                                 ELSE coalesce((SELECT sum(s.credit) FROM settled s WHERE s.key = l.key), 0) END,
        minute_used = greatest(0, l.minute_used - coalesce((SELECT sum(s.credit) FROM settled s
                                   WHERE s.key = l.key AND floor(s.claimed / 60) = l.minute_window), 0)),
        hour_used = greatest(0, l.hour_used - coalesce((SELECT sum(s.credit) FROM settled s
                                 WHERE s.key = l.key AND floor(s.claimed / 3600) = l.hour_window), 0)),
        day_used = greatest(0, l.day_used - coalesce((SELECT sum(s.credit) FROM settled s
                               WHERE s.key = l.key AND floor(s.claimed / 86400) = l.day_window), 0))
    FROM freed f
    WHERE l.key = f.key AND l.key IN (SELECT key FROM held)
      AND EXISTS (SELECT 1 FROM {ended} x WHERE x.limits IS NOT NULL)
    RETURNING l.key
)

-- template: claimable_plain
-- THE CLAIMABLE TEST, the one place it is written: what a queued task of the
-- claim's queue, due now, must pass to be handed out, whatever the queue
-- uses: the task's own tests (claimable_row), and the claim's, the same for
-- every task it reads (claimable_now). claim_plain reads its candidates with
-- it alone (a task of its candidates names no singleton key and no limit);
-- claimable adds the tests of those. The task is the unaliased leaseq_tasks
-- of the read that expands it.
/* TEMPLATE: claimable_row */
/* TEMPLATE: claimable_now */

-- template: claimable_row
-- THE CLAIMABLE TEST, the task's own part (claimable_plain): its kind, its
-- deadline, its code version, a late approval. Alone only where the claim's
-- part was passed already by the same statement: claim_fair_one_plain's
-- look-up of its key's first task (fair_one_chosen), made only for a task
-- its own read (with the whole test) handed out.
AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))  -- only kinds the worker can run
AND (deadline_at IS NULL OR deadline_at > now())  -- never started past its deadline (the sweep expires it)
-- CODE VERSIONS (schema 32): a task started under a version of the code
-- this worker does not serve is left to a worker that does (its ledger
-- was written by that code); one not started yet (NULL) goes to any
-- worker, and a worker that declared no versions serves any task. The
-- worker's row is read once per claim (a plan's init step), not per row.
AND (code_version IS NULL OR (SELECT w.compatible_versions IS NULL FROM worker w)
     OR code_version = ANY((SELECT w.compatible_versions FROM worker w)::text[]))
-- never one approved at or after its approval deadline (see late_approvals): the set
-- is read once per claim, from leaseq_approvals_late, which holds no row unless such
-- a decision was written (a per-row probe could be planned as a scan of every request)
AND id <> ALL (ARRAY(SELECT a.task_id FROM leaseq_approvals a
                     WHERE a.decision = 'approved' AND a.decided_at >= a.deadline_at))

-- template: claimable_now
-- THE CLAIMABLE TEST, the claim's part (claimable_plain): the queue not
-- paused, the worker not revoked, nothing to route first; the same for
-- every task a statement reads (its snapshot, its flags).
AND NOT EXISTS (SELECT 1 FROM leaseq_queues q WHERE q.name = %(queue)s AND q.paused)
AND (SELECT f.worker_ok AND NOT f.routing_due FROM flags f)

-- template: claimable
-- THE CLAIMABLE TEST of a full claim: claimable_plain, and the tests of a
-- task's singleton key and limits. claim_batch reads its candidates with it:
-- the tasks without a fairness key, and, when the queue uses fairness keys,
-- each key's tasks.
/* TEMPLATE: claimable_plain */
-- SINGLETONS: a task with a singleton key only when no other task with
-- its key is running or in a durable wait (a sleep, a signal wait) and no
-- older one is queued (one waits behind the running one, and a retried
-- one keeps its turn). A claimer that read
-- the older one as queued or running passes over this one; one that
-- read it ended sees this one as the only candidate: never two running.
AND (singleton_key IS NULL OR NOT EXISTS (
    SELECT 1 FROM leaseq_tasks o
    WHERE o.queue = leaseq_tasks.queue AND o.singleton_key = leaseq_tasks.singleton_key
      AND o.id <> leaseq_tasks.id
      AND o.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')  -- leaseq_tasks_singleton
      AND (o.status IN ('running', 'waiting') OR (o.status = 'queued' AND o.id < leaseq_tasks.id))))
-- LIMITS: pass over a task one of whose limits has no room for it (a
-- read without locks, so a full limit does not stop the tasks behind
-- it; the exact judgement is "refused" below)
AND (limits IS NULL OR NOT EXISTS (
    SELECT 1 FROM leaseq_limits l
    WHERE l.key = ANY(limits)
      AND ((l.max_running IS NOT NULL AND l.running > 0
            AND l.running + CASE WHEN l.counts = 'units' THEN units ELSE 1 END > l.max_running)
           OR least(l.burst, l.tokens + extract(epoch FROM now() - l.refilled_at)::float8 * l.per_second)
              < least(l.burst, CASE WHEN l.counts = 'units' THEN units ELSE 1 END) - 1e-9
           -- WINDOWS (schema 31): a window of this one already spent
           OR l.minute_used >= l.per_minute AND l.minute_window = floor(extract(epoch FROM now()) / 60)
           OR l.hour_used >= l.per_hour AND l.hour_window = floor(extract(epoch FROM now()) / 3600)
           OR l.day_used >= l.per_day AND l.day_window = floor(extract(epoch FROM now()) / 86400))))

-- template: claimable_unlimited
-- THE CLAIMABLE TEST of a claim of a queue none of whose tasks ever named a
-- limit or a singleton key (claim_fair_one_plain): claimable_plain, and the
-- task names neither (unlimited_row). Which queues those are is
-- leaseq_limited_claims (schema 40, a row per queue such a task was ever
-- written to, by a trigger in the writing transaction), read by the claim's
-- flags (limited_due) in the statement's snapshot, with the tasks: a row
-- there, and no task passes. A task that names one committed after the
-- snapshot is not seen; a row changed to name one since is judged again as
-- it now is (FOR UPDATE), and passed over.
AND (SELECT NOT f.limited_due FROM flags f)
/* TEMPLATE: unlimited_row */
/* TEMPLATE: claimable_now */

-- template: unlimited_row
-- claimable_unlimited, the task's own part: it names no limit and no
-- singleton key, and passes claimable_row.
AND limits IS NULL AND singleton_key IS NULL
/* TEMPLATE: claimable_row */

-- template: charge_fair_share(served=served)
-- FAIR SHARE: THE CHARGE, the one place it is written. {served}: one row
-- (key, priority, base, vstart, cost) per task a claim handed out under a
-- fairness key ('': the tasks without one): base, the start the claim gave
-- its key at the task's priority less the service the key had been charged
-- then (as the claim read it); vstart, the task's virtual start (its virtual
-- finish less its cost); cost, 1/weight. Each key is charged in its share
-- for this connection (schema 37: its backend's process id modulo 64, and a
-- backend runs one transaction at a time): the largest base and vstart, the
-- sum of the costs and the count. A key's virtual time is the largest base
-- of its shares plus the service of all of them (the view leaseq_fairness),
-- so claims on different connections charge a key without waiting on each
-- other, and in either order with the same outcome: a claim beside this one
-- that claimed the key's earlier tasks adds its service, and this claim's
-- tasks were placed after those (their rows were read, and skipped, here).
INSERT INTO leaseq_fairness_shares AS s (queue, priority, key, shard, base, vstart, service, claimed, served_at)
SELECT %(queue)s, x.priority, x.key, mod(pg_backend_pid(), 64), max(x.base),
       max(x.origin) + sum(x.cost) - avg(x.cost), sum(x.cost), count(*), now()
FROM {served}
GROUP BY x.priority, x.key
ORDER BY x.priority, x.key
ON CONFLICT (queue, priority, key, shard) DO UPDATE
SET base = greatest(s.base, excluded.base),
    vstart = greatest(s.vstart, excluded.vstart),
    service = s.service + excluded.service,
    claimed = s.claimed + excluded.claimed,
    served_at = excluded.served_at

-- template: claim_head(flag=(SELECT k.fairness_key FROM leaseq_tasks k WHERE k.status = 'queued' AND k.queue = %(queue)s AND k.fairness_key IS NOT NULL ORDER BY k.fairness_key DESC LIMIT 1) AS last_key)
-- THE CLAIM'S FIRST STEPS, shared by claim_plain, claim_batch and
-- claim_fair: the worker's row read FOR SHARE, an expired lease of this
-- queue awaiting routing (BY QUEUE: the claim routes its own queue's leases
-- and sleepers only; another queue's are its own claims' or the sweep's to
-- route), the claim's flags: worker_ok, routing_due and {flag}, the
-- statement's own. By default last_key, the full claims' (FAIR SHARE: the
-- last fairness key with a task queued here, NULL when none is: a probe of
-- leaseq_tasks_fair, which holds no entry in a queue without keys; NULL:
-- none, and the claim reads as it always did. From the end: its first
-- entries are those of tasks claimed since the last vacuum); claim_plain's
-- is full_due.
worker AS (
    SELECT w.id, w.code_version, w.compatible_versions FROM leaseq_workers w
    WHERE w.id = %(worker_id)s AND w.revoked_at IS NULL
    FOR SHARE
), due AS (
    SELECT id FROM leaseq_tasks
    WHERE status = 'running' AND queue = %(queue)s AND lease_expires_at < now()
    ORDER BY lease_expires_at  -- read from the leases index (schema 41: by queue), never by scanning every running task
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), flags AS (
    -- a waiting task of this queue whose wake time has come (a sleep's end) is
    -- routed as an expired lease is: a probe of the wake index (timed waits only, by queue)
    SELECT w.worker_ok, %(route_first)s AND w.worker_ok
           AND (EXISTS (SELECT 1 FROM due)
                OR EXISTS (SELECT 1 FROM leaseq_tasks s
                           WHERE s.status = 'waiting' AND s.queue = %(queue)s AND s.wake_at <= now()))
           AS routing_due,
           {flag}
    FROM (SELECT EXISTS (SELECT 1 FROM worker) AS worker_ok) w
)

-- template: claim_lease
-- THE CLAIM'S LEASES, shared by claim_batch and claim_fair: the candidates'
-- limits judged (LIMITS), the candidates leased, their limit slots and
-- tokens taken, and each claim's "claimed" event written. The query that
-- expands it names the CTE "candidate" (id, limits, units, priority,
-- available_at, tag: the virtual finish, NULL for a claim in FIFO order).
-- (a candidate naming no limit is never judged: the claim of tasks without
-- limits runs none of the limits' steps)
/* TEMPLATE: claim_limits */,
/* TEMPLATE: claim_leased(SELECT c.id FROM candidate c WHERE c.limits IS NULL OR c.id NOT IN (SELECT r.id FROM refused r)) */,
/* TEMPLATE: claim_taken */

-- template: claim_limits
-- LIMITS: THE CANDIDATES' LIMITS JUDGED (held, demand, refused), for claim_lease.
held AS (
    -- LIMITS: the rows of the candidates' limits, locked in key order (every
    -- statement that changes them locks them in this order: no deadlock),
    -- each read as last committed, so concurrent claims never overshoot.
    -- tokens: the rate bucket refilled to now by the database clock.
    SELECT l.key, l.max_running, l.running, l.counts, l.per_second, l.burst,
           least(l.burst, l.tokens + extract(epoch FROM now() - l.refilled_at)::float8 * l.per_second) AS tokens,
           -- WINDOWS: each total, and what its window holds now (an older window's count is 0)
           l.per_minute, CASE WHEN l.minute_window = floor(extract(epoch FROM now()) / 60) THEN l.minute_used ELSE 0 END AS minute_used,
           l.per_hour, CASE WHEN l.hour_window = floor(extract(epoch FROM now()) / 3600) THEN l.hour_used ELSE 0 END AS hour_used,
           l.per_day, CASE WHEN l.day_window = floor(extract(epoch FROM now()) / 86400) THEN l.day_used ELSE 0 END AS day_used
    FROM leaseq_limits l
    WHERE l.key IN (SELECT unnest(c.limits) FROM candidate c)
    ORDER BY l.key
    FOR UPDATE
), demand AS (
    -- each (candidate, limit) pair: its cost, and the limit's demand up to
    -- and including it in claim order
    SELECT c.id, h.key, h.running, h.max_running, h.per_second, h.burst, h.tokens, x.cost,
           h.per_minute, h.minute_used, h.per_hour, h.hour_used, h.per_day, h.day_used,
           sum(x.cost) OVER (PARTITION BY h.key ORDER BY c.priority DESC, c.tag, c.available_at, c.id) AS upto
    FROM candidate c
    CROSS JOIN LATERAL unnest(c.limits) AS k(key)
    JOIN held h ON h.key = k.key
    CROSS JOIN LATERAL (SELECT CASE WHEN h.counts = 'units' THEN c.units ELSE 1 END AS cost) x
), refused AS (
    -- a candidate no limit it names has room for: at max_running (a task
    -- larger than the limit runs alone), or the bucket short of its cost (a
    -- task larger than the bucket takes it full). Demand counts candidates
    -- refused for another limit too: a batch may take fewer, never more.
    SELECT d.id FROM demand d
    WHERE NOT (d.max_running IS NULL OR d.running + d.upto <= d.max_running OR (d.running = 0 AND d.upto = d.cost))
       OR NOT (d.per_second IS NULL OR d.upto <= d.tokens + 1e-9 OR (d.tokens >= d.burst AND d.upto = d.cost))
       -- WINDOWS: a window spent before this candidate's turn (the last one admitted may
       -- take it past its total by one task's cost, never more)
       OR d.minute_used + d.upto - d.cost >= d.per_minute OR d.hour_used + d.upto - d.cost >= d.per_hour
       OR d.day_used + d.upto - d.cost >= d.per_day
)

-- template: claim_leased(picked=SELECT c.id FROM candidate c)
-- THE LEASES TAKEN, the one place a claim writes them: the tasks {picked}
-- names (claim_plain: every candidate; claim_lease: those no limit refused)
-- leased (claimed), and each one's "claimed" event written (logged).
claimed AS (
    UPDATE leaseq_tasks t
    SET status = 'running',
        lease_owner = %(worker_id)s,
        -- what the claim asked for, never more than the task's own: a worker cannot grant itself a longer lease
        lease_expires_at = now() + least(coalesce(%(lease_seconds)s::float8, t.lease_seconds), t.lease_seconds) * interval '1 second',
        claim_generation = t.claim_generation + 1,
        -- THE LEASE EPOCH, the one place it is read: the database history this
        -- claim is made in. The cluster's initdb time in seconds (the high 32
        -- bits of its system identifier: a dump restored into a new cluster
        -- gets a later one) times 1,000,000 (leaseq_cluster_epoch(), schema
        -- 42: read once per server session, when the session plans this
        -- statement, as no running server's system identifier changes), plus
        -- the WAL timeline now inserted on (a promotion or a point-in-time
        -- restore starts a higher one, readable at once, unlike
        -- pg_control_checkpoint's), read at every claim. Fences compare it
        -- before the generation (schema 25). Read once per statement (an init
        -- plan), and only when a row is claimed.
        claim_epoch = (SELECT leaseq_cluster_epoch()
                              + ('x' || left(pg_walfile_name(pg_current_wal_insert_lsn()), 8))::bit(32)::bigint),
        attempts = t.attempts + 1,
        -- CODE VERSIONS: the first claim stamps the version the task starts under; later ones keep it
        code_version = coalesce(t.code_version, (SELECT w.code_version FROM worker w)),
        claimed_at = now(),
        heartbeat_count = 0,
        last_heartbeat_at = NULL,
        longest_heartbeat_gap = 0,
        updated_at = now()
    -- = ANY(ARRAY(...)) keeps the update on the primary key whatever LIMIT
    -- the planner assumes, so the prepared statement's generic plan is good
    -- and PostgreSQL can stop planning the claim at every call
    WHERE t.id = ANY(ARRAY({picked}))
    -- the lease this claim was given, as the renewal derives it (deadline minus when it was set)
    RETURNING t.*, extract(epoch FROM t.lease_expires_at - t.claimed_at)::float8 AS lease_granted
), logged AS (
    INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
    SELECT c.id, 'claimed', c.claim_generation, %(worker_id)s,
           CASE WHEN %(compact)s THEN '{}'::jsonb
                ELSE jsonb_build_object('attempt', c.attempts,
                                        'lease_seconds', c.lease_granted,
                                        'lease_expires_at', c.lease_expires_at) END
    FROM claimed c
)

-- template: claim_taken
-- LIMITS: the claimed tasks take their slots and tokens (rows held by claim_limits)
taken AS (
    -- LIMITS: the claimed tasks take their slots and tokens (rows held above)
    UPDATE leaseq_limits l
    SET running = h.running + u.cost,
        tokens = coalesce(h.tokens - u.cost, l.tokens),
        refilled_at = CASE WHEN h.per_second IS NULL THEN l.refilled_at ELSE now() END,
        -- WINDOWS: the cost counts in each window this limit has (in the window of now)
        minute_used = CASE WHEN h.per_minute IS NULL THEN l.minute_used ELSE h.minute_used + u.cost END,
        minute_window = CASE WHEN h.per_minute IS NULL THEN l.minute_window ELSE floor(extract(epoch FROM now()) / 60) END,
        hour_used = CASE WHEN h.per_hour IS NULL THEN l.hour_used ELSE h.hour_used + u.cost END,
        hour_window = CASE WHEN h.per_hour IS NULL THEN l.hour_window ELSE floor(extract(epoch FROM now()) / 3600) END,
        day_used = CASE WHEN h.per_day IS NULL THEN l.day_used ELSE h.day_used + u.cost END,
        day_window = CASE WHEN h.per_day IS NULL THEN l.day_window ELSE floor(extract(epoch FROM now()) / 86400) END
    FROM (SELECT d.key, sum(d.cost) AS cost FROM demand d WHERE d.id IN (SELECT id FROM claimed) GROUP BY d.key) u
    JOIN held h ON h.key = u.key
    WHERE l.key = u.key
      AND EXISTS (SELECT 1 FROM claimed c WHERE c.limits IS NOT NULL)  -- else nothing to take, nothing run
)

-- template: claim_limit_wait
-- LIMITS: when nothing was claimed, seconds until the emptiest rate bucket
-- holds a token (NULL: none is empty), so a worker refused by a rate does
-- not poll blindly; not read at all when a task was claimed.
CASE WHEN c.id IS NULL THEN (SELECT min((1 - least(l.burst, l.tokens + extract(epoch FROM now() - l.refilled_at)::float8 * l.per_second))
                   / l.per_second)
        FROM leaseq_limits l
        WHERE l.per_second IS NOT NULL
          AND l.tokens + extract(epoch FROM now() - l.refilled_at)::float8 * l.per_second < 1) END AS limit_wait

-- template: fair_mode(others=(SELECT count(*) FROM fair_keys g WHERE g.key IS NOT NULL) = 1)
-- FAIR SHARE: ONE KEY ALONE (fair_alone), as the CTE claim_fair and
-- claim_fair_one read it
fair_mode AS MATERIALIZED (
    SELECT
    /* TEMPLATE: fair_alone({others}) */
)

-- template: fair_alone(others=(SELECT count(*) FROM fair_keys g WHERE g.key IS NOT NULL) = 1)
-- FAIR SHARE: ONE KEY ALONE, the one place it is written (one_key), for
-- claim_fair and claim_fair_one (fair_mode) and claim_fair_one_plain (its
-- flags): {others} (no key queued but flags' last_key), and no task without
-- a key ready (one tenant's backlog): the fair order is then that key's own
-- claim order, and fair_one claims it as the plain claim reads its index,
-- none of the steps that weigh keys against each other reading a row
{others}
-- (a probe of the claimable index in its order: an EXISTS may be planned as a scan)
AND (SELECT n.id FROM leaseq_tasks n
     WHERE n.status = 'queued' AND n.queue = %(queue)s AND n.fairness_key IS NULL AND n.available_at <= now()
     ORDER BY n.priority DESC, n.available_at, n.id LIMIT 1) IS NULL AS one_key

-- template: fair_one_flags
-- FAIR SHARE: claim_fair_one_plain's flags (claim_head's {flag}): last_key
-- (claim_head's own probe), limited_due (a row of leaseq_limited_claims,
-- schema 40) and one_key (fair_alone: no key queued before last_key, the
-- probe of claim_fair_one's fair_mode, here made from last_key's own probe,
-- as the flags cannot read a column of their own), all read in the claim's
-- first step, so the claim has no step of its own to decide what it claims
(SELECT k.fairness_key FROM leaseq_tasks k WHERE k.status = 'queued' AND k.queue = %(queue)s AND k.fairness_key IS NOT NULL ORDER BY k.fairness_key DESC LIMIT 1) AS last_key,
EXISTS (SELECT 1 FROM leaseq_limited_claims l WHERE l.queue = %(queue)s) AS limited_due,
/* TEMPLATE: fair_alone((SELECT k.fairness_key FROM leaseq_tasks k WHERE k.status = 'queued' AND k.queue = %(queue)s AND k.fairness_key < (SELECT k.fairness_key FROM leaseq_tasks k WHERE k.status = 'queued' AND k.queue = %(queue)s AND k.fairness_key IS NOT NULL ORDER BY k.fairness_key DESC LIMIT 1) ORDER BY k.fairness_key DESC LIMIT 1) IS NULL) */

-- template: fair_one(test=/* TEMPLATE: claimable */)
-- FAIR SHARE: the claim where one key alone is queued (fair_mode): its
-- tasks read from its index in claim order and locked as they are
-- reached, as the plain claim reads its own (a claim beside this one
-- skips them and takes the next), only as far as the claim needs. {test}:
-- the claimable test (claim_fair_one_plain's: claimable_unlimited)
fair_one AS (
    SELECT id, limits, units, priority, available_at, fairness_key AS key,
           1.0::float8 / coalesce(fairness_weight, 1) AS cost
    FROM leaseq_tasks
    WHERE status = 'queued' AND queue = %(queue)s AND fairness_key = (SELECT f.last_key FROM flags f)
      AND available_at <= now() AND (SELECT m.one_key FROM fair_mode m)
      {test}
    ORDER BY priority DESC, available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)

-- template: fair_start(keys=SELECT key, priority, cost FROM fair_one)
-- FAIR SHARE: THE KEYS' STARTS, shared by claim_fair and claim_fair_one.
fair_start AS MATERIALIZED (  -- once per key, not per task
    -- FAIR SHARE: where each key's virtual time starts, at each priority: its
    -- own, but never more than one task's cost behind the priority's (the
    -- latest virtual time at which a task of it was served): a key new, or
    -- back from idle, starts level with the others and is owed nothing, and
    -- a key waiting its turn never falls that far behind (the others' tasks
    -- served before it all started before its turn)
    -- (its own: the largest base of its shares plus the service of all of
    -- them, schema 37; seen: that service, which the charge takes off)
    SELECT g.key, g.priority, k.seen, k.vtime AS own,
           greatest(k.vtime,
                    (SELECT coalesce(max(s.vstart), 0) FROM leaseq_fairness_shares s
                     WHERE s.queue = %(queue)s AND s.priority = g.priority) - g.cost) AS start
    -- (DISTINCT ON, sorted: a hash of the rows the planner guesses is sized
    -- for thousands of keys at every call)
    -- ({keys}: the keys of the candidates; fair_one's: the tasks it claimed)
    FROM (SELECT DISTINCT ON (key, priority) key, priority, cost
          FROM ({keys}) a
          ORDER BY key, priority, cost DESC) g
    CROSS JOIN LATERAL (
        SELECT max(s.base) + sum(s.service) AS vtime, coalesce(sum(s.service), 0) AS seen
        FROM leaseq_fairness_shares s
        WHERE s.queue = %(queue)s AND s.priority = g.priority AND s.key = g.key) k
)

-- template: fair_one_chosen(test=/* TEMPLATE: claimable */)
-- FAIR SHARE: fair_one's candidates as claim_fair's fair_chosen gives them (in
-- its claim order: pos 1 for the key's first task ready at its priority,
-- and a finish that orders the claim's answer), for the charge. {test}: the
-- claimable test, fair_one's (claim_fair_one_plain's: the task's own part,
-- unlimited_row, as the look-up is made only for a task fair_one handed
-- out, which passed the claim's part, claimable_now, in the same snapshot).
SELECT n.id, n.limits, n.units, n.priority, n.available_at, n.key, n.cost, s.start, s.seen, s.own,
       -- pos 1: the key's first task ready at its priority as this statement sees it
       -- (looked up for the first claimed at each priority only, and only where the
       -- key starts ahead of its own virtual time, new or back from idle: where it
       -- starts at its own, pos 1 and pos 2 charge it alike, the same largest base
       -- and the same virtual start, and a key served alone always does)
       CASE WHEN row_number() OVER (PARTITION BY n.priority ORDER BY n.available_at, n.id) = 1
             AND (s.start IS NOT DISTINCT FROM s.own OR n.id = (SELECT id FROM leaseq_tasks
                         WHERE status = 'queued' AND queue = %(queue)s AND fairness_key = n.key
                           AND priority = n.priority AND available_at <= now()
                           {test}
                         ORDER BY priority DESC, available_at, id LIMIT 1))
            THEN 1 ELSE 2 END AS pos,
       s.start + sum(n.cost) OVER (PARTITION BY n.priority ORDER BY n.available_at, n.id) AS tag
FROM fair_one n JOIN fair_start s ON s.key = n.key AND s.priority = n.priority

-- template: fair_charged(served=fair_chosen p WHERE p.id IN (SELECT id FROM claimed) AND (SELECT f.last_key IS NOT NULL FROM flags f))
-- FAIR SHARE: THE CHARGE of a fair claim, shared by claim_fair, claim_fair_one
-- and claim_fair_one_plain. {served}: the candidates (fair_chosen) the claim
-- leased (claim_fair_one_plain leases every one: its fair_chosen is its
-- claimed, and is empty when no key is queued).
charged AS (
    -- FAIR SHARE: the keys served pay for it, each in this connection's share
    -- (its rows locked in key order; no other connection's claim charges it).
    -- With no key queued any more, the tasks without one were claimed in
    -- FIFO order, as claim_batch claims them, and nothing is charged.
    /* TEMPLATE: charge_fair_share((SELECT p.key, p.priority, CASE WHEN p.pos = 1 THEN p.start - p.seen END AS base, CASE WHEN p.pos = 1 THEN p.start ELSE p.own END AS origin, p.cost FROM {served}) x) */
)

-- template: completion(only=true)
-- THE COMPLETION, shared by complete_batch and complete_plain: the worker row
-- (with lock_worker), the tasks locked in id order (locked), and the leases
-- ended under the lease guard (done), each row also passing {only} (true:
-- every task; complete_plain: only tasks that name no limit). See
-- complete_batch for the order of the locks.
worker AS (
    SELECT w.id FROM leaseq_workers w WHERE %(lock_worker)s AND w.id = %(worker_id)s FOR SHARE
), locked AS (
    SELECT t.id FROM leaseq_tasks t
    WHERE (NOT %(lock_worker)s OR EXISTS (SELECT 1 FROM worker))
      AND t.id = ANY(%(task_ids)s::bigint[])
    ORDER BY t.id
    FOR UPDATE
), done AS (
    UPDATE leaseq_tasks t
    SET status = 'completed',
        result = coalesce(c.result, 'null'::jsonb),
        lease_owner = NULL,
        lease_expires_at = NULL,
        slots_released_generation = t.claim_generation,  -- given back now (complete_plain's tasks hold none)
        updated_at = now()
    FROM jsonb_to_recordset(%(items)s::jsonb) AS c(task_id bigint, generation bigint, result jsonb)
    WHERE t.id = c.task_id
      AND (SELECT count(*) FROM locked) >= 0
      AND (%(with_dependents)s OR NOT t.has_dependents)
      AND {only}
      /* TEMPLATE: lease_guard(c.generation) */
    RETURNING t.id, t.claim_generation, c.generation AS completed_generation, t.attempts, t.heartbeat_count,
              t.last_heartbeat_at, t.longest_heartbeat_gap, t.queue, t.limits, t.units
)

-- template: completion_logged
-- THE COMPLETION'S EVIDENCE, shared by complete_batch and complete_plain: each
-- ended lease's "completed" event.
logged AS (
    INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
    -- the generation the caller completed under (the guard made it the row's): a completion
    -- the guard should have refused is recorded as the stale attempt it was
    SELECT d.id, 'completed', d.completed_generation, %(worker_id)s,
           CASE WHEN %(compact)s THEN '{}'::jsonb
                ELSE jsonb_build_object('attempt', d.attempts, 'heartbeats', d.heartbeat_count,
                                        'last_heartbeat_at', d.last_heartbeat_at,
                                        'longest_heartbeat_gap', round(d.longest_heartbeat_gap::numeric, 3)) END
    FROM done d
)

-- name: migrations_lock
-- direct: migration bookkeeping, run before the functions exist
-- Serialises concurrent `leaseq migrate` runs until the transaction ends.
SELECT pg_advisory_xact_lock(7431002201);

-- name: migrations_lock_table
-- direct: migration bookkeeping, run before the functions exist
-- migrations_lock without an advisory lock (the portable mode): taken once
-- migrations_create has made the table, it serialises the migrate runs that
-- follow (two runs that both find no table can still race to create it).
LOCK TABLE leaseq_migrations IN SHARE ROW EXCLUSIVE MODE;

-- name: functions_installed
-- direct: read before migrating, by a role that may not be able to migrate
-- The fingerprint of the definer functions installed in this schema (the
-- comment on leaseq_caller(), see leaseq.store.functions) and whether the
-- schema has leaseq's tables at all: a migrate that finds both current
-- changes nothing, and so needs no privilege to run (a worker role's App).
SELECT obj_description(to_regprocedure('leaseq_caller()'), 'pg_proc') AS fingerprint,
       to_regclass('leaseq_migrations') IS NOT NULL AS present, current_schema() AS schema;

-- name: migrations_create
-- direct: migration bookkeeping, run before the functions exist
CREATE TABLE IF NOT EXISTS leaseq_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_table_exists
-- direct: migration bookkeeping, run before the functions exist
SELECT to_regclass('leaseq_migrations') IS NOT NULL AS present;

-- name: migrations_applied
-- direct: migration bookkeeping, run before the functions exist
SELECT version, name, applied_at FROM leaseq_migrations ORDER BY version;

-- name: migrations_record
-- direct: migration bookkeeping, run before the functions exist
INSERT INTO leaseq_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: db_now
-- callers: worker, operator, viewer
SELECT now() AS now;

-- name: caller_kind
-- direct: leaseq_caller() is a definer function already
-- What the database lets this connection do: admin (it owns leaseq's schema,
-- or is a superuser), worker, operator, viewer (see leaseq.store.functions),
-- and the name its actions are recorded under: the login role's, for every
-- role but the administrator's (None: the caller names itself).
SELECT kind, CASE WHEN kind = 'admin' THEN NULL ELSE session_user::text END AS principal FROM leaseq_caller();

-- name: leader_elect
-- Takes or renews the lease of leadership %(name)s for %(seconds)s, by the
-- database's clock: inserted when there is no row, taken over when its
-- lease has run out, renewed when %(holder)s already holds it; no row back
-- when another holder's lease is still live. The conflicting row is locked
-- and the WHERE judged on its newest version, so two replicas racing for an
-- expired lease cannot both win. A change of holder raises the term.
INSERT INTO leaseq_leader AS l (name, holder, term, expires_at)
VALUES (%(name)s, %(holder)s, 1, now() + %(seconds)s::float8 * interval '1 second')
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder,
    term = CASE WHEN l.holder = excluded.holder THEN l.term ELSE l.term + 1 END,
    elected_at = CASE WHEN l.holder = excluded.holder THEN l.elected_at ELSE now() END,
    renewed_at = now(),
    expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at <= now()
RETURNING holder, term, elected_at, expires_at;

-- name: leader_resign
-- Ends the holder's lease now, so another replica takes over at its next
-- attempt instead of waiting for the lease to run out. Only the holder of
-- that term can end it.
UPDATE leaseq_leader SET expires_at = now()
WHERE name = %(name)s AND holder = %(holder)s AND term = %(term)s AND expires_at > now()
RETURNING term;

-- name: leader_get
SELECT name, holder, term, elected_at, renewed_at, expires_at, expires_at > now() AS live
FROM leaseq_leader WHERE name = %(name)s;

-- name: notify_work
-- callers: worker, operator
-- Wakes idle workers listening for this queue; delivered at commit.
SELECT pg_notify('leaseq_work', %(queue)s);

-- name: notify_interrupt
-- callers: worker, operator
-- guard: none -- ends a worker's waiting claims (it is shutting down); claims nothing
-- Reaches every service process on the database, delivered at commit: the
-- one holding the worker's waiting claim may not be the one asked.
SELECT pg_notify('leaseq_interrupt', %(worker_id)s);

-- name: register_worker
-- callers: worker
-- The queue, not the worker, makes the identity: a name plus random suffix.
-- The worker says how often it will heartbeat and after how long a silent
-- worker is lost (NULL: it does not heartbeat); registering is its first heartbeat.
-- CODE VERSIONS (schema 32): the version of the code it runs and the versions
-- whose started tasks it serves (NULL, NULL: none declared, it serves any).
INSERT INTO leaseq_workers (id, name, heartbeat_seconds, lease_seconds, last_heartbeat_at, code_version,
                            compatible_versions)
VALUES (%(name)s || '-' || substr(replace(gen_random_uuid()::text, '-', ''), 1, 12), %(name)s,
        %(heartbeat_seconds)s, %(lease_seconds)s, clock_timestamp(), %(code_version)s::text,
        %(compatible_versions)s::text[])
RETURNING id, name, registered_at, revoked_at, code_version, compatible_versions;

-- name: declare_worker_kinds
-- callers: worker
-- guard: none -- the worker's own declarations, written at its registration; no lease
-- The kinds a worker serves, with their declared options (declarations: a
-- JSON array of {kind, queue, effect, actions, signature}). The definer
-- function lets a worker role write them only for a worker it registered.
INSERT INTO leaseq_worker_kinds (worker_id, kind, queue, effect, actions, signature)
SELECT %(worker_id)s, d.kind, d.queue, d.effect, d.actions, d.signature
FROM jsonb_to_recordset(%(declarations)s::jsonb)
     AS d(kind text, queue text, effect text, actions jsonb, signature jsonb)
ON CONFLICT (worker_id, kind) DO UPDATE
SET queue = excluded.queue, effect = excluded.effect, actions = excluded.actions, signature = excluded.signature
RETURNING kind;

-- name: worker_heartbeat
-- callers: worker
-- guard: none -- says the worker process is alive; renews no lease
-- A stopped worker stays stopped: its late heartbeat changes nothing.
UPDATE leaseq_workers SET last_heartbeat_at = clock_timestamp()
WHERE id = %(worker_id)s AND stopped_at IS NULL
RETURNING id, revoked_at;

-- name: worker_stopped
-- callers: worker
-- guard: none -- the worker's own account of its clean exit; its leases end by their own rules
UPDATE leaseq_workers SET stopped_at = clock_timestamp(), stop_reason = %(reason)s,
                          last_heartbeat_at = clock_timestamp()
WHERE id = %(worker_id)s AND stopped_at IS NULL
RETURNING id;

-- name: kind_declaration
-- callers: worker, operator, viewer
-- What the newest registration serving the kind declared for it (none: no
-- registered worker has served it).
SELECT k.kind, k.queue, k.effect, k.actions, k.signature, k.worker_id, w.registered_at
FROM leaseq_worker_kinds k JOIN leaseq_workers w ON w.id = k.worker_id
WHERE k.kind = %(kind)s
ORDER BY w.registered_at DESC, k.worker_id
LIMIT 1;

-- name: served_kinds
-- callers: operator, viewer
-- Every kind some registered worker has served (the dashboard flags the others).
SELECT DISTINCT kind FROM leaseq_worker_kinds ORDER BY kind;

-- name: get_worker
-- callers: worker, operator, viewer
-- guard: none -- a read of the worker row, not of a lease
SELECT id, name, registered_at, revoked_at FROM leaseq_workers WHERE id = %(worker_id)s;

-- name: lock_worker
-- callers: worker, operator
-- guard: none -- locks the worker row (a claim's slow path), before any lease exists
-- The worker row, locked as claim_batch locks it (FOR SHARE): a claim's slow
-- path takes it before it locks any task row, in the order revoke_worker
-- takes them, so a claim and a revocation never deadlock.
SELECT id, name, registered_at, revoked_at FROM leaseq_workers WHERE id = %(worker_id)s FOR SHARE;

-- name: list_workers
-- callers: operator, viewer
-- Each with what its state is computed from (leaseq.core.model.worker_state),
-- the database's clock (now) included, and the kinds it serves.
SELECT w.id, w.name, w.registered_at, w.revoked_at, w.last_heartbeat_at, w.heartbeat_seconds,
       w.lease_seconds, w.stopped_at, w.stop_reason,
       (SELECT count(*) FROM leaseq_tasks t WHERE t.status = 'running' AND t.lease_owner = w.id) AS leases,
       (SELECT coalesce(jsonb_agg(k.kind ORDER BY k.kind), '[]'::jsonb) FROM leaseq_worker_kinds k
        WHERE k.worker_id = w.id) AS kinds,
       clock_timestamp() AS now
FROM leaseq_workers w ORDER BY w.registered_at;

-- name: revoke_worker
-- callers: operator
-- guard: none -- an operator action on the worker row; it ends leases, never acts on one
UPDATE leaseq_workers SET revoked_at = now()
WHERE id = %(worker_id)s AND revoked_at IS NULL
RETURNING id, name, registered_at, revoked_at;

-- name: end_worker_leases
-- callers: operator
-- guard: none -- ends every lease of a revoked worker: taking leases away needs no lease
-- A revoked worker loses its leases at once, not when they would have run
-- out. Each deadline moves to just before the lease began: no write carrying
-- that generation can meet it, not even one whose transaction started before
-- the revocation and reaches the row after it (a deadline of "now" could
-- still be met by that transaction's earlier now()). So every guarded write
-- the worker sends (renew, complete, fail, effect) is refused, and the next
-- claim of each task's queue (or the sweep) routes the tasks by the recovery
-- policy. The rows are locked in id
-- order before any is written, as renew_leases locks them.
WITH locked AS (
    SELECT t.id FROM leaseq_tasks t
    WHERE t.status = 'running' AND t.lease_owner = %(worker_id)s
    ORDER BY t.id
    FOR UPDATE
)
UPDATE leaseq_tasks t
SET lease_expires_at = t.claimed_at - interval '1 millisecond',
    updated_at = now()
WHERE t.status = 'running' AND t.lease_owner = %(worker_id)s
  AND (SELECT count(*) FROM locked) >= 0  -- all of them locked first (see renew_leases)
RETURNING t.id, t.claim_generation;

-- name: insert_task
-- callers: worker, operator
-- plan: generic
-- ON CONFLICT: a second enqueue with the same key in the same queue is the
-- same logical task; nothing comes back and the caller reads the existing
-- row. The new row is the enqueue's evidence (list_events shows it as the
-- "enqueued" entry). The statement also wakes listening workers at commit,
-- so an enqueue is one round trip. trace_context: the caller's W3C
-- traceparent (NULL when it was not tracing). It returns only the columns
-- the database made (the id and times) and the payload as stored; the
-- engine fills in the rest from what it sent (inserted_row).
WITH added AS (
    INSERT INTO leaseq_tasks (queue, kind, payload, effect, priority, available_at,
                              idempotency_key, max_attempts, lease_seconds, actions, resources,
                              timeout_seconds, deadline_at, trace_context, limits, units, singleton_key,
                              debounce_key, fairness_key, fairness_weight)
    VALUES (%(queue)s, %(kind)s, %(payload)s::jsonb, %(effect)s, %(priority)s,
            now() + %(delay)s::float8 * interval '1 second',
            %(idempotency_key)s, %(max_attempts)s, %(lease_seconds)s, %(actions)s::jsonb, %(resources)s::jsonb,
            %(timeout)s::float8, coalesce(%(deadline_at)s::timestamptz, now() + %(deadline_in)s::float8 * interval '1 second'),
            %(trace_context)s::text, %(limits)s::text[], %(units)s, %(singleton_key)s::text, %(debounce_key)s::text,
            %(fairness_key)s::text, %(fairness_weight)s::float8)
    ON CONFLICT (queue, idempotency_key) DO NOTHING
    RETURNING id, queue, payload, available_at, created_at, updated_at, deadline_at
)
SELECT a.id, a.payload, a.available_at, a.created_at, a.updated_at, a.deadline_at
FROM added a, LATERAL (SELECT pg_notify('leaseq_work', a.queue)) AS woke;

-- name: insert_tasks
-- callers: worker, operator
-- plan: generic
-- insert_task for many tasks of one kind: one statement, one document of
-- {"payload", "idempotency_key"} objects. Duplicate keys are skipped exactly
-- as in insert_task; the caller reads those with task_ids_by_key.
INSERT INTO leaseq_tasks (queue, kind, payload, effect, priority, available_at,
                          idempotency_key, max_attempts, lease_seconds, actions, resources,
                          timeout_seconds, deadline_at, limits, units, fairness_key, fairness_weight, trace_context)
SELECT %(queue)s, %(kind)s, coalesce(n.payload, 'null'::jsonb), %(effect)s, %(priority)s,
       now() + %(delay)s::float8 * interval '1 second',
       n.idempotency_key, %(max_attempts)s, %(lease_seconds)s, %(actions)s::jsonb, %(resources)s::jsonb,
       %(timeout)s::float8, coalesce(%(deadline_at)s::timestamptz, now() + %(deadline_in)s::float8 * interval '1 second'),
       %(limits)s::text[], %(units)s, %(fairness_key)s::text, %(fairness_weight)s::float8, %(trace_context)s::text
FROM jsonb_to_recordset(%(tasks)s::jsonb) AS n(payload jsonb, idempotency_key text)
ON CONFLICT (queue, idempotency_key) DO NOTHING
RETURNING id, idempotency_key;

-- name: insert_fresh_tasks
-- callers: worker, operator
-- plan: generic
-- insert_tasks when every key was just generated by leaseq (unique by
-- construction): a plain insert, without ON CONFLICT's speculative insertion
-- (a quarter of the statement's cost). Should a generated key ever meet a
-- stored one, the unique index refuses the whole statement and the caller
-- runs insert_tasks instead.
INSERT INTO leaseq_tasks (queue, kind, payload, effect, priority, available_at,
                          idempotency_key, max_attempts, lease_seconds, actions, resources,
                          timeout_seconds, deadline_at, limits, units, fairness_key, fairness_weight, trace_context)
SELECT %(queue)s, %(kind)s, coalesce(n.payload, 'null'::jsonb), %(effect)s, %(priority)s,
       now() + %(delay)s::float8 * interval '1 second',
       n.idempotency_key, %(max_attempts)s, %(lease_seconds)s, %(actions)s::jsonb, %(resources)s::jsonb,
       %(timeout)s::float8, coalesce(%(deadline_at)s::timestamptz, now() + %(deadline_in)s::float8 * interval '1 second'),
       %(limits)s::text[], %(units)s, %(fairness_key)s::text, %(fairness_weight)s::float8, %(trace_context)s::text
FROM jsonb_to_recordset(%(tasks)s::jsonb) AS n(payload jsonb, idempotency_key text)
RETURNING id, idempotency_key;

-- name: flow_lock
-- callers: worker, operator
-- plan: generic
-- Serialises the singleton or debounced enqueues of one key (scope:
-- singleton or debounce) until the transaction ends: the upsert locks the
-- key's row, made by the first enqueue that names it. An enqueue reads the
-- key's tasks after this, in a later statement, so it sees what the one
-- before it committed.
INSERT INTO leaseq_flow_keys AS f (scope, queue, key) VALUES (%(scope)s, %(queue)s, %(key)s)
ON CONFLICT (scope, queue, key) DO UPDATE SET locked_at = now()
RETURNING f.scope;

-- name: singleton_holders
-- callers: worker, operator
-- The unfinished tasks with a singleton key in a queue, oldest first, locked
-- (the caller holds the key's flow_lock). Read from leaseq_tasks_singleton.
SELECT t.* FROM leaseq_tasks t
WHERE t.queue = %(queue)s AND t.singleton_key = %(singleton_key)s
  AND t.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
ORDER BY t.id
FOR UPDATE;

-- name: cancel_singleton
-- callers: worker, operator
-- on_conflict="cancel_running": the enqueue cancels the unfinished tasks that
-- hold its singleton key, as cancel_task does (the lease cleared: the
-- holder's next guarded write is refused). Only tasks with that key in that
-- queue: the key is the enqueue's authority over them.
UPDATE leaseq_tasks
SET status = 'cancelled', last_error = %(reason)s, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = ANY(%(holder_ids)s::bigint[]) AND queue = %(queue)s AND singleton_key = %(singleton_key)s
  AND status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
RETURNING id, status, claim_generation, limits;

-- name: debounce_holder
-- callers: worker, operator
-- The newest task with a debounce key in a queue (the caller holds the key's
-- flow_lock), locked: whether it has not started yet (queued, never claimed:
-- a trailing enqueue collapses into it), and whether it was made less than
-- window seconds ago (a leading enqueue is dropped).
SELECT t.*, (t.status = 'queued' AND t.claim_generation = 0) AS pending,
       t.created_at > now() - %(window_seconds)s::float8 * interval '1 second' AS recent
FROM leaseq_tasks t
WHERE t.queue = %(queue)s AND t.debounce_key = %(debounce_key)s
ORDER BY t.id DESC
LIMIT 1
FOR UPDATE;

-- name: debounce_task
-- callers: worker, operator
-- A trailing enqueue collapses into the pending task of its key: the last
-- payload wins and the run moves to window seconds from now, never past
-- max_delay seconds after the task was made. Only a task with that key in
-- that queue that has not started.
UPDATE leaseq_tasks
SET payload = %(payload)s::jsonb,
    available_at = least(now() + %(window_seconds)s::float8 * interval '1 second',
                         created_at + %(max_delay)s::float8 * interval '1 second'),
    updated_at = now()
WHERE id = %(holder_id)s AND queue = %(queue)s AND debounce_key = %(debounce_key)s
  AND status = 'queued' AND claim_generation = 0
RETURNING *;

-- name: flow_event
-- callers: worker, operator
-- guard: none -- evidence of an enqueue that wrote no task: only about the task that holds its key
-- The evidence of an enqueue answered with another task: singleton_skipped
-- (the task that holds its singleton key) or debounced (the task its
-- debounce key collapsed into). Written only about a task with that key in
-- that queue.
INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
SELECT t.id, %(type)s, NULL, NULL, %(detail)s::jsonb FROM leaseq_tasks t
WHERE t.id = %(holder_id)s AND t.queue = %(queue)s
  AND ((%(type)s = 'singleton_skipped' AND t.singleton_key = %(key)s)
       OR (%(type)s = 'debounced' AND t.debounce_key = %(key)s));

-- name: tasks_by_key
-- callers: worker, operator
-- The tasks an enqueue's keys already name in the queue, each with what the
-- enqueue compares beside the row (leaseq.engine.enqueue.key_differences):
-- whether it is approval-gated and its approval deadline's length in
-- seconds, and the tasks it waits for (ids in order, comma-separated) with
-- what it does if one of them fails. Only the gate's request is read (schema
-- 38): a request for more budget is no gate the task was enqueued with, and
-- never hides the one it was (a retried spawn names the child that paused
-- for its tree's budget as it was asked for, gated or not).
SELECT t.*, a.task_id IS NOT NULL AS gated,
       extract(epoch FROM a.deadline_at - a.requested_at)::float8 AS approval_seconds,
       d.upstreams, d.on_failure
FROM leaseq_tasks t
LEFT JOIN leaseq_approvals a ON a.task_id = t.id AND a.request = 'gate'
LEFT JOIN LATERAL (SELECT string_agg(upstream::text, ',' ORDER BY upstream) AS upstreams,
                          min(on_failure) AS on_failure
                   FROM leaseq_dependencies WHERE waiter = t.id) d ON true
WHERE t.queue = %(queue)s AND t.idempotency_key IN (SELECT jsonb_array_elements_text(%(keys)s::jsonb));

-- name: get_task
-- callers: worker, operator, viewer
-- plan: generic
SELECT * FROM leaseq_tasks WHERE id = %(task_id)s;

-- name: get_task_by_key
-- callers: worker, operator, viewer
SELECT * FROM leaseq_tasks WHERE queue = %(queue)s AND idempotency_key = %(idempotency_key)s;

-- name: lock_task
-- callers: worker, operator
-- Operator actions read and lock the row before deciding.
SELECT * FROM leaseq_tasks WHERE id = %(task_id)s FOR UPDATE;

-- name: list_tasks
-- callers: operator, viewer
SELECT * FROM leaseq_tasks
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: lock_expired
-- callers: worker, operator
-- plan: generic
-- Running tasks of the queue whose lease has run out, locked for routing.
-- SKIP LOCKED: another claimer already routing a row keeps it; we take the
-- rest. BY QUEUE: every sweep reads one queue (the leases index leads with
-- it, schema 41); the sweep of every queue asks sweep_queues which.
SELECT id, queue, lease_owner, claim_generation, lease_expires_at, claimed_at,
       heartbeat_count, last_heartbeat_at, longest_heartbeat_gap
FROM leaseq_tasks
WHERE status = 'running' AND queue = %(queue)s AND lease_expires_at < now()
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: sweep_queues
-- callers: worker, operator
-- The queues one pass of the sweep of every queue (leaseq.Queue.sweep,
-- leaseq sweep, leaseq serve's maintenance) has work in: an expired lease,
-- a sleeper whose wake time has come, a task past its deadline that has not
-- started, an action token an hour past its expiry. BOUNDED: the pass
-- examines at most `scan` queues, the first after `after` (NULL: from the
-- first), so its cost does not grow with the number of queues; the next
-- pass resumes after the last queue this one examined, which is returned
-- (at_bound, with its flags, whether it has work or not) when the walk stopped
-- at the bound rather than at the end. Each queue that has a task is
-- reached by skipping from one queue name to the next along
-- leaseq_tasks_queue_key (one index probe per queue, as known_queues; a
-- token goes with its task, so its queue has one); or, where `within`
-- names queues, those of them that have a task, in name order (the
-- function sets `within` to a role's queues when the role is scoped to
-- queues: its passes walk its own queues, never stopping at the bound in
-- queues it may not reach, which would hide where to resume). Each is then
-- probed along the
-- sweeps' own indexes, which lead with the queue (schema 41). Nothing is
-- locked here: each sweep then locks its one queue's rows (lock_expired,
-- lock_sleepers, lock_overdue, prune_action_tokens), the ones a queue's
-- flags here say have work. A queue no worker claims from is swept as any
-- other.
WITH RECURSIVE seen(name, n) AS (
    SELECT (SELECT min(t.queue) FROM leaseq_tasks t WHERE t.queue > coalesce(%(after)s::text, '')), 1
    WHERE %(within)s::text[] IS NULL
    UNION ALL
    SELECT (SELECT min(t.queue) FROM leaseq_tasks t WHERE t.queue > seen.name), seen.n + 1 FROM seen
    WHERE seen.name IS NOT NULL AND seen.n < %(scan)s
),
walked(name, n) AS (
    SELECT name, n FROM seen
    UNION ALL
    (SELECT x.name, row_number() OVER (ORDER BY x.name)
     FROM (SELECT DISTINCT unnest(%(within)s::text[]) AS name) x
     WHERE x.name > coalesce(%(after)s::text, '') AND EXISTS (SELECT 1 FROM leaseq_tasks t WHERE t.queue = x.name)
     ORDER BY x.name
     LIMIT %(scan)s)
)
SELECT queue, expired, sleepers, overdue, tokens, at_bound FROM (
    SELECT q.name AS queue, q.n = %(scan)s AS at_bound,
           EXISTS (SELECT 1 FROM leaseq_tasks t
                   WHERE t.status = 'running' AND t.queue = q.name AND t.lease_expires_at < now()) AS expired,
           EXISTS (SELECT 1 FROM leaseq_tasks t
                   WHERE t.status = 'waiting' AND t.queue = q.name AND t.wake_at <= now()) AS sleepers,
           EXISTS (SELECT 1 FROM leaseq_tasks t
                   WHERE t.deadline_at IS NOT NULL AND t.status IN ('queued', 'waiting', 'awaiting_approval')
                     AND t.queue = q.name AND t.deadline_at <= now()) AS overdue,
           EXISTS (SELECT 1 FROM leaseq_action_tokens k
                   WHERE k.queue = q.name AND k.expires_at < now() - interval '1 hour') AS tokens
    FROM walked q
    WHERE q.name IS NOT NULL
) w
WHERE w.expired OR w.sleepers OR w.overdue OR w.tokens OR w.at_bound
ORDER BY w.queue;

-- name: route_expired
-- callers: worker, operator
-- plan: generic
-- The recovery policy. An expired lease allows reassignment, not a retry:
--   a side_effect call with an intent and no response -> needs_reconciliation
--   attempts exhausted                                 -> dead
--   anything else (no open call, or open calls that are read_only or
--   idempotent, which a retry may simply repeat)       -> queued, same idempotency_key
-- A call's class is its ledger entry's (ctx.tool's effect=; ctx.effect takes
-- the task's), so a side_effect task with only an open model call is retried.
-- Cancelled, blocked and dead tasks are not running, so expiry never touches them.
UPDATE leaseq_tasks t
SET status = CASE
        /* TEMPLATE: unsettled_side_effect */
        WHEN t.attempts >= t.max_attempts THEN 'dead'
        ELSE 'queued' END,
    last_error = 'lease expired: ' || t.lease_owner || ' held generation ' || t.claim_generation,
    lease_owner = NULL,
    lease_expires_at = NULL,
    available_at = now(),
    updated_at = now()
WHERE t.id = ANY(%(task_ids)s::bigint[])
  AND t.status = 'running' AND t.lease_expires_at < now()
RETURNING t.id, t.status, t.claim_generation, t.open_effects, t.attempts, t.queue, t.limits, t.units,
          CASE t.status  -- why, when the task is not simply queued again
              WHEN 'needs_reconciliation' THEN 'side-effect intent without a response: a retry could repeat it'
              WHEN 'dead' THEN 'attempts exhausted' END AS reason;

-- name: lock_overdue
-- callers: worker, operator
-- Tasks of the queue whose deadline passed before they started, locked for
-- expiry: queued (never claimed, or waiting for a retry), waiting or
-- awaiting approval. Read from the deadline index (by queue, schema 41).
-- SKIP LOCKED: a row another sweep or an operator holds is left to them.
SELECT id, queue, status, claim_generation, deadline_at
FROM leaseq_tasks
WHERE deadline_at IS NOT NULL AND status IN ('queued', 'waiting', 'awaiting_approval')
  AND queue = %(queue)s AND deadline_at <= now()
ORDER BY deadline_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: prune_action_tokens
-- callers: worker, operator
-- A batch of the queue's action tokens that expired an hour ago or more (by
-- the database's clock), deleted by the sweep: a token is minted per action
-- and per renewal it is asked for under, and one expired is refused anyway
-- (a deleted one is refused as unknown). The hour keeps "expired" the
-- answer about a token that has just run out. Rows another sweep holds are
-- skipped. A token carries its task's queue (schema 41; a task never
-- changes queue), so the sweep reads one queue at a time.
DELETE FROM leaseq_action_tokens
WHERE id IN (SELECT id FROM leaseq_action_tokens
             WHERE queue = %(queue)s AND expires_at < now() - interval '1 hour'
             ORDER BY expires_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: expire_overdue
-- callers: worker, operator
-- The tasks lock_overdue found end 'expired' and are never started again
-- (claim_batch skips a task past its deadline meanwhile); the reason says
-- whether one had started.
UPDATE leaseq_tasks t
SET status = 'expired',
    last_error =
        /* TEMPLATE: deadline_reason */,
    updated_at = now()
WHERE t.id = ANY(%(task_ids)s::bigint[])
  AND t.status IN ('queued', 'waiting', 'awaiting_approval') AND t.deadline_at <= now()
RETURNING t.id, t.attempts, t.last_error AS reason;

-- name: claim_plain
-- callers: worker
-- guard: none -- takes new leases: no lease exists yet to guard
-- plan: generic
-- THE LEAN CLAIM: claim_batch for a queue none of whose tasks ever named a
-- fairness key, a limit or a singleton key (the common case), with none of
-- the steps those need: a plan a fraction of claim_batch's, to build and to
-- start at every call. The same worker row read FOR SHARE, routing first,
-- claimable test (claimable_plain), claim order, leases and events as
-- claim_batch (the templates they share).
-- Which queues it may claim from is leaseq_full_claims (schema 39): a row
-- per queue a task with such a key was ever written to, by a trigger on
-- leaseq_tasks in the writing transaction. Read in this statement's
-- snapshot, with the tasks: a row there (full_due) and this statement claims
-- nothing, and the caller claims with claim_batch (and so does every later
-- claim of the queue on that connection's queue object). A task with a key
-- committed after this statement's snapshot is not seen by it, nor is its
-- queue's row: the claim is as one made before that enqueue. A candidate
-- row changed meanwhile is judged again as it now is (FOR UPDATE), and one
-- that names a key or a limit by then is passed over.
-- As claim_batch, it always returns at least one row; its limit_wait is
-- NULL: its queue's tasks name no limit for a rate to refuse.
WITH
    /* TEMPLATE: claim_head(EXISTS (SELECT 1 FROM leaseq_full_claims q WHERE q.queue = %(queue)s) AS full_due) */,
candidate AS (
    -- the claimable index in claim order, as claim_batch reads it
    SELECT id FROM leaseq_tasks
    WHERE status = 'queued' AND queue = %(queue)s AND fairness_key IS NULL AND available_at <= now()
      AND (SELECT NOT f.full_due FROM flags f)
      AND limits IS NULL AND singleton_key IS NULL
      /* TEMPLATE: claimable_plain */
    ORDER BY priority DESC, available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
    /* TEMPLATE: claim_leased */
SELECT c.*, f.routing_due, f.worker_ok, f.full_due, NULL::float8 AS limit_wait
FROM flags f LEFT JOIN claimed c ON true;

-- name: claim_batch
-- callers: worker
-- guard: none -- takes new leases: no lease exists yet to guard
-- plan: generic
-- Select and lease in one statement: no gap in which two workers pick the
-- same row. With kinds (NULL: any), a worker takes only the kinds it has
-- handlers for and leaves the others queued for workers that do. A paused
-- queue hands out nothing, nor does a revoked worker.
-- With route_first, nothing is claimed while an expired lease that nobody
-- is routing yet exists, or a waiting task's wake time has come: the caller
-- routes them first (lock_expired, route_expired; lock_sleepers, wake_tasks)
-- and claims again without route_first. So a claim with
-- nothing to route is this one statement, in its own transaction.
-- The statement also writes each claim's "claimed" event (the backend
-- declares it writes its own evidence), and always returns at least one row: the claimed tasks, or one row with
-- NULL task columns, each carrying routing_due and worker_ok.
-- The worker row is read FOR SHARE, which conflicts with revoke_worker's
-- update of it: a claim and a revocation serialize. Either the claim commits
-- first and the revocation's end_worker_leases (a later statement, a later
-- snapshot) ends its leases, or the revocation commits first and the claim,
-- re-reading the locked row, finds revoked_at set and takes nothing. A plain
-- read (READ COMMITTED) would let a claim that began before the revocation
-- commit a lease that the revocation never saw. The worker row is locked
-- before any task row (due is only read once worker_ok holds), as
-- revoke_worker does, so the two never wait on each other in a cycle.
-- LIMITS (the steps so marked): a candidate that names limits is handed out
-- only if each has room for it; the claim takes its slots and tokens in the
-- same statement. Task rows (skipped when locked, never waited on) come
-- before limit rows (waited on, in key order), as in every statement that
-- gives slots back, so no two of them wait on each other in a cycle.
-- FAIR SHARE: when a task with a fairness key is queued here (fair_due),
-- this statement claims nothing, and the caller claims with claim_fair: a
-- queue that uses no fairness key pays one probe of an empty index.
WITH
    /* TEMPLATE: claim_head */,
plain AS (
    -- the claim of a queue without fairness keys: the claimable index in claim order
    SELECT id, limits, units, priority, available_at FROM leaseq_tasks
    WHERE status = 'queued' AND queue = %(queue)s AND fairness_key IS NULL AND available_at <= now()
      AND (SELECT f.last_key IS NULL FROM flags f)
      /* TEMPLATE: claimable */
    ORDER BY priority DESC, available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), candidate AS (
    SELECT id, limits, units, priority, available_at, NULL::float8 AS tag FROM plain
),
    /* TEMPLATE: claim_lease */
SELECT c.*, f.routing_due, f.worker_ok, f.last_key IS NOT NULL AS fair_due,
       /* TEMPLATE: claim_limit_wait */
FROM flags f LEFT JOIN claimed c ON true;

-- name: claim_fair
-- callers: worker
-- guard: none -- takes new leases: no lease exists yet to guard
-- plan: generic
-- claim_batch for a queue with a task that names a fairness key queued: the
-- same steps (claim_head, claim_lease), with the candidates chosen by fair
-- share. Run where claim_batch answered fair_due (or the queue used keys at
-- its last claim, until a claim answers fair_due false: no key queued).
-- FAIR SHARE (the steps so marked): the claim serves the keys with tasks
-- ready in weighted round robin within each priority (virtual time: each
-- key's runs on by 1/weight per task claimed, and the lowest is served
-- first); the tasks without a key are one more key (''). The keys' shares
-- of this connection (schema 37) are locked after the limit rows, in
-- priority and key order; only this connection's claims lock them, so no
-- claim waits on another's to charge a key.
WITH RECURSIVE
    /* TEMPLATE: claim_head */,
fair_keys(key) AS (
    -- FAIR SHARE: the keys with tasks queued, one probe of leaseq_tasks_fair
    -- each, last to first: each probe lands on a key's newest task, never
    -- walking the entries its claimed tasks left behind (until a vacuum)
    SELECT f.last_key FROM flags f WHERE f.last_key IS NOT NULL
    UNION ALL
    SELECT (SELECT k.fairness_key FROM leaseq_tasks k
            WHERE k.status = 'queued' AND k.queue = %(queue)s AND k.fairness_key < g.key
            ORDER BY k.fairness_key DESC LIMIT 1)
    FROM fair_keys g WHERE g.key IS NOT NULL
),
    /* TEMPLATE: fair_mode((SELECT count(*) FROM fair_keys g WHERE g.key IS NOT NULL) = 1) */,
fair_ready AS (
    -- FAIR SHARE: each key's first tasks in claim order, and the first of the
    -- tasks without a key: four claims' worth and 64 more, so the claims
    -- running beside this one (whose rows are skipped below, as are those
    -- claimed since this statement began) leave each key enough: a worker's
    -- claims of a slot or two at a time, beside a few other workers', found
    -- every row of four claims' worth taken, and came back empty
    -- (nothing read where one key alone is queued: fair_one claims it)
    SELECT g.key, r.* FROM fair_keys g CROSS JOIN LATERAL (
        SELECT id, priority, available_at, 1.0::float8 / coalesce(fairness_weight, 1) AS cost FROM leaseq_tasks
        WHERE status = 'queued' AND queue = %(queue)s AND fairness_key = g.key AND available_at <= now()
          AND NOT (SELECT m.one_key FROM fair_mode m)
          /* TEMPLATE: claimable */
        ORDER BY priority DESC, available_at, id
        LIMIT 4 * %(limit)s + 64) r
    WHERE g.key IS NOT NULL
    UNION ALL
    SELECT '', r.* FROM (
        SELECT id, priority, available_at, 1.0::float8 AS cost FROM leaseq_tasks
        WHERE status = 'queued' AND queue = %(queue)s AND fairness_key IS NULL AND available_at <= now()
          AND NOT (SELECT m.one_key FROM fair_mode m)
          /* TEMPLATE: claimable */
        ORDER BY priority DESC, available_at, id
        LIMIT 4 * %(limit)s + 64) r
),
    /* TEMPLATE: fair_one */,
    /* TEMPLATE: fair_start(SELECT key, priority, cost FROM fair_ready UNION ALL SELECT key, priority, cost FROM fair_one) */,
fair_order AS (
    -- FAIR SHARE: each task's virtual finish: its key's start plus the cost
    -- (1/weight) of it and of the key's tasks before it at its priority
    -- (pos: its place among them)
    SELECT r.id, r.key, r.cost, r.priority, r.available_at, s.start, s.seen, s.own,
           s.start + sum(r.cost) OVER (PARTITION BY r.key, r.priority ORDER BY r.available_at, r.id) AS tag,
           row_number() OVER (PARTITION BY r.key, r.priority ORDER BY r.available_at, r.id) AS pos
    FROM fair_ready r JOIN fair_start s ON s.key = r.key AND s.priority = r.priority
), fair_pick AS (
    -- FAIR SHARE: priority first, then the lowest virtual finish; each row
    -- locked as it is reached in that order, until the claim has enough: a
    -- claim beside this one skips these and takes the next in the same
    -- order, as it would have after this one
    SELECT t.id, t.limits, t.units, t.priority, t.available_at, o.key, o.cost, o.start, o.seen, o.own,
           o.pos, o.tag
    FROM (SELECT * FROM fair_order ORDER BY priority DESC, tag, available_at, id) o
    CROSS JOIN LATERAL (
        SELECT t.id, t.limits, t.units, t.priority, t.available_at FROM leaseq_tasks t
        WHERE t.id = o.id AND t.status = 'queued' AND t.queue = %(queue)s AND t.available_at <= now()
        FOR UPDATE SKIP LOCKED) t
    ORDER BY o.priority DESC, o.tag, o.available_at, o.id
    LIMIT %(limit)s
), fair_chosen AS (
    -- FAIR SHARE: the candidates, weighed (fair_pick) or of one key alone
    -- (fair_one, in its claim order: pos 1 for the key's first task ready at
    -- its priority, and a finish that orders the claim's answer)
    SELECT * FROM fair_pick
    UNION ALL
    /* TEMPLATE: fair_one_chosen */
), candidate AS (
    SELECT id, limits, units, priority, available_at, tag FROM fair_chosen
),
    /* TEMPLATE: claim_lease */,
    /* TEMPLATE: fair_charged */
SELECT c.*, f.routing_due, f.worker_ok, f.last_key IS NOT NULL AS fair_due,
       -- FAIR SHARE: the key a task was served under ('': none) and its virtual
       -- start, cost and finish (NULL: claimed in FIFO order, no key queued)
       CASE WHEN f.last_key IS NOT NULL THEN p.key END AS fair_key, p.start AS fair_start, p.cost AS fair_cost,
       p.tag AS fair_tag, (SELECT m.one_key FROM fair_mode m) AS fair_one,
       /* TEMPLATE: claim_limit_wait */
FROM flags f LEFT JOIN claimed c ON true LEFT JOIN fair_chosen p ON p.id = c.id;

-- name: claim_fair_one
-- callers: worker
-- guard: none -- takes new leases: no lease exists yet to guard
-- plan: generic
-- claim_fair for a queue where one fairness key alone has tasks queued and
-- no task without a key is ready (one tenant's backlog; claim_fair answered
-- fair_one): only claim_fair's steps for that case (fair_mode, fair_one,
-- fair_start, the charge: the same templates, so the key is charged exactly
-- as claim_fair charges it), a plan a fraction of claim_fair's to build and
-- to start at every call. Another key queued, or a task without a key ready
-- (fair_one false): this statement claims nothing, and the caller claims
-- with claim_fair, as claim_batch hands over on fair_due. A task enqueued
-- after this statement's snapshot is not seen by it: the claim is as one
-- made before that enqueue, as claim_fair's would be.
WITH
    /* TEMPLATE: claim_head */,
    /* TEMPLATE: fair_mode((SELECT f.last_key IS NOT NULL FROM flags f) AND (SELECT k.fairness_key FROM leaseq_tasks k WHERE k.status = 'queued' AND k.queue = %(queue)s AND k.fairness_key < (SELECT f.last_key FROM flags f) ORDER BY k.fairness_key DESC LIMIT 1) IS NULL) */,
    /* TEMPLATE: fair_one */,
    /* TEMPLATE: fair_start */,
fair_chosen AS (
    /* TEMPLATE: fair_one_chosen */
), candidate AS (
    SELECT id, limits, units, priority, available_at, tag FROM fair_chosen
),
    /* TEMPLATE: claim_lease */,
    /* TEMPLATE: fair_charged */
SELECT c.*, f.routing_due, f.worker_ok, f.last_key IS NOT NULL AS fair_due,
       CASE WHEN f.last_key IS NOT NULL THEN p.key END AS fair_key, p.start AS fair_start, p.cost AS fair_cost,
       p.tag AS fair_tag, (SELECT m.one_key FROM fair_mode m) AS fair_one,
       /* TEMPLATE: claim_limit_wait */
FROM flags f LEFT JOIN claimed c ON true LEFT JOIN fair_chosen p ON p.id = c.id;

-- name: claim_fair_one_plain
-- callers: worker
-- guard: none -- takes new leases: no lease exists yet to guard
-- plan: generic
-- claim_fair_one for a queue none of whose tasks ever named a limit or a
-- singleton key (one tenant's backlog of plain tasks, the common case):
-- the same steps (the same templates: the key is charged exactly as
-- claim_fair_one and claim_fair charge it), with the claimable test of
-- claim_plain (claimable_unlimited) and none of the limits' steps (judged,
-- slots taken, the rate's wait), and what it claims decided in its first
-- step (its flags, fair_one_flags: the key, whether it is alone, whether a
-- task of the queue ever named a limit): a plan about three fifths of
-- claim_fair_one's (tests/bench/test_claim_plan.py pins its size), to start
-- at every call, and to build again whenever its cached plan is
-- invalidated. Which queues it may claim from is
-- leaseq_limited_claims (schema 40), read in this statement's snapshot
-- with the tasks: a row there (limited_due) and this statement claims
-- nothing, and the caller claims with claim_fair_one (and so does every
-- later one-key claim of the queue on that connection's queue object).
-- Another key queued, or a task without a key ready (fair_one false): it
-- claims nothing, and the caller claims with claim_fair, as after
-- claim_fair_one. Its limit_wait is NULL: its tasks name no limit.
WITH
    /* TEMPLATE: claim_head(/* TEMPLATE: fair_one_flags */) */,
fair_mode AS (
    -- one key alone, as the flags found it (read by fair_one only: not a step of its own)
    SELECT f.one_key FROM flags f
),
    /* TEMPLATE: fair_one(/* TEMPLATE: claimable_unlimited */) */,
    /* TEMPLATE: fair_start */,
fair_chosen AS (
    /* TEMPLATE: fair_one_chosen(/* TEMPLATE: unlimited_row */) */
),
    /* TEMPLATE: claim_leased(SELECT p.id FROM fair_chosen p) */,
    /* TEMPLATE: fair_charged(fair_chosen p) */
SELECT c.*, f.routing_due, f.worker_ok, f.last_key IS NOT NULL AS fair_due,
       CASE WHEN f.last_key IS NOT NULL THEN p.key END AS fair_key, p.start AS fair_start, p.cost AS fair_cost,
       p.tag AS fair_tag, f.one_key AND f.last_key IS NOT NULL AS fair_one, f.limited_due,
       NULL::float8 AS limit_wait
FROM flags f LEFT JOIN claimed c ON true LEFT JOIN fair_chosen p ON p.id = c.id;

-- name: fair_due
-- callers: worker
-- FAIR SHARE: whether a task with a fairness key is queued in the queue. The
-- claim asks it only where claim_batch answers no row when it claims nothing
-- (SQLite); here claim_batch's row of flags says it (its fair_due column).
SELECT (SELECT k.fairness_key FROM leaseq_tasks k
        WHERE k.status = 'queued' AND k.queue = %(queue)s AND k.fairness_key IS NOT NULL
        ORDER BY k.fairness_key DESC LIMIT 1) IS NOT NULL AS fair_due;

-- name: renew_leases
-- callers: worker
-- guard: lease
-- plan: generic up to 32 task_ids
-- One statement renews every lease a worker names: the rows back are the
-- leases still held. The tasks are found by id (= ANY of the id list) and
-- each row's generation is looked up in the {"<task id>": generation} map
-- by the lease guard, so the statement reads each named row once, however
-- many there are. Not a join against the (task, generation) pairs: a
-- worker holding ten thousand leases, planned generically or on statistics
-- taken before those tasks ran (the planner then expects one running row),
-- got a nested loop over every pair for every running row, 10^8 steps.
-- A renewal of up to 32 leases (a worker's usual batch) runs the function's
-- cached generic plan: planning the statement anew cost more than running
-- it (about 15 us a lease of a renewal of 10). A longer one is planned for
-- its values at that call (plan: generic up to): the id list is then a
-- constant, which the planner counts and, where it filters rows by it (a
-- read of every running lease, planned on statistics taken while they were
-- queued), probes by hash; a list read as a parameter is searched from end
-- to end for each row, at most 32 comparisons here.
-- The new deadline comes from the lease length this claim was given (its
-- deadline minus when that deadline was set), never from the caller; a
-- claim's lease_seconds override is not written onto the task.
-- Every named row is locked in id order (locked) before any is written, as
-- every statement that writes several leases of one worker locks them
-- (complete_batch, end_worker_leases): an UPDATE locks rows in the order its
-- plan reads them (a bitmap scan: the table's), and a renewal and the same
-- worker's batched completion taking two rows in opposite orders deadlock,
-- which PostgreSQL breaks only after deadlock_timeout (a second by default):
-- long enough for short leases to run out while both wait. The count is a
-- condition on no row, so it is judged once, before the first row is read,
-- and reads the locking query to its end; the update keeps its own plan.
WITH locked AS (
    SELECT t.id FROM leaseq_tasks t
    WHERE t.id = ANY(%(task_ids)s::bigint[])
    ORDER BY t.id
    FOR UPDATE
)
UPDATE leaseq_tasks t
SET lease_expires_at = now() + (t.lease_expires_at - coalesce(t.last_heartbeat_at, t.claimed_at)),
    heartbeat_count = t.heartbeat_count + 1,
    longest_heartbeat_gap = greatest(t.longest_heartbeat_gap,
        extract(epoch FROM now() - coalesce(t.last_heartbeat_at, t.claimed_at))::float8),
    last_heartbeat_at = now(),
    updated_at = now()
WHERE t.id = ANY(%(task_ids)s::bigint[])
  AND (SELECT count(*) FROM locked) >= 0
  /* TEMPLATE: lease_guard((%(leases)s::jsonb ->> t.id::text)::bigint) */
RETURNING t.id, t.claim_generation, t.lease_expires_at;

-- name: lock_lease
-- callers: worker
-- guard: lease
-- plan: generic
-- Checks the lease and locks the row for the rest of the transaction, so no
-- cancel or expiry routing can slip between the check and the write after it.
SELECT t.id, t.queue, t.idempotency_key, t.effect, t.actions, t.resources, t.lease_expires_at, t.claim_epoch,
       t.budget_owners,
       coalesce((SELECT q.paused FROM leaseq_queues q WHERE q.name = t.queue), false) AS paused,
       clock_timestamp() AS now  -- an action token is issued on this clock, not the signing process's
FROM leaseq_tasks t
WHERE t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
FOR UPDATE OF t;

-- name: attempt_holds_lease
-- callers: worker
-- Asked by a downstream fence (leaseq.fencing.QueueLeaseCheck) inside its own
-- transaction: is this attempt still the running one, with a live lease? A
-- read, not a lease-backed write, so the holder is not asked for (a
-- generation names one acquisition). FOR SHARE keeps any claim, cancel or
-- expiry routing off the row until the asking transaction ends (claims skip
-- it); clock_timestamp(), not now(): the asking transaction may have begun
-- before the lease ran out.
SELECT t.id FROM leaseq_tasks t
WHERE t.id = %(task_id)s
  AND t.status = 'running'
  AND t.claim_generation = %(generation)s
  AND t.claim_epoch = %(epoch)s  -- an attempt of another history is not this one (schema 25)
  AND t.lease_expires_at >= clock_timestamp()
FOR SHARE OF t;

-- name: complete_batch
-- callers: worker
-- guard: lease
-- plan: generic
-- The one completion statement: a single completion is a batch of one.
-- Completes many leases of one worker in one statement. Each
-- (task, generation) pair is checked by the lease guard, as in renew_leases;
-- the rows back are the tasks completed, and a pair missing from them had
-- lost its lease (nothing was written for it). The "completed" events are
-- written by the same statement.
-- Without with_dependents, a task that others wait for (has_dependents) is
-- left alone too: the caller completes it again in a transaction that also
-- settles its waiters (leaseq.engine.dependencies).
-- With lock_worker (a claim follows in this transaction, and every claim locks
-- the worker row), the worker row is locked FOR SHARE before any task row:
-- the condition naming it involves no task column, so it gates the whole
-- update and is judged once, before the first row is read. revoke_worker locks
-- the worker row and then the worker's tasks; taken after the tasks, the lock
-- would close a cycle with it. It decides nothing: the lease guard does.
-- Without lock_worker the worker CTE reads no row at all, not merely goes
-- unread: when a row it locks has changed under it, PostgreSQL rechecks the
-- row (EvalPlanQual) after evaluating every subquery result the plan may
-- need, short-circuit or not, and the worker row locked after the tasks
-- would close that cycle.
-- The task rows are then locked in id order (locked) before any is written,
-- as renew_leases locks them: a completion and a renewal of the same leases
-- never deadlock. task_ids: the items' task ids.
WITH
    /* TEMPLATE: completion */,
-- LIMITS: the slots the ended leases held, given back (see give_back_slots)
/* TEMPLATE: give_back_slots(done) */,
    /* TEMPLATE: completion_logged */
-- the events are written: the ids, and the limits whose slots came back
-- (their rows are locked until commit), are all a caller needs. A freed limit
-- slot wakes the queues' idle workers (at commit), from a column of its own
-- (a join nothing reads from would be planned away).
SELECT d.id, d.limits,
       (SELECT count(pg_notify('leaseq_work', f.queue))
        FROM (SELECT DISTINCT queue FROM done WHERE limits IS NOT NULL) f) AS woke
FROM done d;

-- name: complete_plain
-- callers: worker
-- guard: lease
-- plan: generic
-- THE LEAN COMPLETION: complete_batch for leases whose tasks name no limit
-- (the common case), without the steps that give limit slots back
-- (give_back_slots): a plan a fraction of complete_batch's to start at every
-- call, and to build once per connection. The same locks in the same order,
-- the same lease guard, the same events (the templates complete_batch
-- expands). A task that names a limit is left alone, whatever the caller
-- believed (the row decides), and missing from the answer: the caller
-- completes it with complete_batch, as it completes a task others wait for,
-- so no completion ever keeps a limit's slot.
WITH
    /* TEMPLATE: completion(t.limits IS NULL) */,
    /* TEMPLATE: completion_logged */
SELECT d.id, d.limits, 0::bigint AS woke
FROM done d;

-- name: fail_task
-- callers: worker
-- guard: lease
-- plan: generic
-- The attempt ends with an error. Where it goes next is decided here, in one
-- statement, from the row as it stands:
--   a side_effect call with an intent and no response -> needs_reconciliation
--     (first: unblocking must not make an unsettled call claimable; the
--     entry's class decides, as in route_expired)
--   block (missing or revoked credential)          -> blocked
--   no retry, attempts exhausted, or the same error
--   fingerprint max_same_error times in a row      -> dead
--   otherwise                                      -> queued after the backoff delay
-- The delay is %(delay)s where the caller chose one; else the default backoff,
-- computed here from the attempt that failed (the row's attempts, the one
-- count the caller need not read first): d = min(cap, base * 2**(attempts-1)),
-- and the delay d/2 + jitter * d/2 with the caller's draw of jitter in [0, 1).
-- The same arithmetic as leaseq.core.checks.backoff_seconds, step for step
-- (a power of two times a float is exact): the same number for the same draw.
UPDATE leaseq_tasks t
SET status = CASE
        /* TEMPLATE: unsettled_side_effect */
        WHEN %(block)s THEN 'blocked'
        WHEN NOT %(retry)s OR t.attempts >= t.max_attempts THEN 'dead'
        WHEN (CASE WHEN t.error_fingerprint = %(fingerprint)s THEN t.error_streak + 1 ELSE 1 END)
             >= %(max_same_error)s THEN 'dead'
        ELSE 'queued' END,
    error_streak = CASE WHEN t.error_fingerprint = %(fingerprint)s THEN t.error_streak + 1 ELSE 1 END,
    error_fingerprint = %(fingerprint)s,
    last_error = %(error)s,
    available_at = now() + coalesce(
        %(delay)s::float8,
        least(%(backoff_cap)s::float8, %(backoff_base)s::float8 * (1::bigint << least(greatest(t.attempts, 1) - 1, 62))) / 2
        + %(jitter)s::float8 * least(%(backoff_cap)s::float8,
                                     %(backoff_base)s::float8 * (1::bigint << least(greatest(t.attempts, 1) - 1, 62))) / 2
    ) * interval '1 second',
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = now()
WHERE t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
RETURNING t.id, t.status, t.claim_generation, t.attempts, t.max_attempts, t.error_streak, t.available_at,
          t.heartbeat_count, t.last_heartbeat_at, t.longest_heartbeat_gap, t.queue, t.limits, t.units,
          -- why it went where it went, decided here with the status (NULL: queued for a retry)
          CASE t.status
              WHEN 'needs_reconciliation' THEN 'failed with a side-effect intent and no recorded response'
              WHEN 'blocked' THEN 'credential missing or revoked'
              WHEN 'dead' THEN CASE WHEN NOT %(retry)s THEN 'failure marked permanent'
                                    WHEN t.attempts >= t.max_attempts
                                        THEN 'attempts exhausted (' || t.attempts || '/' || t.max_attempts || ')'
                                    ELSE 'same error ' || t.error_streak || ' times in a row' END
          END AS reason;

-- name: retry_task
-- callers: worker
-- guard: lease
-- plan: generic
-- The handler asked to run the task again later (leaseq.Retry): the attempt
-- ends without counting as a failure. It is given back (attempts - 1, so the
-- next claim makes the same attempt again), the error streak is left alone
-- (a retry on request never feeds the same-error quarantine), snoozes counts
-- it, and the task is claimable %(after)s seconds from now by this clock.
-- A side_effect call with an intent and no response sends the task to
-- needs_reconciliation, as a failure would: running it again could repeat
-- the call (the entry's class decides, as in route_expired). Only while snoozes < %(max_snoozes)s: no row back with the lease
-- held means the limit is reached, and the caller records a failure instead.
UPDATE leaseq_tasks t
SET status = CASE
        /* TEMPLATE: unsettled_side_effect */
        ELSE 'queued' END,
    attempts = t.attempts - 1,
    snoozes = t.snoozes + 1,
    available_at = now() + %(after)s::float8 * interval '1 second',
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = now()
WHERE t.id = %(task_id)s
  AND t.snoozes < %(max_snoozes)s
  /* TEMPLATE: lease_guard */
RETURNING t.id, t.status, t.claim_generation, t.attempts, t.snoozes, t.available_at,
          t.heartbeat_count, t.last_heartbeat_at, t.longest_heartbeat_gap, t.queue, t.limits, t.units,
          CASE t.status WHEN 'needs_reconciliation'
              THEN 'retry requested with a side-effect intent and no recorded response' END AS reason;

-- name: expire_lease
-- callers: worker
-- guard: lease
-- Gives a lease back early (worker shutdown): the deadline moves into the
-- past and route_expired then applies the ordinary recovery policy. A lease
-- given back unstarted (its handler never began) gives its attempt back too.
UPDATE leaseq_tasks t
SET lease_expires_at = now() - interval '1 microsecond',
    attempts = CASE WHEN %(unstarted)s::boolean THEN greatest(t.attempts - 1, 0) ELSE t.attempts END,
    updated_at = now()
WHERE t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
RETURNING t.id, t.queue, t.lease_owner, t.claim_generation, t.lease_expires_at, t.claimed_at,
          t.heartbeat_count, t.last_heartbeat_at, t.longest_heartbeat_gap;

-- name: take_limits
-- LIMITS: takes the slots and tokens of claimed tasks, one item per (task,
-- limit key): {"key", "units"}. Not run on PostgreSQL, where claim_batch
-- takes them in its own statement (it must: it locks and judges the rows);
-- written here too so both dialects hold the same statements, and granted
-- to no one (sent by hand, it would take any limit's slots).
WITH taken AS (
    SELECT f.key, count(*) AS tasks, sum(f.units) AS units
    FROM jsonb_to_recordset(%(items)s::jsonb) AS f(key text, units bigint)
    GROUP BY f.key
), held AS (
    SELECT l.key FROM leaseq_limits l WHERE l.key IN (SELECT key FROM taken) ORDER BY l.key FOR UPDATE
)
UPDATE leaseq_limits l
SET running = l.running + CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END,
    tokens = CASE WHEN l.per_second IS NULL THEN l.tokens
                  ELSE least(l.burst, l.tokens + extract(epoch FROM now() - l.refilled_at)::float8 * l.per_second)
                       - CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END END,
    refilled_at = CASE WHEN l.per_second IS NULL THEN l.refilled_at ELSE now() END,
    minute_used = CASE WHEN l.per_minute IS NULL THEN l.minute_used
                       ELSE CASE WHEN l.minute_window = floor(extract(epoch FROM now()) / 60) THEN l.minute_used ELSE 0 END
                            + CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END END,
    minute_window = CASE WHEN l.per_minute IS NULL THEN l.minute_window ELSE floor(extract(epoch FROM now()) / 60) END,
    hour_used = CASE WHEN l.per_hour IS NULL THEN l.hour_used
                     ELSE CASE WHEN l.hour_window = floor(extract(epoch FROM now()) / 3600) THEN l.hour_used ELSE 0 END
                          + CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END END,
    hour_window = CASE WHEN l.per_hour IS NULL THEN l.hour_window ELSE floor(extract(epoch FROM now()) / 3600) END,
    day_used = CASE WHEN l.per_day IS NULL THEN l.day_used
                    ELSE CASE WHEN l.day_window = floor(extract(epoch FROM now()) / 86400) THEN l.day_used ELSE 0 END
                         + CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END END,
    day_window = CASE WHEN l.per_day IS NULL THEN l.day_window ELSE floor(extract(epoch FROM now()) / 86400) END
FROM taken f
WHERE l.key = f.key AND l.key IN (SELECT key FROM held)
RETURNING l.key;

-- name: charge_fair_share
-- FAIR SHARE: charges the keys of claimed tasks, one item per task claimed
-- under a fairness key: {"key", "priority", "start", "cost"}. Not run on PostgreSQL,
-- where claim_batch charges them in its own statement (it must: the order it
-- decides rests on them); written here too so both dialects hold the same
-- statements, and granted to no one (sent by hand, it would move any key's turn).
-- (Each item's base as claim_fair derives it: the key's service read here.)
/* TEMPLATE: charge_fair_share((SELECT i.key, i.priority, i.start - coalesce((SELECT sum(s.service) FROM leaseq_fairness_shares s WHERE s.queue = %(queue)s AND s.priority = i.priority AND s.key = i.key), 0) AS base, i.start AS origin, i.cost FROM jsonb_to_recordset(%(items)s::jsonb) AS i(key text, priority integer, start float8, cost float8)) x) */;

-- name: give_back_slots
-- callers: worker, operator
-- LIMITS: gives back the limit slots of leases that ended in this transaction
-- (fail, release and expiry routing, cancel; complete_batch does it in its
-- own statement), named by task: the keys and units are the task's own. A
-- task gives back once per claim generation: only a task no longer running
-- whose slots_released_generation is not yet its claim_generation, which it
-- then becomes. So a task named twice, or named by a role that never held
-- it, gives nothing back (every lease that ends gave its slots back in the
-- transaction that ended it), and no caller can lower a limit's count of
-- running leases below the truth. Limit rows are locked in key order, as
-- claim_batch locks them. A freed slot wakes the tasks' queues' idle workers
-- (at commit). The rows back are the tasks that gave slots back.
WITH ended AS (
    UPDATE leaseq_tasks t
    SET slots_released_generation = t.claim_generation
    WHERE t.id = ANY(%(task_ids)s::bigint[])
      AND t.status <> 'running' AND t.claim_generation > 0 AND t.limits IS NOT NULL
      AND t.slots_released_generation IS DISTINCT FROM t.claim_generation
    RETURNING t.id, t.claim_generation, t.limits, t.units, t.queue
),
/* TEMPLATE: give_back_slots(ended) */
SELECT e.id, e.limits, e.units, e.queue,
       (SELECT count(*) FROM released) AS released,
       (SELECT count(pg_notify('leaseq_work', w.queue)) FROM (SELECT DISTINCT queue FROM ended) w) AS woke
FROM ended e;

-- name: release_limits
-- LIMITS: gives back slots by limit key, one item per (task, limit key):
-- {"key", "units", "queue"}. Not run on PostgreSQL, where give_back_slots
-- gives them back in its own statement (from the tasks' own keys, once per
-- generation); written here too so both dialects hold the same statements,
-- and granted to no one (sent by hand, it would free any limit's slots).
WITH ended AS (  -- an item is one (task, key): a task of that one key (no attempt's reservation to settle)
    SELECT NULL::bigint AS id, NULL::bigint AS claim_generation, ARRAY[f.key] AS limits, f.units
    FROM jsonb_to_recordset(%(items)s::jsonb) AS f(key text, units bigint)
),
/* TEMPLATE: give_back_slots(ended) */
SELECT (SELECT count(*) FROM released) AS released,
       (SELECT count(pg_notify('leaseq_work', q.queue))
        FROM (SELECT DISTINCT f.queue FROM jsonb_to_recordset(%(items)s::jsonb) AS f(queue text)) q) AS woke;

-- name: limit_wait
-- callers: worker, operator
-- LIMITS: seconds until the emptiest rate bucket holds a token (NULL: none
-- is empty), for a claim that came back short. Not run on PostgreSQL, where
-- claim_batch answers it (its limit_wait column).
SELECT min((1 - least(l.burst, l.tokens + extract(epoch FROM now() - l.refilled_at)::float8 * l.per_second))
           / l.per_second) AS limit_wait
FROM leaseq_limits l
WHERE l.per_second IS NOT NULL
  AND l.tokens + extract(epoch FROM now() - l.refilled_at)::float8 * l.per_second < 1;

-- name: set_limit
-- callers: operator
-- LIMITS: creates or changes a limit. A new bucket starts full; a changed one
-- keeps its tokens (at most the new burst). running is recounted next
-- (count_limit), in the same transaction.
INSERT INTO leaseq_limits AS l (key, max_running, per_second, burst, counts, tokens, refilled_at, changed_at,
                                changed_by, per_minute, per_hour, per_day)
VALUES (%(key)s, %(max_running)s::bigint, %(per_second)s::float8, %(burst)s::float8, %(counts)s,
        coalesce(%(burst)s::float8, 0), now(), now(),
        %(actor)s, %(per_minute)s::bigint, %(per_hour)s::bigint, %(per_day)s::bigint)
ON CONFLICT (key) DO UPDATE
SET max_running = excluded.max_running,
    per_second = excluded.per_second,
    burst = excluded.burst,
    counts = excluded.counts,
    -- WINDOWS: a changed total keeps what its window holds
    per_minute = excluded.per_minute,
    per_hour = excluded.per_hour,
    per_day = excluded.per_day,
    tokens = CASE WHEN excluded.per_second IS NULL THEN 0
                  WHEN l.per_second IS NULL THEN excluded.burst
                  ELSE least(excluded.burst,
                             l.tokens + extract(epoch FROM now() - l.refilled_at)::float8 * l.per_second) END,
    refilled_at = now(),
    changed_at = now(),
    changed_by = excluded.changed_by
RETURNING key;

-- name: count_limit
-- callers: operator, viewer
-- LIMITS: recounts what live leases hold of a limit. Run after set_limit has
-- locked the row, as a statement of its own: its snapshot then sees every
-- claim that took the limit before the lock, and none can take it until the
-- transaction ends. (A limit created while a claim of one of its tasks is in
-- flight may miss that one lease.)
UPDATE leaseq_limits l
SET running = (SELECT coalesce(sum(CASE WHEN l.counts = 'units' THEN t.units ELSE 1 END), 0)
               FROM leaseq_tasks t
               WHERE t.status = 'running' AND t.limits IS NOT NULL AND l.key = ANY(t.limits))
WHERE l.key = %(key)s
RETURNING l.running;

-- name: delete_limit
-- callers: operator
-- LIMITS: tasks naming the key are no longer limited by it.
DELETE FROM leaseq_limits WHERE key = %(key)s RETURNING key;

-- name: list_limits
-- callers: operator, viewer
-- LIMITS: every limit with its usage; tokens refilled to now, by the database clock.
-- WINDOWS: what each window holds now (an older window's count is 0), and the
-- usage settled today (ctx.consume), by the database's UTC day.
SELECT l.key, l.max_running, l.per_second, l.burst, l.counts, l.running,
       CASE WHEN l.per_second IS NULL THEN NULL
            ELSE least(l.burst, l.tokens + extract(epoch FROM now() - l.refilled_at)::float8 * l.per_second) END
           AS tokens,
       (SELECT count(*) FROM leaseq_tasks t
        WHERE t.status = 'running' AND t.limits IS NOT NULL AND l.key = ANY(t.limits)) AS leases,
       l.changed_at, l.changed_by, l.per_minute, l.per_hour, l.per_day,
       CASE WHEN l.minute_window = floor(extract(epoch FROM now()) / 60) THEN l.minute_used ELSE 0 END AS minute_used,
       CASE WHEN l.hour_window = floor(extract(epoch FROM now()) / 3600) THEN l.hour_used ELSE 0 END AS hour_used,
       CASE WHEN l.day_window = floor(extract(epoch FROM now()) / 86400) THEN l.day_used ELSE 0 END AS day_used,
       coalesce((SELECT sum(s.units)::bigint FROM leaseq_limit_spend s  -- every tenant's (schema 40)
                 WHERE s.key = l.key AND s.day = (now() AT TIME ZONE 'UTC')::date), 0) AS spent_today
FROM leaseq_limits l
WHERE %(key)s::text IS NULL OR l.key = %(key)s
ORDER BY l.key;

-- name: get_effect
-- callers: worker, operator, viewer
-- plan: generic
SELECT * FROM leaseq_effects WHERE task_id = %(task_id)s AND idempotency_key = %(idempotency_key)s;

-- name: list_effects
-- callers: worker, operator, viewer
SELECT * FROM leaseq_effects WHERE task_id = %(task_id)s ORDER BY id;

-- name: insert_effect
-- callers: worker
-- plan: generic
-- guard: none -- runs after lock_lease has checked and locked the lease in the same transaction
-- THE DECLARED-EFFECT GUARD, the one place it is written (no row back: refused,
-- nothing written; leaseq.engine.effects.effect_refusal says why). A read_only
-- tool call (tool: the caller gave the entry's class; a lookup, a model call)
-- takes no action: any task may make one, it names no resource and gets no
-- action token. Every other entry is an action of its task: the task is not
-- read_only, declared the action (or declared none), and declared the
-- resource the entry names (a task that declared none names none).
INSERT INTO leaseq_effects (task_id, generation, worker_id, action, idempotency_key, effect, args_digest, resource)
SELECT %(task_id)s, %(generation)s, %(worker_id)s, %(action)s, %(idempotency_key)s, %(effect)s,
       %(args_digest)s, %(resource)s::text
FROM leaseq_tasks t
WHERE t.id = %(task_id)s
  AND ((%(effect)s = 'read_only' AND %(tool)s::boolean AND %(resource)s::text IS NULL)
       OR (t.effect <> 'read_only'
           AND (t.actions IS NULL OR t.actions ? %(action)s::text)
           AND (%(resource)s::text IS NULL OR coalesce(t.resources ? %(resource)s::text, false))))
RETURNING *;

-- name: rebind_effect
-- callers: worker
-- plan: generic
-- guard: none -- runs after lock_lease has checked and locked the lease in the same transaction
-- A later attempt takes over an intent that never got a response (same key).
UPDATE leaseq_effects
SET generation = %(generation)s, worker_id = %(worker_id)s, status = 'pending',
    intent_at = now(), response = NULL, response_at = NULL
WHERE id = %(effect_id)s AND task_id = %(task_id)s
RETURNING *;

-- name: mint_action_token
-- callers: worker
-- guard: lease
-- plan: generic
-- THE ACTION TOKEN'S MINT, the one place it is written: the claims of a
-- reference token (leaseq.fencing.reference), whose SHA-256 alone is kept.
-- Run in the transaction that began (or re-read) the effect entry, after
-- lock_lease; the statement holds itself to the same rules, so a worker role
-- that calls the function directly is too: a live lease of this worker, the
-- entry belongs to the task and to this attempt (or holds a recorded
-- response), it is an action (not a read_only call), the task declared the
-- action (or none) and the resource the entry names. Every claim is read
-- from the rows, none from the caller, whose only inputs are the hash of the
-- secret it drew and the lifetime (capped by the lease deadline, by the
-- database's clock). No row back: refused, nothing written.
INSERT INTO leaseq_action_tokens (token_hash, effect_id, task_id, generation, claim_epoch, action, idempotency_key,
                                  resource, issued_at, expires_at, queue)
SELECT %(token_hash)s::text, e.id, t.id, t.claim_generation, t.claim_epoch, e.action, t.id::text || ':' || e.idempotency_key,
       e.resource, clock_timestamp(),
       least(t.lease_expires_at, clock_timestamp() + make_interval(secs => %(ttl_seconds)s::float8)), t.queue
FROM leaseq_effects e JOIN leaseq_tasks t ON t.id = e.task_id
WHERE e.id = %(effect_id)s
  AND t.id = %(task_id)s
  AND (e.generation = t.claim_generation OR e.status = 'done')
  AND e.effect <> 'read_only'
  AND t.effect <> 'read_only'
  AND (t.actions IS NULL OR t.actions ? e.action)
  AND (e.resource IS NULL OR coalesce(t.resources ? e.resource, false))
  /* TEMPLATE: lease_guard */
RETURNING id, issued_at, expires_at;

-- name: verify_action_token
-- callers: verifier
-- A downstream's online check of a reference token (leaseq.fencing.QueueVerifier),
-- the verifier group's only function. One row, always: refusal is NULL and
-- the claims are given only when the hash matches the token's id, the token
-- is unexpired, for the action, downstream key and resource asked about
-- (NULL: not asked; a token naming no resource passes, the caller decides),
-- and its attempt still holds a live lease (running, same generation and
-- lease epoch, lease unexpired, by the database's clock): a cancelled, revoked
-- or superseded attempt is refused at once, and so is one of a history cut by
-- a failover whose token survived in the new one. A wrong secret and an unknown id read alike.
SELECT r.refusal,
       CASE WHEN r.refusal IS NULL THEN r.task_id END AS task_id,
       CASE WHEN r.refusal IS NULL THEN r.generation END AS generation,
       CASE WHEN r.refusal IS NULL THEN r.claim_epoch END AS claim_epoch,
       CASE WHEN r.refusal IS NULL THEN r.action END AS action,
       CASE WHEN r.refusal IS NULL THEN r.idempotency_key END AS idempotency_key,
       CASE WHEN r.refusal IS NULL THEN r.resource END AS resource,
       CASE WHEN r.refusal IS NULL THEN r.issued_at END AS issued_at,
       CASE WHEN r.refusal IS NULL THEN r.expires_at END AS expires_at,
       CASE WHEN r.refusal IS NULL THEN r.lease_expires_at END AS lease_expires_at
FROM (SELECT CASE WHEN k.id IS NULL THEN 'unknown_token'
                  WHEN k.expires_at < clock_timestamp() THEN 'expired'
                  WHEN %(action)s::text IS NOT NULL AND k.action <> %(action)s::text THEN 'wrong_action'
                  WHEN %(idempotency_key)s::text IS NOT NULL AND k.idempotency_key <> %(idempotency_key)s::text
                      THEN 'wrong_idempotency_key'
                  WHEN %(resource)s::text IS NOT NULL AND k.resource <> %(resource)s::text THEN 'wrong_resource'
                  WHEN t.claim_generation IS DISTINCT FROM k.generation
                       OR t.claim_epoch IS DISTINCT FROM k.claim_epoch THEN 'superseded'
                  WHEN t.status <> 'running' OR t.lease_expires_at < clock_timestamp() THEN 'lease_ended'
             END AS refusal,
             k.task_id, k.generation, k.claim_epoch, k.action, k.idempotency_key, k.resource, k.issued_at,
             k.expires_at, t.lease_expires_at
      FROM (SELECT 1) AS one
      LEFT JOIN leaseq_action_tokens k ON k.id = %(token_id)s AND k.token_hash = %(token_hash)s::text
      LEFT JOIN leaseq_tasks t ON t.id = k.task_id) AS r;

-- name: adjust_open_effects
-- callers: worker, operator
-- plan: generic
UPDATE leaseq_tasks SET open_effects = open_effects + %(delta)s, updated_at = now()
WHERE id = %(task_id)s;

-- name: finish_effect
-- callers: worker
-- plan: generic
-- Only the generation that recorded the intent may record its response.
UPDATE leaseq_effects
SET status = 'done', response = %(response)s::jsonb, response_at = now()
WHERE id = %(effect_id)s AND task_id = %(task_id)s AND generation = %(generation)s AND status = 'pending'
RETURNING *;

-- name: settle_open_effects
-- callers: worker, operator
-- An operator's reconciliation settles every intent still without a response.
UPDATE leaseq_effects SET status = 'reconciled', response_at = now()
WHERE task_id = %(task_id)s AND status = 'pending'
RETURNING id, action, idempotency_key, generation;

-- name: cancel_task
-- callers: operator
-- Operator decision: the task stays cancelled. Clearing the lease makes the
-- holder's next guarded call fail; expiry never revives a cancelled task.
UPDATE leaseq_tasks
SET status = 'cancelled', last_error = %(reason)s, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = %(task_id)s AND status NOT IN ('completed', 'cancelled', 'denied')
RETURNING id, status, claim_generation;

-- name: tasks_where
-- callers: operator
-- The tasks a bulk operator action acts on (Queue.redrive, Queue.cancel_where):
-- in one of the statuses, and each other filter given (NULL: any): the
-- queue, the kind, text in the last error (case aside), unchanged for
-- older_than seconds. Oldest first, at most row_limit, locked for the
-- action's transaction.
SELECT t.* FROM leaseq_tasks t
WHERE t.status = ANY(%(statuses)s::text[])
  AND (%(queue)s::text IS NULL OR t.queue = %(queue)s::text)
  AND (%(kind)s::text IS NULL OR t.kind = %(kind)s::text)
  AND (%(error)s::text IS NULL OR strpos(lower(t.last_error), lower(%(error)s::text)) > 0)
  AND (%(older_than)s::float8 IS NULL OR t.updated_at < now() - %(older_than)s::float8 * interval '1 second')
ORDER BY t.id
LIMIT %(row_limit)s
FOR UPDATE;

-- name: set_task_status
-- callers: operator
-- Operator moves between resting states (reconcile, unblock, requeue).
UPDATE leaseq_tasks
SET status = %(status)s,
    result = CASE WHEN %(set_result)s THEN %(result)s::jsonb ELSE result END,
    attempts = CASE WHEN %(reset_attempts)s THEN 0 ELSE attempts END,
    error_streak = CASE WHEN %(reset_attempts)s THEN 0 ELSE error_streak END,
    open_effects = CASE WHEN %(from_status)s = 'needs_reconciliation' THEN 0 ELSE open_effects END,
    available_at = now(),
    updated_at = now()
WHERE id = %(task_id)s AND status = %(from_status)s
RETURNING id, status, claim_generation, attempts;

-- name: insert_event
-- callers: worker, operator
-- guard: none -- evidence, written in the transaction of the operation it records
-- plan: generic
INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
VALUES (%(task_id)s, %(type)s, %(generation)s, %(worker_id)s, %(detail)s::jsonb);

-- name: insert_events
-- callers: worker, operator
-- plan: generic
-- insert_event for many events in one statement, in the document's order.
INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
SELECT e.task_id, e.type, e.generation, e.worker_id, e.detail
FROM jsonb_to_recordset(%(events)s::jsonb) AS e(task_id bigint, type text, generation bigint, worker_id text,
                                                 detail jsonb);

-- name: report_loss
-- callers: worker
-- guard: none -- evidence of a lease already lost; conditioned on the events of that generation
-- A worker's own account of losing a lease: one per lost generation. Written
-- only when this worker was issued the generation (its "claimed" event), the
-- generation did not end by the holder's own hand (completed, failed,
-- released, suspended in a durable wait, diverged from its recorded run) and no loss was reported for it yet. The caller locks the task
-- row first (lock_task), so two reports of one generation run one after the
-- other and the second sees the first. No row back: nothing was written.
INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
SELECT %(task_id)s, 'lease_lost', %(generation)s, %(worker_id)s, %(detail)s::jsonb
WHERE EXISTS (SELECT 1 FROM leaseq_events e
              WHERE e.task_id = %(task_id)s AND e.generation = %(generation)s
                AND e.type = 'claimed' AND e.worker_id = %(worker_id)s)
  AND NOT EXISTS (SELECT 1 FROM leaseq_events e
                  WHERE e.task_id = %(task_id)s AND e.generation = %(generation)s
                    AND e.type IN ('completed', 'failed', 'lease_released', 'suspended', 'diverged', 'lease_lost'))
RETURNING id;

-- name: generation_outcome
-- callers: worker, operator, viewer
-- guard: none -- a read of a generation's events (why report_loss wrote nothing)
-- Why report_loss wrote nothing: was the generation this worker's, and what
-- ended it (the first of completed, failed, lease_released, suspended, diverged, lease_lost)?
SELECT EXISTS (SELECT 1 FROM leaseq_events
               WHERE task_id = %(task_id)s AND type = 'claimed'
                 AND generation = %(generation)s AND worker_id = %(worker_id)s) AS held,
       (SELECT type FROM leaseq_events
        WHERE task_id = %(task_id)s AND generation = %(generation)s
          AND type IN ('completed', 'failed', 'lease_released', 'suspended', 'diverged', 'lease_lost')
        ORDER BY id LIMIT 1) AS ended;

-- name: list_events
-- callers: worker, operator, viewer
-- A task's evidence trail, in order. Its first entry, "enqueued", is the task
-- row itself: what an enqueue records (queue, kind, effect, idempotency key,
-- priority and when) lives in columns that never change, so it is not stored
-- a second time. That entry has id 0; stored events count from 1.
SELECT 0::bigint AS id, t.id AS task_id, 'enqueued' AS type, NULL::bigint AS generation,
       NULL::text AS worker_id, t.created_at AS at,
       jsonb_build_object('queue', t.queue, 'kind', t.kind, 'effect', t.effect,
                          'idempotency_key', t.idempotency_key, 'priority', t.priority) AS detail
FROM leaseq_tasks t WHERE t.id = %(task_id)s
UNION ALL
SELECT id, task_id, type, generation, worker_id, at, detail FROM leaseq_events WHERE task_id = %(task_id)s
ORDER BY id;

-- name: list_trails
-- callers: operator, viewer
-- Every task's evidence trail (the newest %(limit)s tasks'), in one statement:
-- the rows list_events reads for one task, for each of them, ordered by task
-- and then as list_events orders them (a replay of every trail against the
-- lease model reads them all, where one read per task costs a transaction
-- each). The queue column cuts a scoped caller's rows to its queues.
WITH t AS (SELECT id, queue, kind, effect, idempotency_key, priority, created_at
           FROM leaseq_tasks ORDER BY id DESC LIMIT %(limit)s)
SELECT 0::bigint AS id, t.id AS task_id, 'enqueued' AS type, NULL::bigint AS generation,
       NULL::text AS worker_id, t.created_at AS at,
       jsonb_build_object('queue', t.queue, 'kind', t.kind, 'effect', t.effect,
                          'idempotency_key', t.idempotency_key, 'priority', t.priority) AS detail,
       t.queue
FROM t
UNION ALL
SELECT e.id, e.task_id, e.type, e.generation, e.worker_id, e.at, e.detail, t.queue
FROM leaseq_events e JOIN t ON t.id = e.task_id
ORDER BY task_id, id;

-- name: set_paused
-- callers: operator
-- A queue's off-switch, for a known queue only unless %(create)s: one that has had a task
-- (leaseq_tasks_queue_key leads with the queue) or has a switch already. No row: unknown,
-- nothing written.
INSERT INTO leaseq_queues (name, paused, changed_at, changed_by)
SELECT %(queue)s, %(paused)s, now(), %(actor)s
WHERE %(create)s OR EXISTS (SELECT 1 FROM leaseq_queues WHERE name = %(queue)s)
                 OR EXISTS (SELECT 1 FROM leaseq_tasks WHERE queue = %(queue)s)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, changed_at = excluded.changed_at,
                                 changed_by = excluded.changed_by
RETURNING name, paused, changed_at, changed_by;

-- name: known_queues
-- callers: operator, viewer
-- The queues set_paused takes without create, by name, at most %(limit)s: those with a
-- switch, and those that have had a task, read by skipping from one queue name to the next
-- along leaseq_tasks_queue_key (one index probe per queue, not a scan of every task).
WITH RECURSIVE seen(name) AS (
    SELECT min(queue) FROM leaseq_tasks
    UNION ALL
    SELECT (SELECT min(t.queue) FROM leaseq_tasks t WHERE t.queue > seen.name) FROM seen
    WHERE seen.name IS NOT NULL
)
SELECT name FROM seen WHERE name IS NOT NULL
UNION
SELECT name FROM leaseq_queues
ORDER BY name
LIMIT %(limit)s;

-- name: list_queues
-- callers: operator, viewer
SELECT name, paused, changed_at, changed_by FROM leaseq_queues ORDER BY name;

-- name: stats
-- callers: operator, viewer
-- Counts by queue and status; the age of the oldest task that is due and
-- waiting; leases past their deadline that no claimer has routed yet.
SELECT queue, status, count(*) AS count,
       extract(epoch FROM now() - min(available_at) FILTER (WHERE status = 'queued' AND available_at <= now()))::float8
           AS oldest_queued_seconds,
       count(*) FILTER (WHERE status = 'running' AND lease_expires_at < now()) AS expired_leases
FROM leaseq_tasks
GROUP BY queue, status
ORDER BY queue, status;


-- ============================================================================
-- Approval gates (leaseq.engine.approvals)
-- ============================================================================
-- None of these is lease-backed: a gated task holds no lease until it is
-- approved and claimed.

-- name: hold_for_approval
-- callers: worker, operator
-- A task just inserted (in this transaction, so no worker has seen it yet)
-- waits for an operator instead of the queue.
UPDATE leaseq_tasks SET status = 'awaiting_approval', updated_at = now()
WHERE id = %(task_id)s AND status = 'queued'
RETURNING *;

-- name: approval_request
-- callers: worker, operator
-- What the approver will be shown (its digest), who asked, and until when.
-- requested_worker and requested_token: the requester's identities, which
-- may not decide the request.
INSERT INTO leaseq_approvals (task_id, digest, requested_by, deadline_at, requested_worker, requested_token)
VALUES (%(task_id)s, %(digest)s, %(requested_by)s,
        CASE WHEN %(deadline)s::float8 IS NULL THEN NULL
             ELSE now() + %(deadline)s::float8 * interval '1 second' END,
        %(requested_worker)s::text, %(requested_token)s::text)
RETURNING *;

-- name: get_approval
-- callers: worker, operator, viewer
-- The task's request a decision is for: its undecided one (a task has at most
-- one, leaseq_approvals_open), else the latest (a request for more budget
-- comes after the gate the task was enqueued with). The gate's row stays.
SELECT * FROM leaseq_approvals WHERE task_id = %(task_id)s
ORDER BY decision IS NOT NULL, request <> 'budget'
LIMIT 1;

-- name: decide_approval
-- callers: operator
-- One decision per request: a second decision (or a deadline racing an
-- operator) finds the row decided and changes nothing. The deadline's own
-- denial (a person's decision is decide_approval_in_time), timed when made.
UPDATE leaseq_approvals
SET decision = %(decision)s, decided_by = %(decided_by)s, decided_via = %(decided_via)s, note = %(note)s,
    decided_at = clock_timestamp()
WHERE task_id = %(task_id)s AND decision IS NULL
RETURNING *;

-- name: approvals_due
-- callers: operator
-- Undecided requests whose deadline has passed, their tasks locked for the
-- denial. SKIP LOCKED: an operator deciding one now keeps it.
SELECT t.id FROM leaseq_approvals a JOIN leaseq_tasks t ON t.id = a.task_id
WHERE a.decision IS NULL AND a.deadline_at <= now() AND t.status = 'awaiting_approval'
ORDER BY a.deadline_at
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED;

-- name: list_awaiting_approval
-- callers: operator, viewer
-- The approvals inbox: each waiting task with its request, oldest first.
SELECT t.*, a.digest AS approval_digest, a.requested_by AS approval_requested_by,
       a.requested_at AS approval_requested_at, a.deadline_at AS approval_deadline_at,
       a.requested_worker AS approval_requested_worker, a.requested_token AS approval_requested_token,
       a.reason AS approval_reason, a.detail
FROM leaseq_tasks t JOIN leaseq_approvals a ON a.task_id = t.id
WHERE t.status = 'awaiting_approval' AND a.decision IS NULL
  AND (%(queue)s::text IS NULL OR t.queue = %(queue)s)
ORDER BY t.id
LIMIT %(limit)s;

-- name: decide_approval_in_time
-- callers: operator
-- A person's decision, recorded only while the request's deadline has not
-- passed by the database clock, read once as the statement judges the row
-- (clock_timestamp(), not the transaction's start: a decision that waited
-- for the task's lock is judged when it is made). That reading is the
-- decision's time, decided_at, which the claim checks against the deadline.
-- No row back: the deadline has passed (the caller holds the task's lock and
-- read the request undecided).
UPDATE leaseq_approvals a
SET decision = %(decision)s, decided_by = %(decided_by)s, decided_via = %(decided_via)s, note = %(note)s,
    decided_at = c.at
FROM (SELECT clock_timestamp() AS at) c
WHERE a.task_id = %(task_id)s AND a.decision IS NULL AND (a.deadline_at IS NULL OR c.at < a.deadline_at)
RETURNING a.*;

-- name: late_approvals
-- callers: operator
-- Queued tasks approved at or after their approval deadline, which
-- claim_batch never hands out: only a decision written by hand, or by an
-- older leaseq, can be (see decide_approval_in_time). The deadline job ends
-- them denied. Read from leaseq_approvals_late; the tasks locked, SKIP LOCKED.
SELECT t.id FROM leaseq_approvals a JOIN leaseq_tasks t ON t.id = a.task_id
WHERE a.decision = 'approved' AND a.decided_at >= a.deadline_at AND t.status = 'queued'
ORDER BY t.id
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED;

-- name: set_parent_task
-- callers: worker
-- An intent's child task, inserted in this transaction: the task whose
-- handler recorded it.
UPDATE leaseq_tasks SET parent_task_id = %(parent_task_id)s,
    -- TREE BUDGETS (schema 34): the budgets that cover the parent cover its intent
    budget_owners = (SELECT p.budget_owners FROM leaseq_tasks p WHERE p.id = %(parent_task_id)s)
WHERE id = %(task_id)s
RETURNING *;

-- name: lock_intents
-- callers: operator
-- The unfinished intents the given tasks recorded (ctx.intend), locked in id
-- order after their parents (the caller holds those): a cancelled parent's
-- intents that have not started are cancelled with it (cancel_intents), the
-- others are marked (mark_parent_cancelled). Read from leaseq_tasks_parent.
SELECT id, parent_task_id, status, claim_generation, lease_owner FROM leaseq_tasks
WHERE parent_task_id IS NOT NULL AND parent_task_id = ANY(%(task_ids)s::bigint[])
  AND status NOT IN ('completed', 'cancelled', 'denied', 'expired')
ORDER BY id
FOR UPDATE;

-- name: cancel_intents
-- callers: operator
-- Intents that have not started (queued, waiting, awaiting approval) are
-- cancelled with their parent. None holds a lease or a limit slot.
UPDATE leaseq_tasks
SET status = 'cancelled', last_error = 'cancelled: its parent task ' || parent_task_id || ' was cancelled',
    parent_cancelled_at = now(), updated_at = now()
WHERE id = ANY(%(task_ids)s::bigint[]) AND status IN ('queued', 'waiting', 'awaiting_approval')
RETURNING id, parent_task_id, status;

-- name: mark_parent_cancelled
-- callers: operator
-- Intents that started (running: left to their lease) or wait for a person
-- (blocked, dead, needs_reconciliation) when their parent is cancelled: the
-- time their executor, or the person, can read.
UPDATE leaseq_tasks SET parent_cancelled_at = now()
WHERE id = ANY(%(task_ids)s::bigint[]) AND parent_cancelled_at IS NULL
RETURNING id;

-- ============================================================================
-- Service: tokens, access and retention
-- ============================================================================
-- Used by leaseq.auth (credentials, audit), Queue.prune and the service's
-- metrics. None of these writes on the strength of a lease: lease-backed
-- writes stay in the queries above.

-- name: token_insert
-- Only the hash of the token is stored; the caller shows the token once.
INSERT INTO leaseq_tokens (id, name, role, secret_hash, queues, read_payloads, own_intents, created_by,
                           expires_at)
VALUES (%(token_id)s, %(name)s, %(role)s, %(secret_hash)s, %(queues)s, %(read_payloads)s, %(own_intents)s,
        %(created_by)s,
        CASE WHEN %(expires_in)s::float8 IS NULL THEN NULL
             ELSE now() + %(expires_in)s::float8 * interval '1 second' END)
RETURNING *, false AS expired;

-- name: token_get
-- plan: generic
-- Expiry is judged by the database clock, like leases. touch_due: token_touch
-- would write (so a verification that would not touch skips the statement).
SELECT t.*, (t.expires_at IS NOT NULL AND t.expires_at <= now()) AS expired,
       (t.last_used_at IS NULL OR t.last_used_at < now() - interval '60 seconds') AS touch_due
FROM leaseq_tokens t WHERE t.id = %(token_id)s;

-- name: token_hashes
-- Every token's id and stored hash (both never change): the service refuses a token whose
-- id is not among them, or whose hash differs, without looking it up (see leaseq.service.access).
SELECT t.id, t.secret_hash FROM leaseq_tokens t;

-- name: token_touch
-- Records use at most once a minute per token, so verification rarely writes.
UPDATE leaseq_tokens SET last_used_at = now()
WHERE id = %(token_id)s AND (last_used_at IS NULL OR last_used_at < now() - interval '60 seconds');

-- name: token_list
SELECT t.id, t.name, t.role, t.queues, t.read_payloads, t.own_intents, t.created_at, t.created_by, t.expires_at,
       t.revoked_at, t.revoked_by, t.last_used_at,
       (t.expires_at IS NOT NULL AND t.expires_at <= now()) AS expired,
       (SELECT count(*) FROM leaseq_workers w WHERE w.token_id = t.id) AS workers
FROM leaseq_tokens t ORDER BY t.created_at, t.id;

-- name: token_revoke
UPDATE leaseq_tokens SET revoked_at = now(), revoked_by = %(actor)s
WHERE id = %(token_id)s AND revoked_at IS NULL
RETURNING id;

-- name: token_revoke_workers
-- Revoking a token revokes every worker it registered: claim_batch refuses
-- revoked workers, and the caller ends their leases (end_worker_leases).
UPDATE leaseq_workers SET revoked_at = now()
WHERE token_id = %(token_id)s AND revoked_at IS NULL
RETURNING id;

-- name: link_worker_token
-- guard: none -- links a new worker to its credential; no lease involved
UPDATE leaseq_workers SET token_id = %(token_id)s WHERE id = %(worker_id)s RETURNING id;

-- name: worker_token
-- guard: none -- a read of the worker's credential (authorization)
SELECT id, token_id, revoked_at FROM leaseq_workers WHERE id = %(worker_id)s;

-- name: token_held_task
-- Whether a worker of this token holds or has held a lease on the task (a
-- worker token reads those tasks only): its "claimed" events name the worker.
SELECT EXISTS (SELECT 1 FROM leaseq_events e JOIN leaseq_workers w ON w.id = e.worker_id
               WHERE e.task_id = %(task_id)s AND e.type = 'claimed'
                 AND w.token_id = %(token_id)s) AS held;

-- name: audit_insert
-- callers: operator
INSERT INTO leaseq_audit (actor, action, target, detail)
VALUES (%(actor)s, %(action)s, %(target)s, %(detail)s::jsonb);

-- name: audit_list
-- callers: operator, viewer
SELECT id, at, actor, action, target, detail FROM leaseq_audit ORDER BY id DESC LIMIT %(limit)s;

-- name: session_insert
-- A dashboard session made from a verified token; the id is stored hashed.
INSERT INTO leaseq_sessions (id_hash, token_id, expires_at)
VALUES (%(id_hash)s, %(token_id)s, now() + %(seconds)s::float8 * interval '1 second')
RETURNING token_id, expires_at;

-- name: session_get
-- The session and the token it was made from, judged by the database clock:
-- a session is only as good as its token (revoked or expired ends it too).
SELECT t.*, (t.expires_at IS NOT NULL AND t.expires_at <= now()) AS expired,
       s.expires_at AS session_expires_at, (s.expires_at <= now()) AS session_expired
FROM leaseq_sessions s JOIN leaseq_tokens t ON t.id = s.token_id
WHERE s.id_hash = %(id_hash)s;

-- name: session_delete
-- Logout: the session ends for every replica at once.
DELETE FROM leaseq_sessions WHERE id_hash = %(id_hash)s;

-- name: session_delete_for_token
-- Revoking a token ends every dashboard session made from it.
DELETE FROM leaseq_sessions WHERE token_id = %(token_id)s RETURNING id_hash;

-- name: session_prune
-- Expired sessions are dropped at the next login.
DELETE FROM leaseq_sessions WHERE expires_at <= now();

-- name: prune_finished_ids
-- callers: operator
-- Ended tasks (every ended status: completed, cancelled, dead, denied,
-- expired) untouched since the cut-off, in batches. Blocked,
-- needs_reconciliation and the live statuses are never pruned.
SELECT id FROM leaseq_tasks
WHERE status IN ('completed', 'cancelled', 'dead', 'denied', 'expired') AND updated_at < now() - %(older_than)s::float8 * interval '1 second'
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: keep_evidence
-- callers: operator
-- The evidence record a pruned task leaves: its trail (the "enqueued" entry
-- made from the row, then every event), each detail reduced to the keys named
-- in kept_keys (leaseq.engine.schema.EVIDENCE_KEYS: never user data).
INSERT INTO leaseq_evidence (task_id, queue, kind, task_status, ended_at, event_id, type, generation, worker_id,
                             at, detail)
SELECT t.id, t.queue, t.kind, t.status, t.updated_at, NULL::bigint, 'enqueued', NULL::bigint, NULL::text,
       t.created_at, jsonb_build_object('effect', t.effect, 'priority', t.priority)
FROM leaseq_tasks t
WHERE t.id = ANY(%(task_ids)s::bigint[]) AND t.status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
UNION ALL
SELECT t.id, t.queue, t.kind, t.status, t.updated_at, e.id, e.type, e.generation, e.worker_id, e.at,
       (SELECT coalesce(jsonb_object_agg(d.key, d.value), '{}'::jsonb)
        FROM jsonb_each(e.detail) AS d WHERE d.key = ANY(%(kept_keys)s::text[]))
FROM leaseq_events e JOIN leaseq_tasks t ON t.id = e.task_id
WHERE e.task_id = ANY(%(task_ids)s::bigint[]) AND t.status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
ORDER BY 1, 6 NULLS FIRST
RETURNING id;

-- name: prune_events
-- callers: operator
DELETE FROM leaseq_events WHERE task_id = ANY(%(task_ids)s::bigint[]) RETURNING id;

-- name: prune_effects
-- callers: operator
DELETE FROM leaseq_effects WHERE task_id = ANY(%(task_ids)s::bigint[]) RETURNING id;

-- name: prune_tasks
-- callers: operator
-- Approvals, dependencies and action tokens go with the row (ON DELETE CASCADE).
DELETE FROM leaseq_tasks WHERE id = ANY(%(task_ids)s::bigint[]) AND status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
RETURNING id;

-- name: scrub_finished_ids
-- callers: operator
-- Ended tasks past the payload cut-off whose user data is not cleared yet.
-- updated_at is left alone by the scrub, so the task's own retention clock
-- does not restart.
SELECT id FROM leaseq_tasks
WHERE status IN ('completed', 'cancelled', 'dead', 'denied', 'expired') AND updated_at < now() - %(older_than)s::float8 * interval '1 second'
  AND scrubbed_at IS NULL
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: scrub_tasks
-- callers: operator
UPDATE leaseq_tasks SET payload = 'null'::jsonb, result = NULL, last_error = NULL, scrubbed_at = now()
WHERE id = ANY(%(task_ids)s::bigint[]) AND status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
RETURNING id;

-- name: scrub_effects
-- callers: operator
-- Model and tool output, an intent's recorded answer, a tool call's argument digest.
UPDATE leaseq_effects SET response = NULL, args_digest = NULL
WHERE task_id = ANY(%(task_ids)s::bigint[]) AND (response IS NOT NULL OR args_digest IS NOT NULL)
RETURNING id;

-- name: scrub_signals
-- callers: operator
-- What a person or a system sent the task with a signal.
UPDATE leaseq_signals SET payload = NULL
WHERE task_id = ANY(%(task_ids)s::bigint[]) AND payload IS NOT NULL
RETURNING id;

-- name: scrub_approvals
-- callers: operator
-- The decision and the decider stay; the free-text note goes, and so does the
-- digest (unsalted: a payload can be guessed from it).
UPDATE leaseq_approvals SET note = NULL, digest = 'cleared'
WHERE task_id = ANY(%(task_ids)s::bigint[]) AND (note IS NOT NULL OR digest <> 'cleared')
RETURNING task_id;

-- name: scrub_events
-- callers: operator
UPDATE leaseq_events
SET detail = (SELECT coalesce(jsonb_object_agg(d.key, d.value), '{}'::jsonb)
        FROM jsonb_each(leaseq_events.detail) AS d WHERE d.key = ANY(%(kept_keys)s::text[]))
WHERE task_id = ANY(%(task_ids)s::bigint[])
RETURNING id;

-- name: scrub_audit
-- callers: operator
-- The audit entries of these tasks keep who did what, not the notes and
-- reasons typed with it.
UPDATE leaseq_audit
SET detail = (SELECT coalesce(jsonb_object_agg(d.key, d.value), '{}'::jsonb)
        FROM jsonb_each(leaseq_audit.detail) AS d WHERE d.key = ANY(%(kept_keys)s::text[]))
WHERE target = ANY(SELECT 'task:' || x FROM unnest(%(task_ids)s::bigint[]) AS x)
RETURNING id;

-- name: prune_evidence
-- callers: operator
-- Evidence records past their own retention, counted from when the task ended.
DELETE FROM leaseq_evidence
WHERE id IN (SELECT id FROM leaseq_evidence
             WHERE ended_at < now() - %(older_than)s::float8 * interval '1 second'
             ORDER BY id
             LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: prune_audit
-- callers: operator
-- Audit entries past the evidence record's retention (the audit log is evidence too:
-- who did what, when), oldest first, counted from when each was written.
DELETE FROM leaseq_audit
WHERE id IN (SELECT id FROM leaseq_audit
             WHERE at < now() - %(older_than)s::float8 * interval '1 second'
             ORDER BY id
             LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: prune_flow_keys
-- callers: operator
-- The lock rows of singleton and debounce keys (leaseq_flow_keys) no enqueue
-- has named within the retention: each carries nothing but the lock an
-- enqueue of its key takes (flow_lock), which the next one makes again. A row
-- an enqueue holds now is skipped, never waited for; one deleted under a
-- waiting enqueue is inserted again by its upsert.
DELETE FROM leaseq_flow_keys
WHERE (scope, queue, key) IN (SELECT f.scope, f.queue, f.key FROM leaseq_flow_keys f
                              WHERE f.locked_at < now() - %(older_than)s::float8 * interval '1 second'
                              ORDER BY f.locked_at
                              LIMIT %(limit)s
                              FOR UPDATE SKIP LOCKED)
RETURNING scope;

-- name: prune_fairness
-- callers: operator
-- The fair-share rows of keys idle for the retention (all the shares of each,
-- leaseq_fairness_shares; leaseq_fairness is their sum per key): no claim has
-- served the key at that priority within older_than seconds, and no task of
-- it is queued in the row's queue ('': the tasks without a key). A key back
-- after its shares went starts level with the keys being served, as a key back
-- from idle does with its shares kept: the claim starts a key never more than
-- one task's cost behind the priority's virtual time. That time is the latest
-- vstart of the priority's keys, so the key holding it is kept and the
-- priority's clock never runs back. A share a claim is charging now is
-- deleted once that claim commits; its key, served again, starts level.
-- One row per key whose shares went.
WITH gone AS (
DELETE FROM leaseq_fairness_shares s
USING (
    SELECT f.queue, f.priority, f.key FROM leaseq_fairness f
    WHERE f.served_at < now() - %(older_than)s::float8 * interval '1 second'
      AND f.vstart < (SELECT max(m.vstart) FROM leaseq_fairness_shares m
                      WHERE m.queue = f.queue AND m.priority = f.priority)
      -- a probe of leaseq_tasks_fair (or of the claimable index) per row: a scalar
      -- subquery, which the planner keeps as one (an anti-join of every queued
      -- task of the queue with every row of it, as NOT EXISTS may be planned, is
      -- quadratic in the keys)
      AND (SELECT t.id FROM leaseq_tasks t
           WHERE t.status = 'queued' AND t.queue = f.queue AND t.fairness_key = f.key LIMIT 1) IS NULL
      AND (f.key <> '' OR (SELECT t.id FROM leaseq_tasks t
                           WHERE t.status = 'queued' AND t.queue = f.queue AND t.fairness_key IS NULL
                           LIMIT 1) IS NULL)
    ORDER BY f.served_at
    LIMIT %(limit)s) idle
WHERE s.queue = idle.queue AND s.priority = idle.priority AND s.key = idle.key
RETURNING s.queue, s.priority, s.key)
SELECT DISTINCT key, queue, priority FROM gone;

-- name: prune_spend
-- callers: operator
-- Each limit's settled spend per UTC day (leaseq_limit_spend), for the days
-- past the evidence record's retention: what leaseq limits spend, the
-- dashboard and /metrics report is today's and the recent days'.
DELETE FROM leaseq_limit_spend
WHERE (key, day) IN (SELECT s.key, s.day FROM leaseq_limit_spend s
                     WHERE s.day < (now() - %(older_than)s::float8 * interval '1 second')::date
                     ORDER BY s.day
                     LIMIT %(limit)s
                     FOR UPDATE SKIP LOCKED)
RETURNING key;

-- name: list_evidence
-- callers: operator, viewer
SELECT id, task_id, queue, kind, task_status, ended_at, event_id, type, generation, worker_id, at, detail, kept_at
FROM leaseq_evidence WHERE task_id = %(task_id)s
ORDER BY id;

-- name: open_intents_by_queue
-- callers: operator, viewer
-- Effect intents recorded without a response, per queue (a metrics gauge).
SELECT t.queue, count(*) AS count
FROM leaseq_effects e JOIN leaseq_tasks t ON t.id = e.task_id
WHERE e.status = 'pending'
GROUP BY t.queue ORDER BY t.queue;


-- ============================================================================
-- Dashboard reads: task pages, workers, charts, live-update versions
-- ============================================================================
-- Read by leaseq.service.stats only. None of these writes. `queues`, where a
-- query takes it, is the queues a queue-limited dashboard token reads (NULL:
-- every queue): its rows, counts and series are those of its queues only.

-- name: dashboard_tasks_older
-- callers: operator, viewer
-- One page of the task list, newest first, strictly below the cursor
-- (keyset paging on the primary key: a page's URL names the same rows
-- however many tasks arrive meanwhile). `search` matches a substring of the
-- idempotency key or of the id; strpos needs no LIKE escaping.
SELECT * FROM leaseq_tasks
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(search)s::text IS NULL OR strpos(idempotency_key, %(search)s) > 0 OR strpos(id::text, %(search)s) > 0)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: dashboard_tasks_newer
-- callers: operator, viewer
-- The page above a cursor, oldest first (the caller reverses it).
SELECT * FROM leaseq_tasks
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(search)s::text IS NULL OR strpos(idempotency_key, %(search)s) > 0 OR strpos(id::text, %(search)s) > 0)
  AND id > %(after)s
ORDER BY id
LIMIT %(limit)s;

-- name: dashboard_kinds
-- callers: operator, viewer
SELECT DISTINCT kind FROM leaseq_tasks
WHERE (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
ORDER BY kind LIMIT 200;

-- name: dashboard_worker_leases
-- callers: operator, viewer
-- Live leases (running tasks), by holder.
SELECT id, queue, kind, claim_generation, lease_owner, lease_expires_at, claimed_at, last_heartbeat_at,
       lease_expires_at < now() AS expired
FROM leaseq_tasks
WHERE status = 'running' AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
ORDER BY lease_owner, id
LIMIT %(limit)s;

-- name: dashboard_workers
-- callers: operator, viewer
-- The workers the worker page lists: list_workers' columns, for a
-- queue-limited token (`queues`) only the workers that declared a kind on one
-- of its queues or hold a lease there, with those kinds and leases only.
SELECT w.id, w.name, w.registered_at, w.revoked_at, w.last_heartbeat_at, w.heartbeat_seconds,
       w.lease_seconds, w.stopped_at, w.stop_reason,
       (SELECT count(*) FROM leaseq_tasks t WHERE t.status = 'running' AND t.lease_owner = w.id
          AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[]))) AS leases,
       (SELECT coalesce(jsonb_agg(k.kind ORDER BY k.kind), '[]'::jsonb) FROM leaseq_worker_kinds k
        WHERE k.worker_id = w.id AND (%(queues)s::text[] IS NULL OR k.queue = ANY(%(queues)s::text[]))) AS kinds,
       clock_timestamp() AS now
FROM leaseq_workers w
WHERE %(queues)s::text[] IS NULL
   OR EXISTS (SELECT 1 FROM leaseq_worker_kinds k WHERE k.worker_id = w.id AND k.queue = ANY(%(queues)s::text[]))
   OR EXISTS (SELECT 1 FROM leaseq_tasks t WHERE t.status = 'running' AND t.lease_owner = w.id
                                             AND t.queue = ANY(%(queues)s::text[]))
ORDER BY w.registered_at;

-- name: dashboard_worker_last_events
-- callers: operator, viewer
-- Each worker's latest event among the most recent `recent` events: a
-- bounded read of the primary key's tail, not a scan of the whole trail.
SELECT worker_id, max(at) AS last_event_at
FROM leaseq_events
WHERE worker_id IS NOT NULL AND id > (SELECT coalesce(max(id), 0) FROM leaseq_events) - %(recent)s
GROUP BY worker_id;

-- name: dashboard_completed_by_minute
-- callers: operator, viewer
-- Completed tasks per minute over the window, by kind and queue, with the
-- claim-to-completion time of the final attempt (the handler's duration).
-- Reads the partial index on finished tasks' updated_at.
SELECT (floor(extract(epoch FROM updated_at) / 60) * 60)::float8 AS minute, kind, queue, count(*) AS completed,
       sum(extract(epoch FROM updated_at - claimed_at))::float8 AS seconds_sum,
       max(extract(epoch FROM updated_at - claimed_at))::float8 AS seconds_max
FROM leaseq_tasks
WHERE status = 'completed' AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND updated_at >= now() - make_interval(secs => %(window)s)
GROUP BY 1, 2, 3
ORDER BY 1;

-- name: dashboard_depth_by_minute
-- callers: operator, viewer
-- Queue depth over the window: at the end of each minute (now, for the current
-- one), the tasks made and due by then that neither a claim (the latest) nor an
-- end had reached, by kind and queue. Reads only the tasks queued now or changed
-- within the window: no other can have been queued in it.
WITH m AS (
    SELECT s.minute, least(to_timestamp(s.minute + 60), now()) AS at
    FROM generate_series(floor(extract(epoch FROM now()) / 60) * 60 - %(window)s + 60,
                         floor(extract(epoch FROM now()) / 60) * 60, 60) AS s(minute)
)
SELECT m.minute::float8 AS minute, t.kind, t.queue, count(*) AS depth
FROM m JOIN leaseq_tasks t
  ON t.created_at <= m.at AND t.available_at <= m.at AND (t.claimed_at IS NULL OR t.claimed_at > m.at)
 AND NOT (t.status NOT IN ('queued', 'running') AND t.updated_at <= m.at)
WHERE (t.status = 'queued' OR t.updated_at >= now() - make_interval(secs => %(window)s))
  AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[]))
GROUP BY 1, 2, 3
ORDER BY 1;

-- name: dashboard_failures_by_minute
-- callers: operator, viewer
-- Failed attempts and ended leases per minute over the window, by kind and queue.
SELECT (floor(extract(epoch FROM e.at) / 60) * 60)::float8 AS minute, e.type, t.kind, t.queue, count(*) AS count
FROM leaseq_events e JOIN leaseq_tasks t ON t.id = e.task_id
WHERE e.type IN ('failed', 'lease_expired', 'lease_revoked')
  AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[])) AND e.at >= now() - make_interval(secs => %(window)s)
GROUP BY 1, 2, 3, 4
ORDER BY 1;

-- name: dashboard_fair_queued
-- callers: operator, viewer
-- FAIR SHARE, for the dashboard: the fairness keys with the most tasks queued
-- (due or not), per queue, each with the weight its queued tasks carry (the
-- largest, where they differ); at most limit keys. Reads leaseq_tasks_fair,
-- which holds the queued tasks with a key only.
SELECT t.queue, t.fairness_key AS key, count(*) AS queued, max(t.fairness_weight) AS weight
FROM leaseq_tasks t
WHERE t.status = 'queued' AND t.fairness_key IS NOT NULL
GROUP BY t.queue, t.fairness_key
ORDER BY count(*) DESC, t.queue, t.fairness_key
LIMIT %(limit)s;

-- name: dashboard_fair_claims
-- callers: operator, viewer
-- FAIR SHARE, for the dashboard: the claims of the last `window` seconds
-- among the most recent `recent` events (a bounded read of the primary key's
-- tail), per queue and fairness key ('': the tasks without one), in the
-- queues where a task claimed had a key: each key's claims and weight, and
-- its queue's claims; at most limit keys, the most claimed first.
WITH served AS (
    SELECT t.queue, coalesce(t.fairness_key, '') AS key, count(*) AS claims, max(t.fairness_weight) AS weight
    FROM leaseq_events e JOIN leaseq_tasks t ON t.id = e.task_id
    WHERE e.id > (SELECT coalesce(max(id), 0) FROM leaseq_events) - %(recent)s
      AND e.type = 'claimed' AND e.at >= now() - make_interval(secs => %(window)s)
    GROUP BY 1, 2
), totals AS (
    SELECT queue, sum(claims) AS total, bool_or(key <> '') AS keyed FROM served GROUP BY queue
)
SELECT s.queue, s.key, s.claims, s.weight, x.total::bigint AS queue_claims
FROM served s JOIN totals x ON x.queue = s.queue
WHERE x.keyed
ORDER BY s.claims DESC, s.queue, s.key
LIMIT %(limit)s;

-- name: dashboard_task_version
-- callers: operator, viewer
-- What a task page shows changes when one of these does (live updates).
SELECT t.status, t.updated_at, t.claim_generation, t.heartbeat_count, t.open_effects,
       (SELECT count(*) FROM leaseq_events e WHERE e.task_id = t.id) AS events,
       (SELECT count(*) FROM leaseq_effects f WHERE f.task_id = t.id AND f.status <> 'pending') AS answered
FROM leaseq_tasks t WHERE t.id = %(task_id)s AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[]));


-- ============================================================================
-- Dependencies (enqueue after=) and waiting for a task's end (Queue.wait)
-- ============================================================================
-- Used by leaseq.engine.dependencies and leaseq.engine.waits. None of these
-- is lease-backed: a waiting task holds no lease, and an ended task's waiters
-- are settled in the transaction that ended it, whoever ended it.

-- name: mark_upstreams
-- callers: worker, operator
-- The tasks a new task will wait for, locked in id order and marked
-- has_dependents. The lock orders this enqueue with their completion: a
-- completion that comes first is seen here (its status), one that comes
-- later waits for this commit and then settles the new waiter.
WITH locked AS (
    SELECT id FROM leaseq_tasks WHERE id = ANY(%(task_ids)s::bigint[]) ORDER BY id FOR UPDATE
)
UPDATE leaseq_tasks t SET has_dependents = true
FROM locked l WHERE t.id = l.id
RETURNING t.id, t.status;

-- name: insert_dependencies
-- callers: worker, operator
-- Every new task of an enqueue waits for every upstream.
INSERT INTO leaseq_dependencies (waiter, upstream, on_failure)
SELECT w.id, u.id, %(on_failure)s
FROM unnest(%(waiters)s::bigint[]) AS w(id), unnest(%(upstreams)s::bigint[]) AS u(id)
ON CONFLICT DO NOTHING;

-- name: hold_tasks
-- callers: worker, operator
-- New tasks whose upstreams are not all completed yet: not claimable until
-- they are (the claim takes only 'queued' tasks). No lease, no slot.
UPDATE leaseq_tasks SET status = 'waiting'
WHERE id = ANY(%(task_ids)s::bigint[]) AND status = 'queued'
RETURNING id;

-- name: lock_waiters
-- callers: worker, operator
-- The waiting tasks that wait for any of these just-ended tasks, locked in
-- id order before their upstreams are read (waiter_upstreams, a later
-- statement with a later snapshot). Two transactions ending two upstreams of
-- one waiter take turns here, and the second sees the first's end; without
-- the lock each could read the other's upstream as unfinished and leave the
-- waiter waiting for ever.
SELECT t.id FROM leaseq_tasks t
WHERE t.status = 'waiting'
  AND t.id IN (SELECT d.waiter FROM leaseq_dependencies d WHERE d.upstream = ANY(%(task_ids)s::bigint[]))
ORDER BY t.id
FOR UPDATE;

-- name: waiter_upstreams
-- callers: worker, operator
-- Every upstream of these waiters, with its status: the engine decides.
SELECT d.waiter, d.upstream, d.on_failure, u.status
FROM leaseq_dependencies d JOIN leaseq_tasks u ON u.id = d.upstream
WHERE d.waiter = ANY(%(task_ids)s::bigint[])
ORDER BY d.waiter, d.upstream;

-- name: settle_waiters
-- callers: worker, operator
-- Waiters leave 'waiting': to 'queued' (every upstream completed; due now at
-- the earliest), or to 'cancelled' or 'blocked' with the reason.
UPDATE leaseq_tasks t
SET status = c.status,
    last_error = coalesce(c.reason, t.last_error),
    available_at = greatest(t.available_at, now()),
    updated_at = now()
FROM jsonb_to_recordset(%(items)s::jsonb) AS c(task_id bigint, status text, reason text)
WHERE t.id = c.task_id AND t.status = 'waiting'
RETURNING t.id, t.status, t.queue;

-- name: dependency_results
-- callers: worker, operator, viewer
-- The tasks one task waits (or waited) for, with their results.
SELECT u.id, u.status, u.result
FROM leaseq_dependencies d JOIN leaseq_tasks u ON u.id = d.upstream
WHERE d.waiter = %(task_id)s
ORDER BY u.id;

-- name: watch_task
-- callers: worker, operator, viewer
-- Someone waits for this task's end: from now on the leaseq_tasks_settled
-- trigger notifies leaseq_task_<id> when it reaches a status Queue.wait
-- returns on. The caller LISTENs first and reads the task after this
-- commits, so an end is either seen by that read or notified. Writes only
-- the first time (no row back when it was watched already).
UPDATE leaseq_tasks SET watched = true
WHERE id = %(task_id)s AND NOT watched
RETURNING id;

-- DURABLE WAITS (schema 26): a handler's sleep or signal wait ends its
-- attempt under the lease; the task rests in 'waiting' holding no lease.

-- name: record_wait
-- callers: worker
-- guard: lease
-- plan: generic
-- A wait's entry in the action ledger (a sleep, a signal wait, a signal
-- received or a wait timed out; or, schema 31, a consume: the usage a call
-- reported, leaseq.engine.budgets), written answered ('done') under the lease:
-- a retried attempt finds it and replays it. Its class is read_only: it acts
-- on nothing and takes no action token, whatever the task declared. With
-- %(seconds)s or %(until)s (Unix seconds) the response also records when the
-- wait ends ("until"), by this clock.
INSERT INTO leaseq_effects (task_id, generation, worker_id, action, idempotency_key, effect, status, response,
                            response_at)
SELECT t.id, t.claim_generation, %(worker_id)s, %(action)s, %(idempotency_key)s, 'read_only', 'done',
       coalesce(%(response)s::jsonb, '{}'::jsonb)
       || CASE WHEN %(until)s::float8 IS NULL AND %(seconds)s::float8 IS NULL THEN '{}'::jsonb
               ELSE jsonb_build_object('until', coalesce(%(until)s::float8,
                                                         extract(epoch FROM now())::float8 + %(seconds)s::float8))
          END,
       now()
FROM leaseq_tasks t
WHERE t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
RETURNING *;

-- name: suspend_task
-- callers: worker
-- guard: lease
-- plan: generic
-- The attempt ends in a durable wait: the lease ends, the task rests in
-- 'waiting' (no lease, no slot) until %(until)s (Unix seconds, this clock:
-- a sleep's end or a signal wait's timeout; NULL: no time) or, with
-- %(signal)s, until a signal of that name, or, with %(children)s (ctx.wait_for),
-- until the last of those child tasks ends (wake_parents). Not a failure and not a try: the
-- attempt is given back (attempts - 1) and the error streak left alone. A
-- side_effect call with an intent and no response sends the task to
-- needs_reconciliation, as a retry on request does.
UPDATE leaseq_tasks t
SET status = CASE
        /* TEMPLATE: unsettled_side_effect */
        WHEN %(approval)s::boolean THEN 'awaiting_approval'  -- a budget spent (schema 31): a person decides
        ELSE 'waiting' END,
    attempts = t.attempts - 1,
    wake_at = to_timestamp(%(until)s::float8),
    wait_signal = %(signal)s::text,
    wait_children = %(children)s::bigint[],
    available_at = coalesce(to_timestamp(%(until)s::float8), now()),
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = now()
WHERE t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
RETURNING t.id, t.status, t.claim_generation, t.attempts, t.wake_at, t.wait_signal, t.wait_children,
          t.heartbeat_count, t.last_heartbeat_at, t.longest_heartbeat_gap, t.queue, t.limits, t.units,
          CASE t.status WHEN 'needs_reconciliation'
              THEN 'wait begun with a side-effect intent and no recorded response' END AS reason;

-- name: diverge_task
-- callers: worker
-- guard: lease
-- plan: generic
-- CODE CHANGES UNDER REPLAY (schema 32): the attempt ends because the
-- handler's code no longer matches the run its ledger recorded (a tool call
-- with other arguments, a wait where a call was recorded: ToolCallDiverged).
-- Replaying the recorded answers, or acting anew, would both be wrong, and
-- every retry would diverge again: the task goes to needs_reconciliation,
-- %(error)s (naming the first diverging entry) its last_error, for a person
-- to reconcile (completed, requeue once the code is fixed, or cancel). Not a
-- failure: the attempt is given back (attempts - 1) and the error streak left
-- alone.
UPDATE leaseq_tasks t
SET status = 'needs_reconciliation',
    attempts = t.attempts - 1,
    last_error = %(error)s::text,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = now()
WHERE t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
RETURNING t.id, t.status, t.claim_generation, t.attempts, t.code_version,
          t.heartbeat_count, t.last_heartbeat_at, t.longest_heartbeat_gap, t.queue, t.limits, t.units,
          'the handler diverged from its recorded run (its diverged event and last_error name the entry)' AS reason;

-- name: lock_sleepers
-- callers: worker, operator
-- plan: generic
-- Waiting tasks of the queue whose wake time has come (a sleep's end, a
-- signal wait's timeout), read from leaseq_tasks_wake (by queue, schema 41)
-- and locked for waking. SKIP LOCKED: a row another claimer is waking is
-- left to it.
SELECT id, queue, claim_generation, wake_at, wait_signal
FROM leaseq_tasks
WHERE status = 'waiting' AND queue = %(queue)s AND wake_at <= now()
ORDER BY wake_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: wake_tasks
-- callers: worker, operator
-- plan: generic
-- The sleepers lock_sleepers found are claimable again, in the order of
-- their wake times. Only a due one: no caller wakes a task early.
UPDATE leaseq_tasks t
SET status = 'queued',
    available_at = t.wake_at,
    wake_at = NULL,
    wait_signal = NULL,
    wait_children = NULL,  -- a wait for children whose timeout passed
    updated_at = now()
WHERE t.id = ANY(%(task_ids)s::bigint[])
  AND t.status = 'waiting' AND t.wake_at <= now()
RETURNING t.id, t.queue;

-- name: insert_signal
-- callers: operator
-- A signal for a task (q.signal), kept until an attempt waiting for that
-- name consumes it. %(actor)s is the sender as authenticated (an operator
-- role's own login name on PostgreSQL roles, the token's principal over
-- HTTP). The caller locked the task row first (lock_task), as an attempt's
-- wait does (lock_lease): a signal and a wait never miss each other.
INSERT INTO leaseq_signals (task_id, name, payload, sent_by)
VALUES (%(task_id)s, %(name)s, %(payload)s::jsonb, %(actor)s)
RETURNING *;

-- name: wake_for_signal
-- callers: operator
-- A task waiting for this signal is claimable at once.
UPDATE leaseq_tasks t
SET status = 'queued',
    available_at = now(),
    wake_at = NULL,
    wait_signal = NULL,
    updated_at = now()
WHERE t.id = %(task_id)s AND t.status = 'waiting' AND t.wait_signal = %(name)s
RETURNING t.id, t.queue, t.claim_generation;

-- name: pending_signal
-- callers: worker
-- guard: none -- runs after lock_lease has checked and locked the lease in the same transaction
-- The oldest signal of this name not yet consumed, locked for its consumer.
SELECT s.id, s.name, s.payload, s.sent_by, s.sent_at
FROM leaseq_signals s
WHERE s.task_id = %(task_id)s AND s.name = %(name)s AND s.consumed_at IS NULL
ORDER BY s.id
LIMIT 1
FOR UPDATE;

-- name: consume_signal
-- callers: worker
-- guard: lease
-- The signal is consumed by this attempt, once: an attempt holding the
-- task's live lease marks it with its generation and the ledger key that
-- recorded it (its wait's entry, written in the same transaction).
UPDATE leaseq_signals s
SET consumed_at = now(), consumed_generation = %(generation)s, consumed_key = %(idempotency_key)s
FROM leaseq_tasks t
WHERE s.id = %(signal_id)s AND s.task_id = %(task_id)s AND s.consumed_at IS NULL AND t.id = s.task_id
  /* TEMPLATE: lease_guard */
RETURNING s.id, s.name, s.payload, s.sent_by, s.sent_at, s.consumed_at;

-- name: list_asks
-- callers: operator, viewer
-- The questions put to a person (ctx.ask) that wait for an answer, oldest
-- first: each task waiting for the answer signal %(signal)s, before its
-- deadline, with the latest question it asked (the beginning of its ask in
-- the ledger, action %(action)s: the question, its schema, its key).
SELECT t.id AS task_id, t.queue, t.kind, e.response, e.response_at AS asked_at, t.wake_at AS deadline_at
FROM leaseq_tasks t
JOIN LATERAL (SELECT x.response, x.response_at FROM leaseq_effects x
              WHERE x.task_id = t.id AND x.action = %(action)s AND x.response ->> 'state' = 'waiting'
              ORDER BY x.id DESC LIMIT 1) e ON true
WHERE t.status = 'waiting' AND t.wait_signal = %(signal)s AND (t.wake_at IS NULL OR t.wake_at > now())
  AND (%(queue)s::text IS NULL OR t.queue = %(queue)s)
ORDER BY e.response_at, t.id
LIMIT %(limit)s;

-- name: open_ask
-- callers: operator
-- The latest question task %(task_id)s asked (its ask's beginning in the
-- ledger), whether it is open (the task waits for its answer, the signal
-- %(signal)s, before the deadline), who answered it if someone did, and the
-- clock. The caller locked the task row (lock_task), as an attempt's ask
-- does (lock_lease): an answer and an ask never miss each other.
SELECT e.response, e.response_at AS asked_at,
       to_timestamp((e.response ->> 'until')::float8) AS deadline_at,
       (t.status = 'waiting' AND t.wait_signal = %(signal)s
        AND (t.wake_at IS NULL OR t.wake_at > clock_timestamp())) AS open,
       s.sent_by AS answered_by, s.sent_at AS answered_at, clock_timestamp() AS now
FROM leaseq_tasks t
JOIN LATERAL (SELECT x.response, x.response_at FROM leaseq_effects x
              WHERE x.task_id = t.id AND x.action = %(action)s AND x.response ->> 'state' = 'waiting'
              ORDER BY x.id DESC LIMIT 1) e ON true
LEFT JOIN LATERAL (SELECT y.sent_by, y.sent_at FROM leaseq_signals y
                   WHERE y.task_id = t.id AND y.name = %(signal)s AND y.sent_at >= e.response_at
                   ORDER BY y.id DESC LIMIT 1) s ON true
WHERE t.id = %(task_id)s;

-- name: list_signals
-- callers: operator, viewer
-- A task's signals, oldest first, consumed or not.
SELECT id, task_id, name, payload, sent_by, sent_at, consumed_generation, consumed_at, consumed_key
FROM leaseq_signals WHERE task_id = %(task_id)s ORDER BY id;

-- STREAMS (schema 28): a handler's ctx.emit appends to its task's stream
-- under the lease; readers follow it after a cursor (its seq).

-- name: append_stream
-- callers: worker
-- guard: lease
-- One entry of the task's stream (ctx.emit), written under the lease after
-- lock_lease locked the task row in this transaction: the appends of one task
-- are written one after the other, so their seq order is their commit order
-- and a reader resuming after a seq misses none. The first entry an attempt
-- writes comes after its 'reset' entry (the stream's last entry is another
-- generation's, or there is none): both rows come back then. watched: someone
-- follows the task (notify_stream wakes them).
INSERT INTO leaseq_stream_items (task_id, seq, generation, type, item, ledger_key, worker_id)
SELECT t.id,
       coalesce(l.seq, 0) + CASE WHEN n.type = 'reset' OR l.generation IS NOT DISTINCT FROM t.claim_generation
                                 THEN 1 ELSE 2 END,
       t.claim_generation, n.type,
       CASE WHEN n.type = 'item' THEN %(item)s::jsonb END,
       CASE WHEN n.type = 'item' THEN %(ledger_key)s::text END,
       %(worker_id)s
FROM leaseq_tasks t
LEFT JOIN (SELECT s.seq, s.generation FROM leaseq_stream_items s
           WHERE s.task_id = %(task_id)s ORDER BY s.seq DESC LIMIT 1) l ON true
JOIN (VALUES ('reset'), ('item')) AS n(type)
  ON n.type = 'item' OR l.generation IS DISTINCT FROM t.claim_generation
WHERE t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
RETURNING leaseq_stream_items.task_id, leaseq_stream_items.seq, leaseq_stream_items.generation,
          leaseq_stream_items.type, leaseq_stream_items.at,
          (SELECT w.watched FROM leaseq_tasks w WHERE w.id = leaseq_stream_items.task_id) AS watched;

-- name: notify_stream
-- callers: worker
-- Wakes the readers following the task's stream (Queue.stream, GET
-- /v1/tasks/{id}/stream), on the task's own channel with the payload
-- 'stream' (a wait for the task's end passes over it). Sent only for a
-- watched task (append_stream says); delivered at commit.
SELECT pg_notify('leaseq_task_' || %(task_id)s::bigint, 'stream');

-- name: list_stream
-- callers: worker, operator, viewer
-- A task's stream after a cursor (seq), oldest first, a page at a time.
SELECT task_id, seq, generation, type, item, ledger_key IS NOT NULL AS durable, at
FROM leaseq_stream_items
WHERE task_id = %(task_id)s AND seq > %(after)s
ORDER BY seq
LIMIT %(limit)s;

-- name: stream_stats
-- callers: worker, operator, viewer
-- A task's stream by attempt: its items (the durable ones among them), its
-- first and last entries.
SELECT generation, count(*) FILTER (WHERE type = 'item') AS items,
       count(*) FILTER (WHERE type = 'item' AND ledger_key IS NOT NULL) AS durable,
       min(seq) AS first_seq, max(seq) AS last_seq, min(at) AS first_at, max(at) AS last_at
FROM leaseq_stream_items
WHERE task_id = %(task_id)s
GROUP BY generation
ORDER BY generation;

-- name: streams_finished_ids
-- callers: operator
-- Ended tasks past the streams' cut-off whose stream is not deleted yet.
SELECT t.id FROM leaseq_tasks t
WHERE t.status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
  AND t.updated_at < now() - %(older_than)s::float8 * interval '1 second'
  AND EXISTS (SELECT 1 FROM leaseq_stream_items s WHERE s.task_id = t.id)
ORDER BY t.id
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED;

-- name: prune_streams
-- callers: operator
-- The streams of these tasks (user data): by the streams' own retention, and
-- with the rest of the task's user data at the payload cut-off.
DELETE FROM leaseq_stream_items WHERE task_id = ANY(%(task_ids)s::bigint[]);

-- CHILD TASKS (ctx.spawn, ctx.wait_for) and cancel trees (leaseq.engine.children).

-- name: set_child_parent
-- callers: worker
-- A child task spawned by a handler (ctx.spawn), inserted in this
-- transaction under the lease of the task that spawns it (locked by
-- lock_lease before): the child records its parent. has_dependents sends
-- its end down the settling path (complete_batch), which wakes the parent
-- when it waits for it (wake_parents).
UPDATE leaseq_tasks SET parent_id = %(parent_task_id)s, has_dependents = true,
    -- TREE BUDGETS (schema 34): the budgets that cover the parent cover its child
    budget_owners = (SELECT p.budget_owners FROM leaseq_tasks p WHERE p.id = %(parent_task_id)s)
WHERE id = %(task_id)s
RETURNING *;

-- name: lock_children
-- callers: worker
-- plan: generic
-- The children a handler waits for (ctx.wait_for), of this task only, read
-- after the task's own row (lock_lease) and FOR SHARE: an end of one in
-- flight (which found this task running, so woke nothing) is waited for and
-- then seen, so no wait begins for a child that has just ended. Locked in id
-- order, after the parent, as renewals and completions lock rows.
SELECT c.id, c.kind, c.queue, c.status, c.result, c.last_error
FROM leaseq_tasks c
WHERE c.parent_id = %(task_id)s AND c.id = ANY(%(child_ids)s::bigint[])
ORDER BY c.id
FOR SHARE;

-- name: lock_waiting_parents
-- callers: worker, operator
-- The tasks waiting for any of these just-ended tasks (their children),
-- locked in id order before the children they wait for are read
-- (wake_parents, a later statement with a later snapshot): two
-- transactions ending two children of one parent take turns here, and the
-- second sees the first's end (as lock_waiters does for dependencies).
SELECT p.id, p.queue, p.claim_generation, p.wait_children
FROM leaseq_tasks p
WHERE p.status = 'waiting' AND p.wait_children && %(task_ids)s::bigint[]
  AND p.id IN (SELECT c.parent_id FROM leaseq_tasks c
               WHERE c.id = ANY(%(task_ids)s::bigint[]) AND c.parent_id IS NOT NULL)
ORDER BY p.id
FOR UPDATE;

-- name: wake_parents
-- callers: worker, operator
-- plan: generic
-- A parent waiting for children (ctx.wait_for) is claimable again once the
-- last of them has ended (completed, or ended without success: the handler
-- is told, ChildFailed), in the transaction that ended it. task_ids: the
-- tasks this transaction just ended.
UPDATE leaseq_tasks p
SET status = 'queued', wait_children = NULL, available_at = now(), updated_at = now()
WHERE p.status = 'waiting' AND p.wait_children && %(task_ids)s::bigint[]
  AND p.id IN (SELECT c.parent_id FROM leaseq_tasks c
               WHERE c.id = ANY(%(task_ids)s::bigint[]) AND c.parent_id IS NOT NULL)
  AND NOT EXISTS (SELECT 1 FROM leaseq_tasks c
                  WHERE c.id = ANY(p.wait_children)
                    AND c.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired'))
RETURNING p.id, p.queue;

-- name: lock_children_of
-- callers: operator
-- The children the given tasks spawned (ctx.spawn), whatever their status
-- (a cancel tree reports each), locked in id order after their parents.
SELECT * FROM leaseq_tasks
WHERE parent_id IS NOT NULL AND parent_id = ANY(%(task_ids)s::bigint[])
ORDER BY id
FOR UPDATE;

-- name: open_effects_of
-- callers: operator
-- The open entries of these tasks' ledgers (an intent recorded, no response
-- yet): what a cancel tree reports as in flight.
SELECT e.id, e.task_id, e.action, e.effect, e.idempotency_key, e.generation
FROM leaseq_effects e
WHERE e.task_id = ANY(%(task_ids)s::bigint[]) AND e.status = 'pending'
ORDER BY e.task_id, e.id;

-- name: intents_of
-- callers: operator
-- The intents the given tasks recorded (ctx.intend), whatever their status:
-- a cancel tree reports each.
SELECT id, parent_task_id, kind, queue, status, claim_generation FROM leaseq_tasks
WHERE parent_task_id IS NOT NULL AND parent_task_id = ANY(%(task_ids)s::bigint[])
ORDER BY id;

-- BUDGETS SETTLED AFTER THE CALL (schema 31, leaseq.engine.budgets): a
-- handler's ctx.consume(limit, units) charges what a call used, under the
-- lease, after lock_lease has locked the task row and the ledger entry is
-- written (record_wait): the attempt's own reservation first
-- (charge_attempt), the rest to the limit (charge_limit), the day's spend
-- (record_spend) and the task's budget (charge_task).

-- name: charge_attempt
-- callers: worker
-- guard: lease
-- The units this attempt consumed against a limit its task names, which
-- holds a rate or a window: the claim reserved the task's cost there, and
-- consumption draws that reservation down before it charges the limit. One
-- row per attempt and key, deleted by the statement that ends the lease,
-- which credits back what was reserved and not consumed (the
-- give_back_slots template). No row back: the key reserved nothing (the
-- task does not name it, or the limit has no rate and no window).
INSERT INTO leaseq_limit_charges AS c (task_id, generation, key, reserved, consumed, claimed_at)
SELECT t.id, t.claim_generation, l.key, CASE WHEN l.counts = 'units' THEN t.units ELSE 1 END,
       %(units)s::bigint, t.claimed_at
FROM leaseq_tasks t JOIN leaseq_limits l ON l.key = %(key)s
WHERE t.id = %(task_id)s
  AND l.key = ANY(t.limits)
  AND (l.per_second IS NOT NULL OR l.per_minute IS NOT NULL OR l.per_hour IS NOT NULL OR l.per_day IS NOT NULL)
  /* TEMPLATE: lease_guard */
ON CONFLICT (task_id, generation, key) DO UPDATE SET consumed = c.consumed + excluded.consumed
RETURNING c.reserved, c.consumed;

-- name: charge_limit
-- callers: worker
-- guard: lease
-- Units consumed beyond the attempt's reservation, charged to the limit now:
-- taken from its rate bucket (which may go below zero: the next claims wait
-- until it refills) and counted in each of its windows, in the window of now.
UPDATE leaseq_limits l
SET tokens = CASE WHEN l.per_second IS NULL THEN l.tokens
                  ELSE least(l.burst, l.tokens + extract(epoch FROM now() - l.refilled_at)::float8 * l.per_second)
                       - %(units)s::bigint END,
    refilled_at = CASE WHEN l.per_second IS NULL THEN l.refilled_at ELSE now() END,
    minute_used = CASE WHEN l.per_minute IS NULL THEN l.minute_used
                       WHEN l.minute_window = floor(extract(epoch FROM now()) / 60) THEN l.minute_used + %(units)s::bigint
                       ELSE %(units)s::bigint END,
    minute_window = CASE WHEN l.per_minute IS NULL THEN l.minute_window ELSE floor(extract(epoch FROM now()) / 60) END,
    hour_used = CASE WHEN l.per_hour IS NULL THEN l.hour_used
                     WHEN l.hour_window = floor(extract(epoch FROM now()) / 3600) THEN l.hour_used + %(units)s::bigint
                     ELSE %(units)s::bigint END,
    hour_window = CASE WHEN l.per_hour IS NULL THEN l.hour_window ELSE floor(extract(epoch FROM now()) / 3600) END,
    day_used = CASE WHEN l.per_day IS NULL THEN l.day_used
                    WHEN l.day_window = floor(extract(epoch FROM now()) / 86400) THEN l.day_used + %(units)s::bigint
                    ELSE %(units)s::bigint END,
    day_window = CASE WHEN l.per_day IS NULL THEN l.day_window ELSE floor(extract(epoch FROM now()) / 86400) END
FROM leaseq_tasks t
WHERE l.key = %(key)s AND t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
RETURNING l.key;

-- name: record_spend
-- callers: worker
-- guard: lease
-- The usage settled by a consume, added to its key's spend of the day (the
-- database's UTC day) by the task's tenant (its fairness key; '': none,
-- schema 40), whether or not the key has a limit.
INSERT INTO leaseq_limit_spend AS s (key, day, tenant, units)
SELECT %(key)s, (now() AT TIME ZONE 'UTC')::date, coalesce(t.fairness_key, ''), %(units)s::bigint
FROM leaseq_tasks t
WHERE t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
ON CONFLICT (key, day, tenant) DO UPDATE SET units = s.units + excluded.units
RETURNING s.units;

-- name: charge_task
-- callers: worker
-- guard: lease
-- The units a consume settled, added to what the task's attempts have spent
-- of the key (spent); answers that and the task's budget of it (NULL: none).
UPDATE leaseq_tasks t
SET spent = jsonb_set(coalesce(t.spent, '{}'::jsonb), ARRAY[%(key)s::text],
                      to_jsonb(coalesce((t.spent ->> %(key)s::text)::bigint, 0) + %(units)s::bigint))
WHERE t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
RETURNING (t.budget ->> %(key)s::text)::bigint AS budget_units, (t.spent ->> %(key)s::text)::bigint AS spent_units;

-- name: budget_request
-- callers: worker
-- guard: lease
-- A budget spent: the attempt asks a person for more, under its lease (the
-- lease ends next, in this transaction: suspend_task). The task's budget
-- request (request 'budget', schema 38: never the row of the gate it was
-- enqueued with, which stays as decided) is written afresh (an earlier
-- budget's request is decided already): reason 'budget', the figures in
-- detail, the worker holding the lease as its requester (it may not decide it).
INSERT INTO leaseq_approvals AS a (task_id, request, digest, requested_by, requested_worker, reason, detail)
SELECT t.id, 'budget', %(digest)s, %(requested_by)s, %(worker_id)s, 'budget', %(detail)s::jsonb
FROM leaseq_tasks t
WHERE t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
ON CONFLICT (task_id, request) DO UPDATE
SET digest = excluded.digest, requested_by = excluded.requested_by, requested_at = now(), deadline_at = NULL,
    decision = NULL, decided_by = NULL, decided_via = NULL, note = NULL, decided_at = NULL,
    requested_worker = excluded.requested_worker, requested_token = NULL, reason = excluded.reason,
    detail = excluded.detail
RETURNING a.task_id;

-- name: set_budget
-- callers: worker, operator
-- The tasks' budget (one for each: enqueue_many gives each task the same),
-- written by the enqueue that inserted them (in the same transaction): only
-- a task without one gets one. Each becomes an owner of its budget
-- (budget_owners, schema 34: after the budgeted tasks that cover it, none
-- at an enqueue); open_budgets writes its rows.
UPDATE leaseq_tasks SET budget = %(budget)s::jsonb,
                        budget_owners = array_append(budget_owners, id)
WHERE id = ANY(%(task_ids)s::bigint[]) AND budget IS NULL
RETURNING id, budget;

-- name: open_budgets
-- callers: worker, operator
-- TREE BUDGETS (schema 34): the rows that count what the trees of these
-- tasks (just given their budgets by set_budget) consume, one per key of
-- each task's own budget, nothing spent yet.
INSERT INTO leaseq_budgets (owner_id, key, budget, spent)
SELECT t.id, b.key, b.value::bigint, 0
FROM leaseq_tasks t, jsonb_each_text(t.budget) b
WHERE t.id = ANY(%(task_ids)s::bigint[]) AND t.budget IS NOT NULL AND t.id = ANY(t.budget_owners)
ON CONFLICT (owner_id, key) DO NOTHING
RETURNING owner_id;

-- name: charge_budgets
-- callers: worker
-- guard: lease
-- TREE BUDGETS (schema 34): the units a consume settled, charged to every
-- budget that covers the task (its own and its budgeted ancestors', by
-- budget_owners) and names the key; answers each owner's budget and what
-- its tree has spent now. The rows are locked in owner order (the root
-- first) before any is changed, so consumers of one tree, each holding its
-- own task row, never wait on one another in a cycle; each sees the others'
-- committed charges, so the consume that takes a tree past its budget knows
-- it, whoever charged before. Run only for a task some budget covers.
WITH owners AS (
    SELECT b.owner_id
    FROM leaseq_tasks t JOIN leaseq_budgets b ON b.owner_id = ANY(t.budget_owners) AND b.key = %(key)s
    WHERE t.id = %(task_id)s
      /* TEMPLATE: lease_guard */
    ORDER BY b.owner_id
    FOR UPDATE OF b)
UPDATE leaseq_budgets b SET spent = b.spent + %(units)s::bigint
FROM owners o
WHERE b.owner_id = o.owner_id AND b.key = %(key)s
RETURNING b.owner_id, b.key, b.budget AS budget_units, b.spent AS spent_units;

-- name: budget_spent
-- callers: worker
-- guard: lease
-- TREE BUDGETS (schema 34): a budget covering the task (its own or a
-- budgeted ancestor's) that its tree has consumed past, the root's first;
-- no row: none. Asked when a ledger entry is begun (a tool call, a wait, a
-- spawn, an intent) by a task some budget covers: a task of a spent tree
-- stops there and asks for an approval.
SELECT b.owner_id, b.key, b.budget AS budget_units, b.spent AS spent_units
FROM leaseq_tasks t JOIN leaseq_budgets b ON b.owner_id = ANY(t.budget_owners)
WHERE t.id = %(task_id)s
  /* TEMPLATE: lease_guard */
  AND b.spent > b.budget
ORDER BY b.owner_id, b.key
LIMIT 1;

-- name: raise_budget
-- callers: operator
-- A budget raised by the approval of a task waiting for a person (the
-- caller locked the task and holds its request); %(budget)s is the new whole.
UPDATE leaseq_tasks SET budget = %(budget)s::jsonb, updated_at = now()
WHERE id = %(task_id)s AND status = 'awaiting_approval'
RETURNING id, budget;

-- name: raise_owner_budget
-- callers: operator
-- TREE BUDGETS (schema 34): the budget of a task that covers the one whose
-- request is approved (an ancestor: it may be running or waiting), raised
-- by the approval; the caller locked both. %(budget)s is the new whole.
UPDATE leaseq_tasks SET budget = %(budget)s::jsonb, updated_at = now()
WHERE id = %(task_id)s AND budget IS NOT NULL
RETURNING id, budget;

-- name: raise_budget_rows
-- callers: operator
-- TREE BUDGETS (schema 34): a raised budget's rows (raise_budget,
-- raise_owner_budget wrote the task's), each key to its new whole.
UPDATE leaseq_budgets b SET budget = (%(budget)s::jsonb ->> b.key)::bigint
WHERE b.owner_id = %(task_id)s AND %(budget)s::jsonb ? b.key
RETURNING b.owner_id, b.key, b.budget AS budget_units, b.spent AS spent_units;

-- name: drop_charges
-- BUDGETS: the charges of the ended attempts of tasks whose slots came back,
-- deleted, each with the reservation it left unused (credit). Not run on
-- PostgreSQL, where the give_back_slots template settles them in the
-- statement that ends the lease; written here too so both dialects hold the
-- same statements, and granted to no one (as take_limits).
DELETE FROM leaseq_limit_charges c
USING leaseq_tasks t
WHERE c.task_id = ANY(%(task_ids)s::bigint[]) AND t.id = c.task_id AND c.generation = t.claim_generation
RETURNING c.key, greatest(0, c.reserved - c.consumed) AS credit, extract(epoch FROM c.claimed_at)::float8 AS claimed;

-- name: settle_charges
-- BUDGETS: the credits drop_charges answered ({"key", "credit", "claimed"}),
-- back to each limit's bucket and to its windows still the claim's. Not run
-- on PostgreSQL (see drop_charges); granted to no one.
WITH s AS (
    SELECT f.key, f.credit, f.claimed FROM jsonb_to_recordset(%(items)s::jsonb) AS f(key text, credit bigint, claimed float8)
)
UPDATE leaseq_limits l
SET tokens = l.tokens + CASE WHEN l.per_second IS NULL THEN 0
                             ELSE coalesce((SELECT sum(s.credit) FROM s WHERE s.key = l.key), 0) END,
    minute_used = greatest(0, l.minute_used - coalesce((SELECT sum(s.credit) FROM s
                               WHERE s.key = l.key AND floor(s.claimed / 60) = l.minute_window), 0)),
    hour_used = greatest(0, l.hour_used - coalesce((SELECT sum(s.credit) FROM s
                             WHERE s.key = l.key AND floor(s.claimed / 3600) = l.hour_window), 0)),
    day_used = greatest(0, l.day_used - coalesce((SELECT sum(s.credit) FROM s
                           WHERE s.key = l.key AND floor(s.claimed / 86400) = l.day_window), 0))
WHERE l.key IN (SELECT key FROM s)
RETURNING l.key;

-- name: limit_spend
-- callers: operator, viewer
-- Settled usage per key and UTC day, newest first, over the last %(days)s days,
-- and its split by tenant (schema 40: {tenant: units}, '' for the tasks without
-- a fairness key).
SELECT s.key, s.day, sum(s.units)::bigint AS units, jsonb_object_agg(s.tenant, s.units) AS tenants
FROM leaseq_limit_spend s
WHERE (%(key)s::text IS NULL OR s.key = %(key)s)
  AND s.day > (now() AT TIME ZONE 'UTC')::date - %(days)s::integer
GROUP BY s.key, s.day
ORDER BY s.day DESC, s.key;

-- name: limit_spend_top
-- callers: operator, viewer
-- limit_spend's split by tenant with its tenants bounded, for /metrics and the
-- dashboard (a tenant is a fairness key: whoever may enqueue chooses it): per
-- key and UTC day over the last %(days)s days, the %(top)s tenants that settled
-- the most (ties by name, in byte order on both backends) each on its own row,
-- and the rest summed on one row whose tenant is %(other)s: at most top + 1 rows
-- per key and day, the largest first, the rest's row last (rest). A tenant of
-- that very name is never among the top, so it counts in that row (no two rows
-- share a name). Each day's top is read by a bounded sort (LIMIT) of its rows,
-- not a window over all of them: with 100,000 tenants a day, 6 times faster.
WITH days AS (
    SELECT s.key, s.day, sum(s.units)::bigint AS units, count(*) AS tenants
    FROM leaseq_limit_spend s
    WHERE s.day > (now() AT TIME ZONE 'UTC')::date - %(days)s::integer
    GROUP BY s.key, s.day
), top AS (
    SELECT d.key, d.day, t.tenant, t.units
    FROM days d CROSS JOIN LATERAL (
        SELECT s.tenant COLLATE "C" AS tenant, s.units
        FROM leaseq_limit_spend s
        WHERE s.key = d.key AND s.day = d.day AND s.tenant <> %(other)s::text
        ORDER BY s.units DESC, s.tenant COLLATE "C"
        LIMIT %(top)s::integer
    ) t
)
SELECT t.key, t.day, t.tenant, t.units, false AS rest FROM top t
UNION ALL
SELECT d.key, d.day, %(other)s::text COLLATE "C", d.units - coalesce(sum(t.units), 0)::bigint, true
FROM days d LEFT JOIN top t ON t.key = d.key AND t.day = d.day
GROUP BY d.key, d.day, d.units, d.tenants
HAVING d.tenants > count(t.tenant)
ORDER BY 2 DESC, 1, 5, 4 DESC, 3;
