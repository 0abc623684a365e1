-- leaseq named queries, SQLite (sqlite3, :name parameters).
--
-- Same names and parameters as the PostgreSQL file; see its header for the
-- annotations ("-- guard: ...", "-- no-op: ...", "-- unused: ...").
--
-- Times are REAL Unix seconds from SQLite's clock; (julianday('now') -
-- 2440587.5) * 86400.0 is "now" and stays fixed within one statement.
-- Every write runs inside BEGIN IMMEDIATE, so a transaction holds the
-- database's single write lock from its first read: no SKIP LOCKED needed.

-- template: lease_guard(generation=:generation)
-- THE LEASE GUARD, SQLite's form (see the PostgreSQL file): every write made
-- on the strength of a lease expands it; zero rows back means the lease is lost.
AND t.status = 'running'
AND t.lease_owner = :worker_id
AND t.claim_generation = {generation}
AND t.lease_expires_at >= (julianday('now') - 2440587.5) * 86400.0

-- template: claimable
-- THE CLAIMABLE TEST, SQLite's form (see the PostgreSQL file): what a queued
-- task of the claim's queue must also pass to be handed out, the task being
-- the unaliased leaseq_tasks of the read that expands it.
AND (:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))  -- only kinds the worker can run
-- SINGLETONS: see the PostgreSQL file (writes run one at a time here)
AND (singleton_key IS NULL OR NOT EXISTS (
    SELECT 1 FROM leaseq_tasks o
    WHERE o.queue = leaseq_tasks.queue AND o.singleton_key = leaseq_tasks.singleton_key
      AND o.id <> leaseq_tasks.id
      AND o.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')  -- leaseq_tasks_singleton
      AND (o.status IN ('running', 'waiting') OR (o.status = 'queued' AND o.id < leaseq_tasks.id))))
AND (deadline_at IS NULL OR deadline_at > (julianday('now') - 2440587.5) * 86400.0)  -- see the PostgreSQL file
-- CODE VERSIONS: see the PostgreSQL file (the worker's row read once per claim)
AND (code_version IS NULL
     OR (SELECT w.compatible_versions IS NULL FROM leaseq_workers w WHERE w.id = :worker_id)
     OR code_version IN (SELECT v.value FROM leaseq_workers w, json_each(w.compatible_versions) AS v
                         WHERE w.id = :worker_id))
AND id NOT IN (SELECT a.task_id FROM leaseq_approvals a  -- approved at or after its approval deadline:
               WHERE a.decision = 'approved' AND a.decided_at >= a.deadline_at)  -- see the PostgreSQL file
-- the unary + keeps available_at out of the index lookup: the claimable
-- index is walked in claim order, never range-scanned and then sorted
AND +available_at <= (julianday('now') - 2440587.5) * 86400.0
AND NOT EXISTS (SELECT 1 FROM leaseq_queues q WHERE q.name = :queue AND q.paused)
AND EXISTS (SELECT 1 FROM leaseq_workers w WHERE w.id = :worker_id AND w.revoked_at IS NULL)
AND NOT (:route_first AND (EXISTS (  -- BY QUEUE: this queue's (see claim_head in the PostgreSQL file)
    SELECT 1 FROM leaseq_tasks e
    WHERE e.status = 'running' AND e.queue = :queue AND e.lease_expires_at < (julianday('now') - 2440587.5) * 86400.0)
    OR EXISTS (  -- a sleeper whose wake time has come is routed first too
    SELECT 1 FROM leaseq_tasks s
    WHERE s.status = 'waiting' AND s.queue = :queue AND s.wake_at <= (julianday('now') - 2440587.5) * 86400.0)))
-- LIMITS: pass over a task one of whose limits has no room for it (see
-- the PostgreSQL file; the judgement is "refused" below)
AND (limits IS NULL OR NOT EXISTS (
    SELECT 1 FROM json_each(leaseq_tasks.limits) AS k JOIN leaseq_limits l ON l.key = k.value
    WHERE (l.max_running IS NOT NULL AND l.running > 0
           AND l.running + CASE WHEN l.counts = 'units' THEN units ELSE 1 END > l.max_running)
       OR min(l.burst, l.tokens + ((julianday('now') - 2440587.5) * 86400.0 - l.refilled_at) * l.per_second)
          < min(l.burst, CASE WHEN l.counts = 'units' THEN units ELSE 1 END) - 1e-9
       -- WINDOWS (schema 31): a window of this one already spent
       OR l.minute_used >= l.per_minute AND l.minute_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 60 AS INTEGER)
       OR l.hour_used >= l.per_hour AND l.hour_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 3600 AS INTEGER)
       OR l.day_used >= l.per_day AND l.day_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 86400 AS INTEGER)))

-- template: charge_fair_share(served=served)
-- FAIR SHARE: THE CHARGE, SQLite's form (see the PostgreSQL file).
INSERT INTO leaseq_fairness (queue, priority, key, vtime, vstart, service, claimed, served_at)
SELECT :queue, x.priority, x.key, max(x.start) + sum(x.cost), max(x.start) + sum(x.cost) - avg(x.cost),
       sum(x.cost), count(*), (julianday('now') - 2440587.5) * 86400.0
FROM {served}
WHERE true  -- an INSERT ... SELECT needs a WHERE before ON CONFLICT in SQLite
GROUP BY x.priority, x.key
ON CONFLICT (queue, priority, key) DO UPDATE
SET vtime = max(vtime, excluded.vtime - excluded.service) + excluded.service,
    vstart = max(vstart, max(vtime, excluded.vtime - excluded.service) + excluded.service
                         - excluded.service / excluded.claimed),
    service = service + excluded.service,
    claimed = claimed + excluded.claimed,
    served_at = excluded.served_at

-- template: claim_flags
-- THE CLAIM'S FLAGS, SQLite's form (see claim_head in the PostgreSQL file):
-- fair, whether a task with a fairness key is queued here (a probe of
-- leaseq_tasks_fair, which holds no entry in a queue without keys; INDEXED
-- BY: a table scan would stop at the first match, after every finished task).
flags AS MATERIALIZED (
    -- FAIR SHARE: whether a task with a fairness key is queued here (a probe
    -- of leaseq_tasks_fair, which holds no entry in a queue without keys)
    -- (INDEXED BY: a table scan would stop at the first match, after every finished task)
    SELECT EXISTS (SELECT 1 FROM leaseq_tasks k INDEXED BY leaseq_tasks_fair
                   WHERE k.status = 'queued' AND k.queue = :queue AND k.fairness_key IS NOT NULL) AS fair
)

-- template: claim_plain
-- THE CLAIM'S FIFO CANDIDATES, SQLite's form: a queue with no fairness key
-- queued, in claim order from the claimable index; none when one is queued
-- (the flag gates the LIMIT: a term of the WHERE would be tested row by row).
plain AS MATERIALIZED (
    -- the claim of a queue without fairness keys: the claimable index in claim order
    -- (the flag gates the LIMIT: a term of the WHERE would be tested row by row)
    SELECT id, limits, units, priority, available_at FROM leaseq_tasks
    WHERE status = 'queued' AND queue = :queue AND fairness_key IS NULL
      /* TEMPLATE: claimable */
    ORDER BY priority DESC, available_at, id
    LIMIT CASE WHEN (SELECT f.fair FROM flags f) THEN 0 ELSE :limit END
)

-- template: claim_judge
-- LIMITS: each (candidate, limit) pair with its cost and the limit's demand
-- up to it in claim order, and the candidates no limit has room for. The
-- transaction holds the write lock: the rows read here stay as read until
-- it commits (take_limits).
demand AS (
    -- LIMITS: each (candidate, limit) pair with its cost and the limit's
    -- demand up to it in claim order. The transaction holds the write lock:
    -- the rows read here stay as read until it commits (take_limits).
    SELECT c.id, l.running, l.max_running, l.per_second, l.burst,
           CASE WHEN l.counts = 'units' THEN c.units ELSE 1 END AS cost,
           min(l.burst, l.tokens + ((julianday('now') - 2440587.5) * 86400.0 - l.refilled_at) * l.per_second) AS tokens,
           sum(CASE WHEN l.counts = 'units' THEN c.units ELSE 1 END)
               OVER (PARTITION BY l.key ORDER BY c.priority DESC, c.tag, c.available_at, c.id) AS upto,
           -- WINDOWS: each total, and what its window holds now (an older window's count is 0)
           l.per_minute, CASE WHEN l.minute_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 60 AS INTEGER) THEN l.minute_used ELSE 0 END AS minute_used,
           l.per_hour, CASE WHEN l.hour_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 3600 AS INTEGER) THEN l.hour_used ELSE 0 END AS hour_used,
           l.per_day, CASE WHEN l.day_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 86400 AS INTEGER) THEN l.day_used ELSE 0 END AS day_used
    FROM candidate c
    JOIN json_each(c.limits) AS k
    JOIN leaseq_limits l ON l.key = k.value
), refused AS (
    SELECT d.id FROM demand d
    WHERE NOT (d.max_running IS NULL OR d.running + d.upto <= d.max_running OR (d.running = 0 AND d.upto = d.cost))
       OR NOT (d.per_second IS NULL OR d.upto <= d.tokens + 1e-9 OR (d.tokens >= d.burst AND d.upto = d.cost))
       -- WINDOWS: a window spent before this candidate's turn (see the PostgreSQL file)
       OR d.minute_used + d.upto - d.cost >= d.per_minute OR d.hour_used + d.upto - d.cost >= d.per_hour
       OR d.day_used + d.upto - d.cost >= d.per_day
)

-- template: claim_update
-- THE CLAIM'S LEASES, SQLite's form: the candidates not refused, leased (a
-- candidate naming no limit is never judged: the claim of tasks without
-- limits runs none of the limits' steps).
UPDATE leaseq_tasks AS t
SET status = 'running',
    lease_owner = :worker_id,
    -- what the claim asked for, never more than the task's own: a worker cannot grant itself a longer lease
    lease_expires_at = (julianday('now') - 2440587.5) * 86400.0 + min(coalesce(:lease_seconds, t.lease_seconds), t.lease_seconds),
    claim_generation = t.claim_generation + 1,
    attempts = t.attempts + 1,
    -- CODE VERSIONS: the first claim stamps the version the task starts under; later ones keep it
    code_version = coalesce(t.code_version, (SELECT w.code_version FROM leaseq_workers w WHERE w.id = :worker_id)),
    claimed_at = (julianday('now') - 2440587.5) * 86400.0,
    heartbeat_count = 0,
    last_heartbeat_at = NULL,
    longest_heartbeat_gap = 0,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
-- (a candidate naming no limit is never judged: the claim of tasks without
-- limits runs none of the limits' steps)
WHERE t.id IN (SELECT c.id FROM candidate c WHERE c.limits IS NULL OR c.id NOT IN (SELECT r.id FROM refused r))

-- name: migrations_lock
-- no-op: SQLite runs one writer at a time (BEGIN IMMEDIATE): nothing to lock

-- name: migrations_lock_table
-- no-op: SQLite runs one writer at a time (BEGIN IMMEDIATE): nothing to lock

-- name: functions_installed
-- no-op: SQLite has no database functions (PostgreSQL's definer functions)

-- name: migrations_create
CREATE TABLE IF NOT EXISTS leaseq_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

-- name: migrations_table_exists
SELECT count(*) > 0 AS present FROM sqlite_master WHERE type = 'table' AND name = 'leaseq_migrations';

-- name: migrations_applied
SELECT version, name, applied_at FROM leaseq_migrations ORDER BY version;

-- name: migrations_record
INSERT INTO leaseq_migrations (version, name) VALUES (:version, :name);

-- name: db_now
SELECT (julianday('now') - 2440587.5) * 86400.0 AS now;

-- name: caller_kind
-- no-op: SQLite has no database roles: whoever opens the file has full authority

-- name: leader_elect
-- See the PostgreSQL file. BEGIN IMMEDIATE serialises writers, so the WHERE
-- is judged on the row as the previous winner left it.
INSERT INTO leaseq_leader (name, holder, term, expires_at)
VALUES (:name, :holder, 1, (julianday('now') - 2440587.5) * 86400.0 + :seconds)
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder,
    term = CASE WHEN leaseq_leader.holder = excluded.holder THEN leaseq_leader.term
                ELSE leaseq_leader.term + 1 END,
    elected_at = CASE WHEN leaseq_leader.holder = excluded.holder THEN leaseq_leader.elected_at
                      ELSE (julianday('now') - 2440587.5) * 86400.0 END,
    renewed_at = (julianday('now') - 2440587.5) * 86400.0,
    expires_at = excluded.expires_at
WHERE leaseq_leader.holder = excluded.holder
   OR leaseq_leader.expires_at <= (julianday('now') - 2440587.5) * 86400.0
RETURNING holder, term, elected_at, expires_at;

-- name: leader_resign
UPDATE leaseq_leader SET expires_at = (julianday('now') - 2440587.5) * 86400.0
WHERE name = :name AND holder = :holder AND term = :term
  AND expires_at > (julianday('now') - 2440587.5) * 86400.0
RETURNING term;

-- name: leader_get
SELECT name, holder, term, elected_at, renewed_at, expires_at,
       expires_at > (julianday('now') - 2440587.5) * 86400.0 AS live
FROM leaseq_leader WHERE name = :name;

-- name: notify_work
-- no-op: SQLite has no notifications; its workers poll

-- name: notify_interrupt
-- guard: none -- ends a worker's waiting claims; claims nothing
-- no-op: SQLite has no notifications; only the process asked ends its waits

-- name: register_worker
-- See the PostgreSQL file: registering is the worker's first heartbeat.
-- CODE VERSIONS (schema 32): compatible_versions is a JSON array (NULL: any).
INSERT INTO leaseq_workers (id, name, heartbeat_seconds, lease_seconds, last_heartbeat_at, code_version,
                            compatible_versions)
VALUES (:name || '-' || lower(hex(randomblob(6))), :name, :heartbeat_seconds, :lease_seconds,
        (julianday('now') - 2440587.5) * 86400.0, :code_version, :compatible_versions)
RETURNING id, name, registered_at, revoked_at, code_version, compatible_versions;

-- name: declare_worker_kinds
-- guard: none -- the worker's own declarations, written at its registration; no lease
INSERT INTO leaseq_worker_kinds (worker_id, kind, queue, effect, actions, signature)
SELECT :worker_id, json_extract(d.value, '$.kind'), json_extract(d.value, '$.queue'),
       json_extract(d.value, '$.effect'), json(json_extract(d.value, '$.actions')),
       json(json_extract(d.value, '$.signature'))
FROM json_each(:declarations) AS d WHERE true
ON CONFLICT (worker_id, kind) DO UPDATE
SET queue = excluded.queue, effect = excluded.effect, actions = excluded.actions, signature = excluded.signature
RETURNING kind;

-- name: worker_heartbeat
-- guard: none -- says the worker process is alive; renews no lease
UPDATE leaseq_workers SET last_heartbeat_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :worker_id AND stopped_at IS NULL
RETURNING id, revoked_at;

-- name: worker_stopped
-- guard: none -- the worker's own account of its clean exit; its leases end by their own rules
UPDATE leaseq_workers SET stopped_at = (julianday('now') - 2440587.5) * 86400.0, stop_reason = :reason,
                          last_heartbeat_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :worker_id AND stopped_at IS NULL
RETURNING id;

-- name: kind_declaration
SELECT k.kind, k.queue, k.effect, k.actions, k.signature, k.worker_id, w.registered_at
FROM leaseq_worker_kinds k JOIN leaseq_workers w ON w.id = k.worker_id
WHERE k.kind = :kind
ORDER BY w.registered_at DESC, k.worker_id
LIMIT 1;

-- name: served_kinds
SELECT DISTINCT kind FROM leaseq_worker_kinds ORDER BY kind;

-- name: get_worker
-- guard: none -- a read of the worker row, not of a lease
SELECT id, name, registered_at, revoked_at FROM leaseq_workers WHERE id = :worker_id;

-- name: lock_worker
-- guard: none -- locks the worker row (a claim's slow path), before any lease exists
-- SQLite has one writer at a time: a plain read (see the PostgreSQL file).
SELECT id, name, registered_at, revoked_at FROM leaseq_workers WHERE id = :worker_id;

-- name: list_workers
SELECT w.id, w.name, w.registered_at, w.revoked_at, w.last_heartbeat_at, w.heartbeat_seconds,
       w.lease_seconds, w.stopped_at, w.stop_reason,
       (SELECT count(*) FROM leaseq_tasks t WHERE t.status = 'running' AND t.lease_owner = w.id) AS leases,
       (SELECT coalesce(json_group_array(kind), '[]') FROM (SELECT k.kind FROM leaseq_worker_kinds k
        WHERE k.worker_id = w.id ORDER BY k.kind)) AS kinds,
       (julianday('now') - 2440587.5) * 86400.0 AS now
FROM leaseq_workers w ORDER BY w.registered_at;

-- name: revoke_worker
-- guard: none -- an operator action on the worker row; it ends leases, never acts on one
UPDATE leaseq_workers SET revoked_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :worker_id AND revoked_at IS NULL
RETURNING id, name, registered_at, revoked_at;

-- name: end_worker_leases
-- guard: none -- ends every lease of a revoked worker: taking leases away needs no lease
-- See the PostgreSQL file: a revoked worker's deadlines move to just before
-- each lease began.
UPDATE leaseq_tasks
SET lease_expires_at = claimed_at - 0.001,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE status = 'running' AND lease_owner = :worker_id
RETURNING id, claim_generation;

-- name: insert_task
-- The new row is the enqueue's evidence (see list_events); SQLite has no
-- notifications to send. Like PostgreSQL's, it returns what the database
-- made and the payload; the engine fills in the rest (inserted_row).
INSERT INTO leaseq_tasks (queue, kind, payload, effect, priority, available_at,
                          idempotency_key, max_attempts, lease_seconds, actions, resources,
                          timeout_seconds, deadline_at, trace_context, limits, units, singleton_key, debounce_key,
                          fairness_key, fairness_weight)
VALUES (:queue, :kind, :payload, :effect, :priority,
        (julianday('now') - 2440587.5) * 86400.0 + :delay,
        :idempotency_key, :max_attempts, :lease_seconds, :actions, :resources, :timeout, coalesce(:deadline_at, (julianday('now') - 2440587.5) * 86400.0 + :deadline_in),
        :trace_context, :limits, :units, :singleton_key, :debounce_key, :fairness_key, :fairness_weight)
ON CONFLICT (queue, idempotency_key) DO NOTHING
RETURNING id, payload, available_at, created_at, updated_at, deadline_at;

-- name: insert_tasks
-- See the PostgreSQL file. json_each keeps the document's order.
INSERT INTO leaseq_tasks (queue, kind, payload, effect, priority, available_at,
                          idempotency_key, max_attempts, lease_seconds, actions, resources,
                          timeout_seconds, deadline_at, limits, units, fairness_key, fairness_weight, trace_context)
SELECT :queue, :kind, coalesce(n.value -> '$.payload', 'null'), :effect, :priority,
       (julianday('now') - 2440587.5) * 86400.0 + :delay,
       n.value ->> '$.idempotency_key', :max_attempts, :lease_seconds, :actions, :resources,
       :timeout, coalesce(:deadline_at, (julianday('now') - 2440587.5) * 86400.0 + :deadline_in), :limits, :units,
       :fairness_key, :fairness_weight, :trace_context
FROM json_each(:tasks) AS n
WHERE true  -- an INSERT ... SELECT needs a WHERE before ON CONFLICT in SQLite
ON CONFLICT (queue, idempotency_key) DO NOTHING
RETURNING id, idempotency_key;

-- name: insert_fresh_tasks
-- See the PostgreSQL file: insert_tasks without ON CONFLICT, for keys leaseq
-- just generated; a generated key meeting a stored one refuses the statement.
INSERT INTO leaseq_tasks (queue, kind, payload, effect, priority, available_at,
                          idempotency_key, max_attempts, lease_seconds, actions, resources,
                          timeout_seconds, deadline_at, limits, units, fairness_key, fairness_weight, trace_context)
SELECT :queue, :kind, coalesce(n.value -> '$.payload', 'null'), :effect, :priority,
       (julianday('now') - 2440587.5) * 86400.0 + :delay,
       n.value ->> '$.idempotency_key', :max_attempts, :lease_seconds, :actions, :resources,
       :timeout, coalesce(:deadline_at, (julianday('now') - 2440587.5) * 86400.0 + :deadline_in), :limits, :units,
       :fairness_key, :fairness_weight, :trace_context
FROM json_each(:tasks) AS n
RETURNING id, idempotency_key;

-- name: flow_lock
-- See the PostgreSQL file. The write lock of BEGIN IMMEDIATE already runs
-- these enqueues one at a time.
INSERT INTO leaseq_flow_keys (scope, queue, key) VALUES (:scope, :queue, :key)
ON CONFLICT (scope, queue, key) DO UPDATE SET locked_at = (julianday('now') - 2440587.5) * 86400.0
RETURNING scope;

-- name: singleton_holders
SELECT t.* FROM leaseq_tasks t
WHERE t.queue = :queue AND t.singleton_key = :singleton_key
  AND t.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
ORDER BY t.id;

-- name: cancel_singleton
UPDATE leaseq_tasks
SET status = 'cancelled', last_error = :reason, lease_owner = NULL, lease_expires_at = NULL,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id IN (SELECT value FROM json_each(:holder_ids)) AND queue = :queue AND singleton_key = :singleton_key
  AND status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
RETURNING id, status, claim_generation, limits;

-- name: debounce_holder
SELECT t.*, (t.status = 'queued' AND t.claim_generation = 0) AS pending,
       t.created_at > (julianday('now') - 2440587.5) * 86400.0 - :window_seconds AS recent
FROM leaseq_tasks t
WHERE t.queue = :queue AND t.debounce_key = :debounce_key
ORDER BY t.id DESC
LIMIT 1;

-- name: debounce_task
UPDATE leaseq_tasks
SET payload = :payload,
    available_at = min((julianday('now') - 2440587.5) * 86400.0 + :window_seconds, created_at + :max_delay),
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :holder_id AND queue = :queue AND debounce_key = :debounce_key
  AND status = 'queued' AND claim_generation = 0
RETURNING *;

-- name: flow_event
-- guard: none -- evidence of an enqueue that wrote no task: only about the task that holds its key
INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
SELECT t.id, :type, NULL, NULL, :detail FROM leaseq_tasks t
WHERE t.id = :holder_id AND t.queue = :queue
  AND ((:type = 'singleton_skipped' AND t.singleton_key = :key)
       OR (:type = 'debounced' AND t.debounce_key = :key));

-- name: tasks_by_key
-- See the PostgreSQL file: the tasks the keys name, with the compared
-- options the task table does not hold.
SELECT t.*, a.task_id IS NOT NULL AS gated, a.deadline_at - a.requested_at AS approval_seconds,
       (SELECT group_concat(upstream, ',')
        FROM (SELECT upstream FROM leaseq_dependencies WHERE waiter = t.id ORDER BY upstream)) AS upstreams,
       (SELECT min(on_failure) FROM leaseq_dependencies WHERE waiter = t.id) AS on_failure
FROM leaseq_tasks t
LEFT JOIN leaseq_approvals a ON a.task_id = t.id AND a.request = 'gate'
WHERE t.queue = :queue AND t.idempotency_key IN (SELECT value FROM json_each(:keys));

-- name: get_task
SELECT * FROM leaseq_tasks WHERE id = :task_id;

-- name: get_task_by_key
SELECT * FROM leaseq_tasks WHERE queue = :queue AND idempotency_key = :idempotency_key;

-- name: lock_task
SELECT * FROM leaseq_tasks WHERE id = :task_id;

-- name: list_tasks
SELECT * FROM leaseq_tasks
WHERE (:status IS NULL OR status = :status)
  AND (:queue IS NULL OR queue = :queue)
ORDER BY id DESC
LIMIT :limit;

-- name: lock_expired
SELECT id, queue, lease_owner, claim_generation, lease_expires_at, claimed_at,
       heartbeat_count, last_heartbeat_at, longest_heartbeat_gap
FROM leaseq_tasks
WHERE status = 'running' AND queue = :queue AND lease_expires_at < (julianday('now') - 2440587.5) * 86400.0
ORDER BY lease_expires_at
LIMIT :limit;

-- name: sweep_queues
-- See the PostgreSQL file: the queues one pass of the sweep has work in, at
-- most :scan examined after :after, the last one examined returned when the
-- walk stopped at that bound; or, where :within names queues (a JSON list),
-- those of them that have a task.
WITH RECURSIVE seen(name, n) AS (
    SELECT (SELECT min(t.queue) FROM leaseq_tasks t WHERE t.queue > coalesce(:after, '')), 1
    WHERE :within IS NULL
    UNION ALL
    SELECT (SELECT min(t.queue) FROM leaseq_tasks t WHERE t.queue > seen.name), seen.n + 1 FROM seen
    WHERE seen.name IS NOT NULL AND seen.n < :scan
),
walked(name, n) AS (
    SELECT name, n FROM seen
    UNION ALL
    SELECT name, n FROM (
        SELECT x.name, row_number() OVER (ORDER BY x.name) AS n
        FROM (SELECT DISTINCT value AS name FROM json_each(coalesce(:within, '[]'))) x
        WHERE x.name > coalesce(:after, '') AND EXISTS (SELECT 1 FROM leaseq_tasks t WHERE t.queue = x.name)
        ORDER BY x.name
        LIMIT :scan)
)
SELECT queue, expired, sleepers, overdue, tokens, at_bound FROM (
    SELECT q.name AS queue, q.n = :scan AS at_bound,
           EXISTS (SELECT 1 FROM leaseq_tasks t
                   WHERE t.status = 'running' AND t.queue = q.name AND t.lease_expires_at < (julianday('now') - 2440587.5) * 86400.0) AS expired,
           EXISTS (SELECT 1 FROM leaseq_tasks t
                   WHERE t.status = 'waiting' AND t.queue = q.name AND t.wake_at <= (julianday('now') - 2440587.5) * 86400.0) AS sleepers,
           EXISTS (SELECT 1 FROM leaseq_tasks t
                   WHERE t.deadline_at IS NOT NULL AND t.status IN ('queued', 'waiting', 'awaiting_approval')
                     AND t.queue = q.name AND t.deadline_at <= (julianday('now') - 2440587.5) * 86400.0) AS overdue,
           EXISTS (SELECT 1 FROM leaseq_action_tokens k
                   WHERE k.queue = q.name AND k.expires_at < (julianday('now') - 2440587.5) * 86400.0 - 3600) AS tokens
    FROM walked q
    WHERE q.name IS NOT NULL
) w
WHERE w.expired OR w.sleepers OR w.overdue OR w.tokens OR w.at_bound
ORDER BY w.queue;

-- name: route_expired
-- The recovery policy; see the PostgreSQL file for the table it implements.
UPDATE leaseq_tasks AS t
SET status = CASE
        /* TEMPLATE: unsettled_side_effect */
        WHEN t.attempts >= t.max_attempts THEN 'dead'
        ELSE 'queued' END,
    last_error = 'lease expired: ' || t.lease_owner || ' held generation ' || t.claim_generation,
    lease_owner = NULL,
    lease_expires_at = NULL,
    available_at = (julianday('now') - 2440587.5) * 86400.0,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE t.id IN (SELECT value FROM json_each(:task_ids))
  AND t.status = 'running' AND t.lease_expires_at < (julianday('now') - 2440587.5) * 86400.0
RETURNING id, status, claim_generation, open_effects, attempts, queue, limits, units,
          CASE status  -- why, when the task is not simply queued again
              WHEN 'needs_reconciliation' THEN 'side-effect intent without a response: a retry could repeat it'
              WHEN 'dead' THEN 'attempts exhausted' END AS reason;

-- name: lock_overdue
-- See the PostgreSQL file (the transaction holds the write lock: no SKIP LOCKED).
SELECT id, queue, status, claim_generation, deadline_at
FROM leaseq_tasks
WHERE deadline_at IS NOT NULL AND status IN ('queued', 'waiting', 'awaiting_approval')
  AND queue = :queue AND deadline_at <= (julianday('now') - 2440587.5) * 86400.0
ORDER BY deadline_at
LIMIT :limit;

-- name: prune_action_tokens
-- A batch of action tokens that expired an hour ago or more (see the PostgreSQL file).
DELETE FROM leaseq_action_tokens
WHERE id IN (SELECT id FROM leaseq_action_tokens
             WHERE queue = :queue AND expires_at < (julianday('now') - 2440587.5) * 86400.0 - 3600
             ORDER BY expires_at LIMIT :limit)
RETURNING id;

-- name: expire_overdue
UPDATE leaseq_tasks AS t
SET status = 'expired',
    last_error =
        /* TEMPLATE: deadline_reason */,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE t.id IN (SELECT value FROM json_each(:task_ids))
  AND t.status IN ('queued', 'waiting', 'awaiting_approval') AND t.deadline_at <= (julianday('now') - 2440587.5) * 86400.0
RETURNING id, attempts, last_error AS reason;

-- name: claim_plain
-- no-op: SQLite's claim reads none of the steps a queue without fairness keys, limits or singleton keys does not use, and plans each statement once per connection: it has no lean claim (the backend declares none)

-- name: claim_fair_one
-- no-op: SQLite's claim_fair plans each statement once per connection and reads none of the steps that weigh keys where one key alone is queued: it has no one-key claim (the backend declares none)

-- name: claim_fair_one_plain
-- no-op: SQLite has no one-key claim (the backend declares no lean claims), nor a record of the queues whose tasks name limits or singleton keys: its claim_fair tests them only for a task that names one

-- name: claim_batch
-- guard: none -- takes new leases: no lease exists yet to guard
-- unused: compact -- the caller writes the "claimed" events (no data-modifying CTEs in SQLite)
-- See the PostgreSQL file. SQLite has no data-modifying CTEs, so the caller
-- writes the "claimed" events in the same transaction (the backend declares
-- it does not write its own evidence), and takes the claimed tasks' limit
-- slots (take_limits) and charges their fairness keys (charge_fair_share)
-- in it too; nothing comes back when nothing was claimed, and the caller
-- then takes the slow path. The transaction holds the write lock: what the
-- FAIR SHARE steps read stays as read until it commits.
-- FAIR SHARE: when a task with a fairness key is queued here, this statement
-- claims nothing, and the caller asks fair_due, then claims with claim_fair.
WITH
    /* TEMPLATE: claim_flags */,
    /* TEMPLATE: claim_plain */,
candidate AS MATERIALIZED (
    SELECT id, limits, units, priority, available_at, NULL AS tag FROM plain
),
    /* TEMPLATE: claim_judge */
/* TEMPLATE: claim_update */
-- the lease this claim was given (both times are the one 'now' of this statement)
RETURNING *, round(lease_expires_at - claimed_at, 6) AS lease_granted;

-- name: claim_fair
-- guard: none -- takes new leases: no lease exists yet to guard
-- unused: compact -- the caller writes the "claimed" events (no data-modifying CTEs in SQLite)
-- See the PostgreSQL file: the claim of a queue with a fairness key queued,
-- the same steps with the candidates chosen by fair share; the caller
-- charges the keys (charge_fair_share) in the same transaction. With no key
-- queued (any more) it claims in FIFO order, as claim_batch does.
WITH RECURSIVE
    /* TEMPLATE: claim_flags */,
    /* TEMPLATE: claim_plain */,
fair_keys(key) AS (
    -- FAIR SHARE: the keys with tasks queued, one probe of leaseq_tasks_fair each
    SELECT (SELECT k.fairness_key FROM leaseq_tasks k INDEXED BY leaseq_tasks_fair
            WHERE k.status = 'queued' AND k.queue = :queue AND k.fairness_key IS NOT NULL
            ORDER BY k.fairness_key DESC LIMIT 1)
    WHERE (SELECT f.fair FROM flags f)
    UNION ALL
    SELECT (SELECT k.fairness_key FROM leaseq_tasks k INDEXED BY leaseq_tasks_fair
            WHERE k.status = 'queued' AND k.queue = :queue AND k.fairness_key IS NOT NULL
              AND k.fairness_key < g.key
            ORDER BY k.fairness_key DESC LIMIT 1)
    FROM fair_keys g WHERE g.key IS NOT NULL
), fair_ready AS MATERIALIZED (
    -- FAIR SHARE: each key's first tasks in claim order, and the first of the
    -- tasks without a key (see the PostgreSQL file): one claim's worth, as no
    -- claim runs beside this one here
    SELECT g.key, t.id, t.priority, t.available_at, 1.0 / coalesce(t.fairness_weight, 1) AS cost
    FROM fair_keys g JOIN leaseq_tasks t ON t.id IN (
        SELECT id FROM leaseq_tasks
        WHERE status = 'queued' AND queue = :queue AND fairness_key = g.key
          /* TEMPLATE: claimable */
        ORDER BY priority DESC, available_at, id
        LIMIT :limit)
    WHERE g.key IS NOT NULL
    UNION ALL
    SELECT '', id, priority, available_at, 1.0 FROM (
        SELECT id, priority, available_at FROM leaseq_tasks
        WHERE status = 'queued' AND queue = :queue AND fairness_key IS NULL
          /* TEMPLATE: claimable */
        ORDER BY priority DESC, available_at, id
        LIMIT CASE WHEN (SELECT f.fair FROM flags f) THEN :limit ELSE 0 END)
), fair_start AS MATERIALIZED (
    -- FAIR SHARE: where each key's virtual time starts, at each priority (see the PostgreSQL file)
    SELECT g.key, g.priority,
           max(coalesce(kv.vtime, v.at - g.cost),
               v.at - g.cost) AS start
    FROM (SELECT key, priority, max(cost) AS cost FROM fair_ready GROUP BY key, priority) g
    JOIN (SELECT p.priority, (SELECT coalesce(max(qv.vstart), 0) FROM leaseq_fairness qv
                              WHERE qv.queue = :queue AND qv.priority = p.priority) AS at
          FROM (SELECT DISTINCT priority FROM fair_ready) p) v ON v.priority = g.priority
    LEFT JOIN leaseq_fairness kv ON kv.queue = :queue AND kv.priority = g.priority AND kv.key = g.key
), fair_pick AS MATERIALIZED (
    -- FAIR SHARE: priority first, then the lowest virtual finish
    SELECT t.id, t.limits, t.units, t.priority, t.available_at, o.key, o.cost, o.start, o.tag
    FROM (SELECT r.id, r.key, r.cost, fs.start,
                 fs.start + sum(r.cost) OVER (PARTITION BY r.key, r.priority ORDER BY r.available_at, r.id) AS tag
          FROM fair_ready r JOIN fair_start fs ON fs.key = r.key AND fs.priority = r.priority) o
    JOIN leaseq_tasks t ON t.id = o.id
    ORDER BY t.priority DESC, o.tag, t.available_at, t.id
    LIMIT :limit
), candidate AS MATERIALIZED (
    SELECT id, limits, units, priority, available_at, NULL AS tag FROM plain
    UNION ALL
    SELECT id, limits, units, priority, available_at, tag FROM fair_pick
),
    /* TEMPLATE: claim_judge */
/* TEMPLATE: claim_update */
-- the lease this claim was given (both times are the one 'now' of this statement);
-- FAIR SHARE: the key a task was served under and its virtual start, cost and
-- finish (NULL: the queue uses no fairness keys; read only when it does)
RETURNING *, round(lease_expires_at - claimed_at, 6) AS lease_granted,
          CASE WHEN (SELECT f.fair FROM flags f) THEN (SELECT p.key FROM fair_pick p WHERE p.id = leaseq_tasks.id) END AS fair_key,
          CASE WHEN (SELECT f.fair FROM flags f) THEN (SELECT p.start FROM fair_pick p WHERE p.id = leaseq_tasks.id) END AS fair_start,
          CASE WHEN (SELECT f.fair FROM flags f) THEN (SELECT p.cost FROM fair_pick p WHERE p.id = leaseq_tasks.id) END AS fair_cost,
          CASE WHEN (SELECT f.fair FROM flags f) THEN (SELECT p.tag FROM fair_pick p WHERE p.id = leaseq_tasks.id) END AS fair_tag;

-- name: fair_due
-- FAIR SHARE: whether a task with a fairness key is queued here, asked when
-- claim_batch claimed nothing (it answers no row then): the claim then runs
-- claim_fair.
SELECT EXISTS (SELECT 1 FROM leaseq_tasks k INDEXED BY leaseq_tasks_fair
               WHERE k.status = 'queued' AND k.queue = :queue AND k.fairness_key IS NOT NULL) AS fair_due;

-- name: renew_leases
-- guard: lease
-- unused: task_ids -- the keys of the leases map name the tasks: one pass over the map, each row found by id
-- Renews by the lease length this claim was given (see the PostgreSQL file).
-- The {"<task id>": generation} map is read once, row by row, each task
-- found by its primary key, and the guard checks that row's generation. Not
-- a join of an id list with a generation list on their positions: that is a
-- scan of one list for every entry of the other (5 s for 10,000 leases).
UPDATE leaseq_tasks AS t
SET lease_expires_at = (julianday('now') - 2440587.5) * 86400.0
                       + (t.lease_expires_at - coalesce(t.last_heartbeat_at, t.claimed_at)),
    heartbeat_count = t.heartbeat_count + 1,
    longest_heartbeat_gap = max(t.longest_heartbeat_gap,
        (julianday('now') - 2440587.5) * 86400.0 - coalesce(t.last_heartbeat_at, t.claimed_at)),
    last_heartbeat_at = (julianday('now') - 2440587.5) * 86400.0,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
FROM json_each(:leases) AS c
WHERE t.id = CAST(c.key AS INTEGER)
  /* TEMPLATE: lease_guard(c.value) */
RETURNING id, claim_generation, lease_expires_at;

-- name: lock_lease
-- guard: lease
SELECT t.id, t.queue, t.idempotency_key, t.effect, t.actions, t.resources, t.lease_expires_at, t.claim_epoch,
       t.budget_owners,
       coalesce((SELECT q.paused FROM leaseq_queues q WHERE q.name = t.queue), 0) AS paused,
       (julianday('now') - 2440587.5) * 86400.0 AS now
FROM leaseq_tasks AS t
WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */;

-- name: attempt_holds_lease
-- See the PostgreSQL file. The asking transaction holds the write lock
-- (BEGIN IMMEDIATE), which keeps every other writer out until it ends.
SELECT t.id FROM leaseq_tasks AS t
WHERE t.id = :task_id
  AND t.status = 'running'
  AND t.claim_generation = :generation
  AND t.claim_epoch = :epoch
  AND t.lease_expires_at >= (julianday('now') - 2440587.5) * 86400.0;

-- name: complete_batch
-- guard: lease
-- unused: compact, lock_worker, task_ids -- the caller writes the "completed" events (no data-modifying
-- CTEs in SQLite), and SQLite writes one transaction at a time: there is no row lock to take in order
-- See the PostgreSQL file: the guard checks each (task, generation) pair.
-- The caller writes the "completed" events and gives back the limit slots
-- (release_limits), as SQLite has no data-modifying CTEs.
UPDATE leaseq_tasks AS t
SET status = 'completed',
    result = c.result,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
FROM (SELECT i.value ->> '$.task_id' AS task_id, i.value ->> '$.generation' AS generation,
             coalesce(i.value -> '$.result', 'null') AS result
      FROM json_each(:items) AS i) AS c
WHERE t.id = c.task_id
  AND (:with_dependents OR NOT t.has_dependents)
  /* TEMPLATE: lease_guard(c.generation) */
RETURNING id, claim_generation, attempts, heartbeat_count, last_heartbeat_at, longest_heartbeat_gap,
          queue, limits, units;

-- name: complete_plain
-- guard: lease
-- no-op: SQLite's complete_batch has no limit steps to leave out (the caller gives limit slots back): it has no lean completion (the backend declares none)

-- name: fail_task
-- guard: lease
-- See the PostgreSQL file for the routing table this CASE implements, and
-- for the default backoff (the same arithmetic; 1 << n is 2**n).
UPDATE leaseq_tasks AS t
SET status = CASE
        /* TEMPLATE: unsettled_side_effect */
        WHEN :block THEN 'blocked'
        WHEN NOT :retry OR t.attempts >= t.max_attempts THEN 'dead'
        WHEN (CASE WHEN t.error_fingerprint = :fingerprint THEN t.error_streak + 1 ELSE 1 END)
             >= :max_same_error THEN 'dead'
        ELSE 'queued' END,
    error_streak = CASE WHEN t.error_fingerprint = :fingerprint THEN t.error_streak + 1 ELSE 1 END,
    error_fingerprint = :fingerprint,
    last_error = :error,
    available_at = (julianday('now') - 2440587.5) * 86400.0 + coalesce(
        :delay,
        min(:backoff_cap, :backoff_base * (1 << min(max(t.attempts, 1) - 1, 62))) / 2
        + :jitter * min(:backoff_cap, :backoff_base * (1 << min(max(t.attempts, 1) - 1, 62))) / 2),
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */
RETURNING id, status, claim_generation, attempts, max_attempts, error_streak, available_at,
          heartbeat_count, last_heartbeat_at, longest_heartbeat_gap, queue, limits, units,
          -- why it went where it went, decided here with the status (NULL: queued for a retry)
          CASE status
              WHEN 'needs_reconciliation' THEN 'failed with a side-effect intent and no recorded response'
              WHEN 'blocked' THEN 'credential missing or revoked'
              WHEN 'dead' THEN CASE WHEN NOT :retry THEN 'failure marked permanent'
                                    WHEN attempts >= max_attempts
                                        THEN 'attempts exhausted (' || attempts || '/' || max_attempts || ')'
                                    ELSE 'same error ' || error_streak || ' times in a row' END
          END AS reason;

-- name: retry_task
-- guard: lease
-- See the PostgreSQL file: the attempt ends on request, given back, counted in snoozes.
UPDATE leaseq_tasks AS t
SET status = CASE
        /* TEMPLATE: unsettled_side_effect */
        ELSE 'queued' END,
    attempts = t.attempts - 1,
    snoozes = t.snoozes + 1,
    available_at = (julianday('now') - 2440587.5) * 86400.0 + :after,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE t.id = :task_id
  AND t.snoozes < :max_snoozes
  /* TEMPLATE: lease_guard */
RETURNING id, status, claim_generation, attempts, snoozes, available_at,
          heartbeat_count, last_heartbeat_at, longest_heartbeat_gap, queue, limits, units,
          CASE status WHEN 'needs_reconciliation'
              THEN 'retry requested with a side-effect intent and no recorded response' END AS reason;

-- name: expire_lease
-- guard: lease
UPDATE leaseq_tasks AS t
SET lease_expires_at = (julianday('now') - 2440587.5) * 86400.0 - 0.001,
    attempts = CASE WHEN :unstarted THEN max(t.attempts - 1, 0) ELSE t.attempts END,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */
RETURNING id, queue, lease_owner, claim_generation, lease_expires_at, claimed_at,
          heartbeat_count, last_heartbeat_at, longest_heartbeat_gap;

-- name: take_limits
-- LIMITS: the claimed tasks take their slots and tokens, in the claim's
-- transaction (which holds the write lock since claim_batch judged them).
UPDATE leaseq_limits AS l
SET running = l.running + CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END,
    tokens = CASE WHEN l.per_second IS NULL THEN l.tokens
                  ELSE min(l.burst, l.tokens + ((julianday('now') - 2440587.5) * 86400.0 - l.refilled_at) * l.per_second)
                       - CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END END,
    refilled_at = CASE WHEN l.per_second IS NULL THEN l.refilled_at ELSE (julianday('now') - 2440587.5) * 86400.0 END,
    -- WINDOWS: the cost counts in each window this limit has (in the window of now)
    minute_used = CASE WHEN l.per_minute IS NULL THEN l.minute_used
                       ELSE CASE WHEN l.minute_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 60 AS INTEGER) THEN l.minute_used ELSE 0 END
                            + CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END END,
    minute_window = CASE WHEN l.per_minute IS NULL THEN l.minute_window ELSE CAST((julianday('now') - 2440587.5) * 86400.0 / 60 AS INTEGER) END,
    hour_used = CASE WHEN l.per_hour IS NULL THEN l.hour_used
                     ELSE CASE WHEN l.hour_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 3600 AS INTEGER) THEN l.hour_used ELSE 0 END
                          + CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END END,
    hour_window = CASE WHEN l.per_hour IS NULL THEN l.hour_window ELSE CAST((julianday('now') - 2440587.5) * 86400.0 / 3600 AS INTEGER) END,
    day_used = CASE WHEN l.per_day IS NULL THEN l.day_used
                    ELSE CASE WHEN l.day_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 86400 AS INTEGER) THEN l.day_used ELSE 0 END
                         + CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END END,
    day_window = CASE WHEN l.per_day IS NULL THEN l.day_window ELSE CAST((julianday('now') - 2440587.5) * 86400.0 / 86400 AS INTEGER) END
FROM (SELECT i.value ->> '$.key' AS key, count(*) AS tasks, sum(i.value ->> '$.units') AS units
      FROM json_each(:items) AS i GROUP BY 1) AS f
WHERE l.key = f.key
RETURNING key;

-- name: give_back_slots
-- LIMITS: the tasks whose ended lease still holds its limit slots, marked as
-- having given them back (see the PostgreSQL file); release_limits then gives
-- back their keys' slots (SQLite has no data-modifying CTE to do both in one).
UPDATE leaseq_tasks
SET slots_released_generation = claim_generation
WHERE id IN (SELECT value FROM json_each(:task_ids))
  AND status <> 'running' AND claim_generation > 0 AND limits IS NOT NULL
  AND slots_released_generation IS NOT claim_generation
RETURNING id, claim_generation, limits, units, queue;

-- name: release_limits
-- LIMITS: gives back slots by limit key, for the tasks give_back_slots
-- answered (see the PostgreSQL file). SQLite has no notifications: idle
-- workers poll.
UPDATE leaseq_limits AS l
SET running = max(0, l.running - CASE WHEN l.counts = 'units' THEN f.units ELSE f.tasks END)
FROM (SELECT i.value ->> '$.key' AS key, count(*) AS tasks, sum(i.value ->> '$.units') AS units
      FROM json_each(:items) AS i GROUP BY 1) AS f
WHERE l.key = f.key
RETURNING key;

-- name: charge_fair_share
-- FAIR SHARE: the keys of the tasks a claim handed out pay for it, in the
-- claim's transaction (which holds the write lock since claim_batch read
-- their virtual times): one item per task claimed under a key, {"key",
-- "priority", "start", "cost"}.
/* TEMPLATE: charge_fair_share((SELECT i.value ->> '$.key' AS key, i.value ->> '$.priority' AS priority, i.value ->> '$.start' AS start, i.value ->> '$.cost' AS cost FROM json_each(:items) AS i) AS x) */;

-- name: limit_wait
-- LIMITS: seconds until the emptiest rate bucket holds a token (NULL: none is empty).
SELECT min((1 - min(l.burst, l.tokens + ((julianday('now') - 2440587.5) * 86400.0 - l.refilled_at) * l.per_second)) / l.per_second) AS limit_wait
FROM leaseq_limits l
WHERE l.per_second IS NOT NULL
  AND l.tokens + ((julianday('now') - 2440587.5) * 86400.0 - l.refilled_at) * l.per_second < 1;

-- name: set_limit
-- LIMITS: see the PostgreSQL file.
INSERT INTO leaseq_limits (key, max_running, per_second, burst, counts, tokens, refilled_at, changed_at,
                           changed_by, per_minute, per_hour, per_day)
VALUES (:key, :max_running, :per_second, :burst, :counts, coalesce(:burst, 0), (julianday('now') - 2440587.5) * 86400.0, (julianday('now') - 2440587.5) * 86400.0, :actor,
        :per_minute, :per_hour, :per_day)
ON CONFLICT (key) DO UPDATE
SET max_running = excluded.max_running,
    per_second = excluded.per_second,
    burst = excluded.burst,
    counts = excluded.counts,
    per_minute = excluded.per_minute,
    per_hour = excluded.per_hour,
    per_day = excluded.per_day,
    tokens = CASE WHEN excluded.per_second IS NULL THEN 0
                  WHEN leaseq_limits.per_second IS NULL THEN excluded.burst
                  ELSE min(excluded.burst, leaseq_limits.tokens
                           + ((julianday('now') - 2440587.5) * 86400.0 - leaseq_limits.refilled_at) * leaseq_limits.per_second) END,
    refilled_at = (julianday('now') - 2440587.5) * 86400.0,
    changed_at = (julianday('now') - 2440587.5) * 86400.0,
    changed_by = excluded.changed_by
RETURNING key;

-- name: count_limit
-- LIMITS: recounts what live leases hold of a limit (see the PostgreSQL file;
-- the write lock makes it exact here).
UPDATE leaseq_limits AS l
SET running = (SELECT coalesce(sum(CASE WHEN l.counts = 'units' THEN t.units ELSE 1 END), 0)
               FROM leaseq_tasks t
               WHERE t.status = 'running' AND t.limits IS NOT NULL
                 AND EXISTS (SELECT 1 FROM json_each(t.limits) k WHERE k.value = l.key))
WHERE l.key = :key
RETURNING running;

-- name: delete_limit
DELETE FROM leaseq_limits WHERE key = :key RETURNING key;

-- name: list_limits
SELECT l.key, l.max_running, l.per_second, l.burst, l.counts, l.running,
       CASE WHEN l.per_second IS NULL THEN NULL
            ELSE min(l.burst, l.tokens + ((julianday('now') - 2440587.5) * 86400.0 - l.refilled_at) * l.per_second) END AS tokens,
       (SELECT count(*) FROM leaseq_tasks t
        WHERE t.status = 'running' AND t.limits IS NOT NULL
          AND EXISTS (SELECT 1 FROM json_each(t.limits) k WHERE k.value = l.key)) AS leases,
       l.changed_at, l.changed_by, l.per_minute, l.per_hour, l.per_day,
       CASE WHEN l.minute_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 60 AS INTEGER) THEN l.minute_used ELSE 0 END AS minute_used,
       CASE WHEN l.hour_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 3600 AS INTEGER) THEN l.hour_used ELSE 0 END AS hour_used,
       CASE WHEN l.day_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 86400 AS INTEGER) THEN l.day_used ELSE 0 END AS day_used,
       coalesce((SELECT sum(s.units) FROM leaseq_limit_spend s WHERE s.key = l.key AND s.day = date('now')), 0)
           AS spent_today
FROM leaseq_limits l
WHERE :key IS NULL OR l.key = :key
ORDER BY l.key;

-- name: get_effect
SELECT * FROM leaseq_effects WHERE task_id = :task_id AND idempotency_key = :idempotency_key;

-- name: list_effects
SELECT * FROM leaseq_effects WHERE task_id = :task_id ORDER BY id;

-- name: insert_effect
-- guard: none -- runs after lock_lease has checked and locked the lease in the same transaction
-- The declared-effect guard (see the PostgreSQL file): no row back, refused.
INSERT INTO leaseq_effects (task_id, generation, worker_id, action, idempotency_key, effect, args_digest, resource)
SELECT :task_id, :generation, :worker_id, :action, :idempotency_key, :effect, :args_digest, :resource
FROM leaseq_tasks AS t
WHERE t.id = :task_id
  AND ((:effect = 'read_only' AND :tool AND :resource IS NULL)
       OR (t.effect <> 'read_only'
           AND (t.actions IS NULL OR EXISTS (SELECT 1 FROM json_each(t.actions) AS a WHERE a.value = :action))
           AND (:resource IS NULL
                OR EXISTS (SELECT 1 FROM json_each(t.resources) AS r WHERE r.value = :resource))))
RETURNING *;

-- name: rebind_effect
-- guard: none -- runs after lock_lease has checked and locked the lease in the same transaction
-- A later attempt takes over an intent that never got a response (same key).
UPDATE leaseq_effects
SET generation = :generation, worker_id = :worker_id, status = 'pending',
    intent_at = (julianday('now') - 2440587.5) * 86400.0, response = NULL, response_at = NULL
WHERE id = :effect_id AND task_id = :task_id
RETURNING *;

-- name: mint_action_token
-- guard: lease
-- See the PostgreSQL file: the claims come from the rows, under the same rules.
INSERT INTO leaseq_action_tokens (token_hash, effect_id, task_id, generation, claim_epoch, action, idempotency_key,
                                  resource, issued_at, expires_at, queue)
SELECT :token_hash, e.id, t.id, t.claim_generation, t.claim_epoch, e.action, CAST(t.id AS TEXT) || ':' || e.idempotency_key,
       e.resource, (julianday('now') - 2440587.5) * 86400.0,
       min(t.lease_expires_at, (julianday('now') - 2440587.5) * 86400.0 + :ttl_seconds), t.queue
FROM leaseq_effects AS e JOIN leaseq_tasks AS t ON t.id = e.task_id
WHERE e.id = :effect_id
  AND t.id = :task_id
  AND (e.generation = t.claim_generation OR e.status = 'done')
  AND e.effect <> 'read_only'
  AND t.effect <> 'read_only'
  AND (t.actions IS NULL OR EXISTS (SELECT 1 FROM json_each(t.actions) AS a WHERE a.value = e.action))
  AND (e.resource IS NULL OR EXISTS (SELECT 1 FROM json_each(t.resources) AS r WHERE r.value = e.resource))
  /* TEMPLATE: lease_guard */
RETURNING id, issued_at, expires_at;

-- name: verify_action_token
-- See the PostgreSQL file: one row, the claims only when nothing refuses them.
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
                  WHEN k.expires_at < (julianday('now') - 2440587.5) * 86400.0 THEN 'expired'
                  WHEN :action IS NOT NULL AND k.action <> :action THEN 'wrong_action'
                  WHEN :idempotency_key IS NOT NULL AND k.idempotency_key <> :idempotency_key
                      THEN 'wrong_idempotency_key'
                  WHEN :resource IS NOT NULL AND k.resource <> :resource THEN 'wrong_resource'
                  WHEN t.claim_generation IS NOT k.generation OR t.claim_epoch IS NOT k.claim_epoch
                      THEN 'superseded'
                  WHEN t.status <> 'running' OR t.lease_expires_at < (julianday('now') - 2440587.5) * 86400.0
                      THEN 'lease_ended'
             END AS refusal,
             k.task_id, k.generation, k.claim_epoch, k.action, k.idempotency_key, k.resource, k.issued_at, k.expires_at,
             t.lease_expires_at
      FROM (SELECT 1) AS one
      LEFT JOIN leaseq_action_tokens AS k ON k.id = :token_id AND k.token_hash = :token_hash
      LEFT JOIN leaseq_tasks AS t ON t.id = k.task_id) AS r;

-- name: adjust_open_effects
UPDATE leaseq_tasks SET open_effects = open_effects + :delta,
                        updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :task_id;

-- name: finish_effect
UPDATE leaseq_effects
SET status = 'done', response = :response, response_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :effect_id AND task_id = :task_id AND generation = :generation AND status = 'pending'
RETURNING *;

-- name: settle_open_effects
UPDATE leaseq_effects SET status = 'reconciled', response_at = (julianday('now') - 2440587.5) * 86400.0
WHERE task_id = :task_id AND status = 'pending'
RETURNING id, action, idempotency_key, generation;

-- name: cancel_task
UPDATE leaseq_tasks
SET status = 'cancelled', last_error = :reason, lease_owner = NULL, lease_expires_at = NULL,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :task_id AND status NOT IN ('completed', 'cancelled', 'denied')
RETURNING id, status, claim_generation;

-- name: tasks_where
SELECT t.* FROM leaseq_tasks t
WHERE t.status IN (SELECT value FROM json_each(:statuses))
  AND (:queue IS NULL OR t.queue = :queue)
  AND (:kind IS NULL OR t.kind = :kind)
  AND (:error IS NULL OR instr(lower(t.last_error), lower(:error)) > 0)
  AND (:older_than IS NULL OR t.updated_at < (julianday('now') - 2440587.5) * 86400.0 - :older_than)
ORDER BY t.id
LIMIT :row_limit;

-- name: set_task_status
UPDATE leaseq_tasks
SET status = :status,
    result = CASE WHEN :set_result THEN :result ELSE result END,
    attempts = CASE WHEN :reset_attempts THEN 0 ELSE attempts END,
    error_streak = CASE WHEN :reset_attempts THEN 0 ELSE error_streak END,
    open_effects = CASE WHEN :from_status = 'needs_reconciliation' THEN 0 ELSE open_effects END,
    available_at = (julianday('now') - 2440587.5) * 86400.0,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :task_id AND status = :from_status
RETURNING id, status, claim_generation, attempts;

-- name: insert_event
-- guard: none -- evidence, written in the transaction of the operation it records
INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
VALUES (:task_id, :type, :generation, :worker_id, :detail);

-- name: insert_events
INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
SELECT e.value ->> '$.task_id', e.value ->> '$.type', e.value ->> '$.generation', e.value ->> '$.worker_id',
       e.value -> '$.detail'
FROM json_each(:events) AS e;

-- name: report_loss
-- guard: none -- evidence of a lease already lost; conditioned on the events of that generation
-- A worker's own account of losing a lease: one per lost generation. Written
-- only when this worker was issued the generation (its "claimed" event), the
-- generation did not end by the holder's own hand (completed, failed,
-- released) and no loss was reported for it yet. The caller locks the task
-- row first (lock_task), so two reports of one generation run one after the
-- other and the second sees the first. No row back: nothing was written.
INSERT INTO leaseq_events (task_id, type, generation, worker_id, detail)
SELECT :task_id, 'lease_lost', :generation, :worker_id, :detail
WHERE EXISTS (SELECT 1 FROM leaseq_events e
              WHERE e.task_id = :task_id AND e.generation = :generation
                AND e.type = 'claimed' AND e.worker_id = :worker_id)
  AND NOT EXISTS (SELECT 1 FROM leaseq_events e
                  WHERE e.task_id = :task_id AND e.generation = :generation
                    AND e.type IN ('completed', 'failed', 'lease_released', 'suspended', 'diverged', 'lease_lost'))
RETURNING id;

-- name: generation_outcome
-- guard: none -- a read of a generation's events (why report_loss wrote nothing)
-- Why report_loss wrote nothing: was the generation this worker's, and what
-- ended it (the first of completed, failed, lease_released, lease_lost)?
SELECT EXISTS (SELECT 1 FROM leaseq_events
               WHERE task_id = :task_id AND type = 'claimed'
                 AND generation = :generation AND worker_id = :worker_id) AS held,
       (SELECT type FROM leaseq_events
        WHERE task_id = :task_id AND generation = :generation
          AND type IN ('completed', 'failed', 'lease_released', 'suspended', 'diverged', 'lease_lost')
        ORDER BY id LIMIT 1) AS ended;

-- name: list_events
-- See the PostgreSQL file: the "enqueued" entry (id 0) is the task row itself.
SELECT 0 AS id, t.id AS task_id, 'enqueued' AS type, NULL AS generation, NULL AS worker_id,
       t.created_at AS at,
       json_object('queue', t.queue, 'kind', t.kind, 'effect', t.effect,
                   'idempotency_key', t.idempotency_key, 'priority', t.priority) AS detail
FROM leaseq_tasks t WHERE t.id = :task_id
UNION ALL
SELECT id, task_id, type, generation, worker_id, at, detail FROM leaseq_events WHERE task_id = :task_id
ORDER BY id;

-- name: list_trails
-- See the PostgreSQL file: list_events for every task (the newest :limit), by task and id.
WITH t AS (SELECT id, queue, kind, effect, idempotency_key, priority, created_at
           FROM leaseq_tasks ORDER BY id DESC LIMIT :limit)
SELECT 0 AS id, t.id AS task_id, 'enqueued' AS type, NULL AS generation, NULL AS worker_id,
       t.created_at AS at,
       json_object('queue', t.queue, 'kind', t.kind, 'effect', t.effect,
                   'idempotency_key', t.idempotency_key, 'priority', t.priority) AS detail,
       t.queue AS queue
FROM t
UNION ALL
SELECT e.id, e.task_id, e.type, e.generation, e.worker_id, e.at, e.detail, t.queue
FROM leaseq_events e JOIN t ON t.id = e.task_id
ORDER BY task_id, id;

-- name: set_paused
-- (see the PostgreSQL file; the WHERE also keeps SQLite from reading ON CONFLICT as a join)
INSERT INTO leaseq_queues (name, paused, changed_at, changed_by)
SELECT :queue, :paused, (julianday('now') - 2440587.5) * 86400.0, :actor
WHERE :create OR EXISTS (SELECT 1 FROM leaseq_queues WHERE name = :queue)
              OR EXISTS (SELECT 1 FROM leaseq_tasks WHERE queue = :queue)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, changed_at = excluded.changed_at,
                                 changed_by = excluded.changed_by
RETURNING name, paused, changed_at, changed_by;

-- name: known_queues
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
LIMIT :limit;

-- name: list_queues
SELECT name, paused, changed_at, changed_by FROM leaseq_queues ORDER BY name;

-- name: stats
SELECT queue, status, count(*) AS count,
       (julianday('now') - 2440587.5) * 86400.0
           - min(available_at) FILTER (WHERE status = 'queued'
                                        AND available_at <= (julianday('now') - 2440587.5) * 86400.0)
           AS oldest_queued_seconds,
       count(*) FILTER (WHERE status = 'running'
                         AND lease_expires_at < (julianday('now') - 2440587.5) * 86400.0) AS expired_leases
FROM leaseq_tasks
GROUP BY queue, status
ORDER BY queue, status;



-- ============================================================================
-- Approval gates (leaseq.engine.approvals): see the PostgreSQL file.
-- ============================================================================

-- name: hold_for_approval
UPDATE leaseq_tasks SET status = 'awaiting_approval', updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :task_id AND status = 'queued'
RETURNING *;

-- name: approval_request
INSERT INTO leaseq_approvals (task_id, digest, requested_by, deadline_at, requested_worker, requested_token)
VALUES (:task_id, :digest, :requested_by,
        CASE WHEN :deadline IS NULL THEN NULL
             ELSE (julianday('now') - 2440587.5) * 86400.0 + :deadline END,
        :requested_worker, :requested_token)
RETURNING *;

-- name: get_approval
-- See the PostgreSQL file: the undecided request, else the latest.
SELECT * FROM leaseq_approvals WHERE task_id = :task_id
ORDER BY decision IS NOT NULL, request <> 'budget'
LIMIT 1;

-- name: decide_approval
UPDATE leaseq_approvals
SET decision = :decision, decided_by = :decided_by, decided_via = :decided_via, note = :note,
    decided_at = (julianday('now') - 2440587.5) * 86400.0
WHERE task_id = :task_id AND decision IS NULL
RETURNING *;

-- name: approvals_due
-- The transaction holds SQLite's write lock: no operator decides meanwhile.
SELECT t.id FROM leaseq_approvals a JOIN leaseq_tasks t ON t.id = a.task_id
WHERE a.decision IS NULL AND a.deadline_at <= (julianday('now') - 2440587.5) * 86400.0
  AND t.status = 'awaiting_approval'
ORDER BY a.deadline_at
LIMIT :limit;

-- name: list_awaiting_approval
SELECT t.*, a.digest AS approval_digest, a.requested_by AS approval_requested_by,
       a.requested_at AS approval_requested_at, a.deadline_at AS approval_deadline_at,
       a.requested_worker AS approval_requested_worker, a.requested_token AS approval_requested_token,
       a.reason AS approval_reason, a.detail
FROM leaseq_tasks t JOIN leaseq_approvals a ON a.task_id = t.id
WHERE t.status = 'awaiting_approval' AND a.decision IS NULL
  AND (:queue IS NULL OR t.queue = :queue)
ORDER BY t.id
LIMIT :limit;

-- name: decide_approval_in_time
-- See the PostgreSQL file. 'now' is read once per statement: the deadline is
-- judged, and decided_at written, with the same reading.
UPDATE leaseq_approvals
SET decision = :decision, decided_by = :decided_by, decided_via = :decided_via, note = :note,
    decided_at = (julianday('now') - 2440587.5) * 86400.0
WHERE task_id = :task_id AND decision IS NULL
  AND (deadline_at IS NULL OR (julianday('now') - 2440587.5) * 86400.0 < deadline_at)
RETURNING *;

-- name: late_approvals
-- See the PostgreSQL file. The transaction holds SQLite's write lock.
SELECT t.id FROM leaseq_approvals a JOIN leaseq_tasks t ON t.id = a.task_id
WHERE a.decision = 'approved' AND a.decided_at >= a.deadline_at AND t.status = 'queued'
ORDER BY t.id
LIMIT :limit;

-- name: set_parent_task
UPDATE leaseq_tasks SET parent_task_id = :parent_task_id,
    budget_owners = (SELECT p.budget_owners FROM leaseq_tasks AS p WHERE p.id = :parent_task_id)
WHERE id = :task_id
RETURNING *;

-- name: lock_intents
-- See the PostgreSQL file. The transaction holds SQLite's write lock.
SELECT id, parent_task_id, status, claim_generation, lease_owner FROM leaseq_tasks
WHERE parent_task_id IS NOT NULL AND parent_task_id IN (SELECT value FROM json_each(:task_ids))
  AND status NOT IN ('completed', 'cancelled', 'denied', 'expired')
ORDER BY id;

-- name: cancel_intents
UPDATE leaseq_tasks
SET status = 'cancelled', last_error = 'cancelled: its parent task ' || parent_task_id || ' was cancelled',
    parent_cancelled_at = (julianday('now') - 2440587.5) * 86400.0,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id IN (SELECT value FROM json_each(:task_ids)) AND status IN ('queued', 'waiting', 'awaiting_approval')
RETURNING id, parent_task_id, status;

-- name: mark_parent_cancelled
UPDATE leaseq_tasks SET parent_cancelled_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id IN (SELECT value FROM json_each(:task_ids)) AND parent_cancelled_at IS NULL
RETURNING id;

-- ============================================================================
-- Service: tokens, access and retention
-- ============================================================================
-- Same names and parameters as the PostgreSQL section; see it for comments.

-- name: token_insert
INSERT INTO leaseq_tokens (id, name, role, secret_hash, queues, read_payloads, own_intents, created_by,
                           expires_at)
VALUES (:token_id, :name, :role, :secret_hash, :queues, :read_payloads, :own_intents, :created_by,
        CASE WHEN :expires_in IS NULL THEN NULL
             ELSE (julianday('now') - 2440587.5) * 86400.0 + :expires_in END)
RETURNING *, 0 AS expired;

-- name: token_get
-- touch_due: token_touch would write (so a verification that would not touch skips the statement).
SELECT t.*, (t.expires_at IS NOT NULL AND t.expires_at <= (julianday('now') - 2440587.5) * 86400.0) AS expired,
       (t.last_used_at IS NULL OR t.last_used_at < (julianday('now') - 2440587.5) * 86400.0 - 60) AS touch_due
FROM leaseq_tokens t WHERE t.id = :token_id;

-- name: token_hashes
SELECT t.id, t.secret_hash FROM leaseq_tokens t;

-- name: token_touch
UPDATE leaseq_tokens SET last_used_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :token_id
  AND (last_used_at IS NULL OR last_used_at < (julianday('now') - 2440587.5) * 86400.0 - 60);

-- name: token_list
SELECT t.id, t.name, t.role, t.queues, t.read_payloads, t.own_intents, t.created_at, t.created_by, t.expires_at,
       t.revoked_at, t.revoked_by, t.last_used_at,
       (t.expires_at IS NOT NULL AND t.expires_at <= (julianday('now') - 2440587.5) * 86400.0) AS expired,
       (SELECT count(*) FROM leaseq_workers w WHERE w.token_id = t.id) AS workers
FROM leaseq_tokens t ORDER BY t.created_at, t.id;

-- name: token_revoke
UPDATE leaseq_tokens SET revoked_at = (julianday('now') - 2440587.5) * 86400.0, revoked_by = :actor
WHERE id = :token_id AND revoked_at IS NULL
RETURNING id;

-- name: token_revoke_workers
UPDATE leaseq_workers SET revoked_at = (julianday('now') - 2440587.5) * 86400.0
WHERE token_id = :token_id AND revoked_at IS NULL
RETURNING id;

-- name: link_worker_token
-- guard: none -- links a new worker to its credential; no lease involved
UPDATE leaseq_workers SET token_id = :token_id WHERE id = :worker_id RETURNING id;

-- name: worker_token
-- guard: none -- a read of the worker's credential (authorization)
SELECT id, token_id, revoked_at FROM leaseq_workers WHERE id = :worker_id;

-- name: token_held_task
-- Whether a worker of this token holds or has held a lease on the task (a
-- worker token reads those tasks only): its "claimed" events name the worker.
SELECT EXISTS (SELECT 1 FROM leaseq_events e JOIN leaseq_workers w ON w.id = e.worker_id
               WHERE e.task_id = :task_id AND e.type = 'claimed'
                 AND w.token_id = :token_id) AS held;

-- name: audit_insert
INSERT INTO leaseq_audit (actor, action, target, detail) VALUES (:actor, :action, :target, :detail);

-- name: audit_list
SELECT id, at, actor, action, target, detail FROM leaseq_audit ORDER BY id DESC LIMIT :limit;

-- name: session_insert
-- A dashboard session made from a verified token; the id is stored hashed.
INSERT INTO leaseq_sessions (id_hash, token_id, expires_at)
VALUES (:id_hash, :token_id, (julianday('now') - 2440587.5) * 86400.0 + :seconds)
RETURNING token_id, expires_at;

-- name: session_get
-- The session and the token it was made from, judged by the database clock:
-- a session is only as good as its token (revoked or expired ends it too).
SELECT t.*, (t.expires_at IS NOT NULL AND t.expires_at <= (julianday('now') - 2440587.5) * 86400.0) AS expired,
       s.expires_at AS session_expires_at, (s.expires_at <= (julianday('now') - 2440587.5) * 86400.0) AS session_expired
FROM leaseq_sessions s JOIN leaseq_tokens t ON t.id = s.token_id
WHERE s.id_hash = :id_hash;

-- name: session_delete
-- Logout: the session ends for every replica at once.
DELETE FROM leaseq_sessions WHERE id_hash = :id_hash;

-- name: session_delete_for_token
-- Revoking a token ends every dashboard session made from it.
DELETE FROM leaseq_sessions WHERE token_id = :token_id RETURNING id_hash;

-- name: session_prune
-- Expired sessions are dropped at the next login.
DELETE FROM leaseq_sessions WHERE expires_at <= (julianday('now') - 2440587.5) * 86400.0;

-- name: prune_finished_ids
SELECT id FROM leaseq_tasks
WHERE status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
  AND updated_at < (julianday('now') - 2440587.5) * 86400.0 - :older_than
ORDER BY id
LIMIT :limit;

-- name: keep_evidence
INSERT INTO leaseq_evidence (task_id, queue, kind, task_status, ended_at, event_id, type, generation, worker_id,
                             at, detail)
SELECT t.id, t.queue, t.kind, t.status, t.updated_at, NULL, 'enqueued', NULL, NULL, t.created_at,
       json_object('effect', t.effect, 'priority', t.priority)
FROM leaseq_tasks t
WHERE t.id IN (SELECT value FROM json_each(:task_ids)) AND t.status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
UNION ALL
SELECT t.id, t.queue, t.kind, t.status, t.updated_at, e.id, e.type, e.generation, e.worker_id, e.at,
       (SELECT json_group_object(d.key, json(e.detail -> d.fullkey))
        FROM json_each(e.detail) AS d WHERE d.key IN (SELECT value FROM json_each(:kept_keys)))
FROM leaseq_events e JOIN leaseq_tasks t ON t.id = e.task_id
WHERE e.task_id IN (SELECT value FROM json_each(:task_ids)) AND t.status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
ORDER BY 1, 6
RETURNING id;

-- name: prune_events
DELETE FROM leaseq_events WHERE task_id IN (SELECT value FROM json_each(:task_ids)) RETURNING id;

-- name: prune_effects
DELETE FROM leaseq_effects WHERE task_id IN (SELECT value FROM json_each(:task_ids)) RETURNING id;

-- name: prune_tasks
DELETE FROM leaseq_tasks
WHERE id IN (SELECT value FROM json_each(:task_ids)) AND status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
RETURNING id;

-- name: scrub_finished_ids
SELECT id FROM leaseq_tasks
WHERE status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
  AND updated_at < (julianday('now') - 2440587.5) * 86400.0 - :older_than
  AND scrubbed_at IS NULL
ORDER BY id
LIMIT :limit;

-- name: scrub_tasks
UPDATE leaseq_tasks SET payload = 'null', result = NULL, last_error = NULL, scrubbed_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id IN (SELECT value FROM json_each(:task_ids)) AND status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
RETURNING id;

-- name: scrub_effects
UPDATE leaseq_effects SET response = NULL, args_digest = NULL
WHERE task_id IN (SELECT value FROM json_each(:task_ids)) AND (response IS NOT NULL OR args_digest IS NOT NULL)
RETURNING id;

-- name: scrub_signals
UPDATE leaseq_signals SET payload = NULL
WHERE task_id IN (SELECT value FROM json_each(:task_ids)) AND payload IS NOT NULL
RETURNING id;

-- name: scrub_approvals
UPDATE leaseq_approvals SET note = NULL, digest = 'cleared'
WHERE task_id IN (SELECT value FROM json_each(:task_ids)) AND (note IS NOT NULL OR digest <> 'cleared')
RETURNING task_id;

-- name: scrub_events
UPDATE leaseq_events
SET detail = (SELECT json_group_object(d.key, json(leaseq_events.detail -> d.fullkey))
        FROM json_each(leaseq_events.detail) AS d WHERE d.key IN (SELECT value FROM json_each(:kept_keys)))
WHERE task_id IN (SELECT value FROM json_each(:task_ids))
RETURNING id;

-- name: scrub_audit
UPDATE leaseq_audit
SET detail = (SELECT json_group_object(d.key, json(leaseq_audit.detail -> d.fullkey))
        FROM json_each(leaseq_audit.detail) AS d WHERE d.key IN (SELECT value FROM json_each(:kept_keys)))
WHERE target IN (SELECT 'task:' || value FROM json_each(:task_ids))
RETURNING id;

-- name: prune_evidence
DELETE FROM leaseq_evidence
WHERE id IN (SELECT id FROM leaseq_evidence
             WHERE ended_at < (julianday('now') - 2440587.5) * 86400.0 - :older_than
             ORDER BY id
             LIMIT :limit)
RETURNING id;

-- name: prune_audit
DELETE FROM leaseq_audit
WHERE id IN (SELECT id FROM leaseq_audit
             WHERE at < (julianday('now') - 2440587.5) * 86400.0 - :older_than
             ORDER BY id
             LIMIT :limit)
RETURNING id;

-- name: prune_flow_keys
-- See the PostgreSQL file (a write transaction of SQLite holds the file: no row to skip).
DELETE FROM leaseq_flow_keys
WHERE rowid IN (SELECT rowid FROM leaseq_flow_keys
                WHERE locked_at < (julianday('now') - 2440587.5) * 86400.0 - :older_than
                ORDER BY locked_at
                LIMIT :limit)
RETURNING scope;

-- name: prune_fairness
-- See the PostgreSQL file (a write transaction of SQLite holds the file: no row to skip).
DELETE FROM leaseq_fairness
WHERE rowid IN (SELECT f.rowid FROM leaseq_fairness f
                WHERE f.served_at < (julianday('now') - 2440587.5) * 86400.0 - :older_than
                  AND f.vstart < (SELECT max(m.vstart) FROM leaseq_fairness m
                                  WHERE m.queue = f.queue AND m.priority = f.priority)
                  AND (SELECT t.id FROM leaseq_tasks t INDEXED BY leaseq_tasks_fair
                       WHERE t.status = 'queued' AND t.queue = f.queue AND t.fairness_key = f.key LIMIT 1) IS NULL
                  AND (f.key <> '' OR (SELECT t.id FROM leaseq_tasks t INDEXED BY leaseq_tasks_claimable
                                       WHERE t.status = 'queued' AND t.queue = f.queue AND t.fairness_key IS NULL
                                       LIMIT 1) IS NULL)
                ORDER BY f.served_at
                LIMIT :limit)
RETURNING key;

-- name: prune_spend
-- See the PostgreSQL file. The day is the ISO date, as text: it orders as the date does.
DELETE FROM leaseq_limit_spend
WHERE rowid IN (SELECT rowid FROM leaseq_limit_spend
                WHERE day < date((julianday('now') - 2440587.5) * 86400.0 - :older_than, 'unixepoch')
                ORDER BY day
                LIMIT :limit)
RETURNING key;

-- name: list_evidence
SELECT id, task_id, queue, kind, task_status, ended_at, event_id, type, generation, worker_id, at, detail, kept_at
FROM leaseq_evidence WHERE task_id = :task_id
ORDER BY id;

-- name: open_intents_by_queue
SELECT t.queue, count(*) AS count
FROM leaseq_effects e JOIN leaseq_tasks t ON t.id = e.task_id
WHERE e.status = 'pending'
GROUP BY t.queue ORDER BY t.queue;


-- ============================================================================
-- Dashboard reads: task pages, workers, charts, live-update versions
-- ============================================================================
-- Same names and parameters as the PostgreSQL section; see it for comments.

-- name: dashboard_tasks_older
SELECT * FROM leaseq_tasks
WHERE (:status IS NULL OR status = :status)
  AND (:kind IS NULL OR kind = :kind)
  AND (:queue IS NULL OR queue = :queue)
  AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
  AND (:search IS NULL OR instr(idempotency_key, :search) > 0 OR instr(CAST(id AS TEXT), :search) > 0)
  AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit;

-- name: dashboard_tasks_newer
SELECT * FROM leaseq_tasks
WHERE (:status IS NULL OR status = :status)
  AND (:kind IS NULL OR kind = :kind)
  AND (:queue IS NULL OR queue = :queue)
  AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
  AND (:search IS NULL OR instr(idempotency_key, :search) > 0 OR instr(CAST(id AS TEXT), :search) > 0)
  AND id > :after
ORDER BY id
LIMIT :limit;

-- name: dashboard_kinds
SELECT DISTINCT kind FROM leaseq_tasks
WHERE (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
ORDER BY kind LIMIT 200;

-- name: dashboard_worker_leases
SELECT id, queue, kind, claim_generation, lease_owner, lease_expires_at, claimed_at, last_heartbeat_at,
       lease_expires_at < (julianday('now') - 2440587.5) * 86400.0 AS expired
FROM leaseq_tasks
WHERE status = 'running' AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
ORDER BY lease_owner, id
LIMIT :limit;

-- name: dashboard_workers
SELECT w.id, w.name, w.registered_at, w.revoked_at, w.last_heartbeat_at, w.heartbeat_seconds,
       w.lease_seconds, w.stopped_at, w.stop_reason,
       (SELECT count(*) FROM leaseq_tasks t WHERE t.status = 'running' AND t.lease_owner = w.id
          AND (:queues IS NULL OR t.queue IN (SELECT value FROM json_each(:queues)))) AS leases,
       (SELECT coalesce(json_group_array(kind), '[]') FROM (SELECT k.kind FROM leaseq_worker_kinds k
        WHERE k.worker_id = w.id AND (:queues IS NULL OR k.queue IN (SELECT value FROM json_each(:queues)))
        ORDER BY k.kind)) AS kinds,
       (julianday('now') - 2440587.5) * 86400.0 AS now
FROM leaseq_workers w
WHERE :queues IS NULL
   OR EXISTS (SELECT 1 FROM leaseq_worker_kinds k WHERE k.worker_id = w.id
                                                    AND k.queue IN (SELECT value FROM json_each(:queues)))
   OR EXISTS (SELECT 1 FROM leaseq_tasks t WHERE t.status = 'running' AND t.lease_owner = w.id
                                             AND t.queue IN (SELECT value FROM json_each(:queues)))
ORDER BY w.registered_at;

-- name: dashboard_worker_last_events
SELECT worker_id, max(at) AS last_event_at
FROM leaseq_events
WHERE worker_id IS NOT NULL AND id > (SELECT coalesce(max(id), 0) FROM leaseq_events) - :recent
GROUP BY worker_id;

-- name: dashboard_completed_by_minute
SELECT CAST(CAST(updated_at / 60 AS INTEGER) * 60 AS REAL) AS minute, kind, queue, count(*) AS completed,
       sum(updated_at - claimed_at) AS seconds_sum, max(updated_at - claimed_at) AS seconds_max
FROM leaseq_tasks
WHERE status = 'completed' AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
  AND updated_at >= (julianday('now') - 2440587.5) * 86400.0 - :window
GROUP BY 1, 2, 3
ORDER BY 1;

-- name: dashboard_depth_by_minute
WITH RECURSIVE m(minute) AS (
    SELECT CAST(CAST((julianday('now') - 2440587.5) * 86400.0 / 60 AS INTEGER) * 60 AS REAL) - :window + 60
    UNION ALL
    SELECT minute + 60 FROM m
    WHERE minute + 60 <= CAST(CAST((julianday('now') - 2440587.5) * 86400.0 / 60 AS INTEGER) * 60 AS REAL)
), at AS (
    SELECT minute, min(minute + 60, (julianday('now') - 2440587.5) * 86400.0) AS at FROM m
)
SELECT at.minute AS minute, t.kind, t.queue, count(*) AS depth
FROM at JOIN leaseq_tasks t
  ON t.created_at <= at.at AND t.available_at <= at.at AND (t.claimed_at IS NULL OR t.claimed_at > at.at)
 AND NOT (t.status NOT IN ('queued', 'running') AND t.updated_at <= at.at)
WHERE (t.status = 'queued' OR t.updated_at >= (julianday('now') - 2440587.5) * 86400.0 - :window)
  AND (:queues IS NULL OR t.queue IN (SELECT value FROM json_each(:queues)))
GROUP BY 1, 2, 3
ORDER BY 1;

-- name: dashboard_failures_by_minute
SELECT CAST(CAST(e.at / 60 AS INTEGER) * 60 AS REAL) AS minute, e.type, t.kind, t.queue, count(*) AS count
FROM leaseq_events e JOIN leaseq_tasks t ON t.id = e.task_id
WHERE e.type IN ('failed', 'lease_expired', 'lease_revoked')
  AND (:queues IS NULL OR t.queue IN (SELECT value FROM json_each(:queues)))
  AND e.at >= (julianday('now') - 2440587.5) * 86400.0 - :window
GROUP BY 1, 2, 3, 4
ORDER BY 1;

-- name: dashboard_fair_queued
-- See the PostgreSQL file.
SELECT t.queue, t.fairness_key AS key, count(*) AS queued, max(t.fairness_weight) AS weight
FROM leaseq_tasks t INDEXED BY leaseq_tasks_fair
WHERE t.status = 'queued' AND t.fairness_key IS NOT NULL
GROUP BY t.queue, t.fairness_key
ORDER BY count(*) DESC, t.queue, t.fairness_key
LIMIT :limit;

-- name: dashboard_fair_claims
-- See the PostgreSQL file.
WITH served AS (
    SELECT t.queue, coalesce(t.fairness_key, '') AS key, count(*) AS claims, max(t.fairness_weight) AS weight
    FROM leaseq_events e JOIN leaseq_tasks t ON t.id = e.task_id
    WHERE e.id > (SELECT coalesce(max(id), 0) FROM leaseq_events) - :recent
      AND e.type = 'claimed' AND e.at >= (julianday('now') - 2440587.5) * 86400.0 - :window
    GROUP BY 1, 2
), totals AS (
    SELECT queue, sum(claims) AS total, max(key <> '') AS keyed FROM served GROUP BY queue
)
SELECT s.queue, s.key, s.claims, s.weight, x.total AS queue_claims
FROM served s JOIN totals x ON x.queue = s.queue
WHERE x.keyed
ORDER BY s.claims DESC, s.queue, s.key
LIMIT :limit;

-- name: dashboard_task_version
SELECT t.status, t.updated_at, t.claim_generation, t.heartbeat_count, t.open_effects,
       (SELECT count(*) FROM leaseq_events e WHERE e.task_id = t.id) AS events,
       (SELECT count(*) FROM leaseq_effects f WHERE f.task_id = t.id AND f.status <> 'pending') AS answered
FROM leaseq_tasks t WHERE t.id = :task_id AND (:queues IS NULL OR t.queue IN (SELECT value FROM json_each(:queues)));


-- ============================================================================
-- Dependencies (enqueue after=) and waiting for a task's end (Queue.wait)
-- ============================================================================
-- See the PostgreSQL file. SQLite runs one writer at a time (BEGIN
-- IMMEDIATE): no row locks are needed to order an enqueue with a completion.

-- name: mark_upstreams
UPDATE leaseq_tasks SET has_dependents = 1
WHERE id IN (SELECT value FROM json_each(:task_ids))
RETURNING id, status;

-- name: insert_dependencies
INSERT INTO leaseq_dependencies (waiter, upstream, on_failure)
SELECT w.value, u.value, :on_failure
FROM json_each(:waiters) AS w, json_each(:upstreams) AS u
WHERE true  -- an INSERT ... SELECT needs a WHERE before ON CONFLICT in SQLite
ON CONFLICT DO NOTHING;

-- name: hold_tasks
UPDATE leaseq_tasks SET status = 'waiting'
WHERE id IN (SELECT value FROM json_each(:task_ids)) AND status = 'queued'
RETURNING id;

-- name: lock_waiters
-- The write lock is the transaction's already: a plain read.
SELECT t.id FROM leaseq_tasks t
WHERE t.status = 'waiting'
  AND t.id IN (SELECT d.waiter FROM leaseq_dependencies d
               WHERE d.upstream IN (SELECT value FROM json_each(:task_ids)))
ORDER BY t.id;

-- name: waiter_upstreams
SELECT d.waiter, d.upstream, d.on_failure, u.status
FROM leaseq_dependencies d JOIN leaseq_tasks u ON u.id = d.upstream
WHERE d.waiter IN (SELECT value FROM json_each(:task_ids))
ORDER BY d.waiter, d.upstream;

-- name: settle_waiters
UPDATE leaseq_tasks AS t
SET status = c.status,
    last_error = coalesce(c.reason, t.last_error),
    available_at = max(t.available_at, (julianday('now') - 2440587.5) * 86400.0),
    updated_at = (julianday('now') - 2440587.5) * 86400.0
FROM (SELECT i.value ->> '$.task_id' AS task_id, i.value ->> '$.status' AS status,
             i.value ->> '$.reason' AS reason
      FROM json_each(:items) AS i) AS c
WHERE t.id = c.task_id AND t.status = 'waiting'
RETURNING id, status, queue;

-- name: dependency_results
SELECT u.id, u.status, u.result
FROM leaseq_dependencies d JOIN leaseq_tasks u ON u.id = d.upstream
WHERE d.waiter = :task_id
ORDER BY u.id;

-- name: watch_task
-- no-op: SQLite cannot notify; Queue.wait polls instead

-- DURABLE WAITS (schema 26): see the PostgreSQL file.

-- name: record_wait
-- guard: lease
-- See the PostgreSQL file: a wait's ledger entry, answered, under the lease.
INSERT INTO leaseq_effects (task_id, generation, worker_id, action, idempotency_key, effect, status, response,
                            response_at)
SELECT t.id, t.claim_generation, :worker_id, :action, :idempotency_key, 'read_only', 'done',
       json_patch(coalesce(:response, '{}'),
                  CASE WHEN :until IS NULL AND :seconds IS NULL THEN '{}'
                       ELSE json_object('until', coalesce(:until,
                                                          (julianday('now') - 2440587.5) * 86400.0 + :seconds))
                  END),
       (julianday('now') - 2440587.5) * 86400.0
FROM leaseq_tasks AS t
WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */
RETURNING *;

-- name: suspend_task
-- guard: lease
-- See the PostgreSQL file: the attempt ends in a durable wait, given back.
UPDATE leaseq_tasks AS t
SET status = CASE
        /* TEMPLATE: unsettled_side_effect */
        WHEN :approval THEN 'awaiting_approval'  -- a budget spent (see the PostgreSQL file)
        ELSE 'waiting' END,
    attempts = t.attempts - 1,
    wake_at = :until,
    wait_signal = :signal,
    wait_children = :children,
    available_at = coalesce(:until, (julianday('now') - 2440587.5) * 86400.0),
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */
RETURNING id, status, claim_generation, attempts, wake_at, wait_signal, wait_children,
          heartbeat_count, last_heartbeat_at, longest_heartbeat_gap, queue, limits, units,
          CASE status WHEN 'needs_reconciliation'
              THEN 'wait begun with a side-effect intent and no recorded response' END AS reason;

-- name: diverge_task
-- guard: lease
-- See the PostgreSQL file: the handler diverged from its recorded run.
UPDATE leaseq_tasks AS t
SET status = 'needs_reconciliation',
    attempts = t.attempts - 1,
    last_error = :error,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */
RETURNING id, status, claim_generation, attempts, code_version,
          heartbeat_count, last_heartbeat_at, longest_heartbeat_gap, queue, limits, units,
          'the handler diverged from its recorded run (its diverged event and last_error name the entry)' AS reason;

-- name: lock_sleepers
-- See the PostgreSQL file (the transaction holds the write lock: nothing to skip).
SELECT id, queue, claim_generation, wake_at, wait_signal
FROM leaseq_tasks
WHERE status = 'waiting' AND queue = :queue AND wake_at <= (julianday('now') - 2440587.5) * 86400.0
ORDER BY wake_at
LIMIT :limit;

-- name: wake_tasks
UPDATE leaseq_tasks AS t
SET status = 'queued',
    available_at = t.wake_at,
    wake_at = NULL,
    wait_signal = NULL,
    wait_children = NULL,  -- a wait for children whose timeout passed
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE t.id IN (SELECT value FROM json_each(:task_ids))
  AND t.status = 'waiting' AND t.wake_at <= (julianday('now') - 2440587.5) * 86400.0
RETURNING id, queue;

-- name: insert_signal
INSERT INTO leaseq_signals (task_id, name, payload, sent_by)
VALUES (:task_id, :name, :payload, :actor)
RETURNING *;

-- name: wake_for_signal
UPDATE leaseq_tasks AS t
SET status = 'queued',
    available_at = (julianday('now') - 2440587.5) * 86400.0,
    wake_at = NULL,
    wait_signal = NULL,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE t.id = :task_id AND t.status = 'waiting' AND t.wait_signal = :name
RETURNING id, queue, claim_generation;

-- name: pending_signal
-- guard: none -- runs after lock_lease has checked the lease in the same transaction
SELECT s.id, s.name, s.payload, s.sent_by, s.sent_at
FROM leaseq_signals s
WHERE s.task_id = :task_id AND s.name = :name AND s.consumed_at IS NULL
ORDER BY s.id
LIMIT 1;

-- name: consume_signal
-- guard: lease
UPDATE leaseq_signals AS s
SET consumed_at = (julianday('now') - 2440587.5) * 86400.0, consumed_generation = :generation,
    consumed_key = :idempotency_key
FROM leaseq_tasks AS t
WHERE s.id = :signal_id AND s.task_id = :task_id AND s.consumed_at IS NULL AND t.id = s.task_id
  /* TEMPLATE: lease_guard */
RETURNING id, name, payload, sent_by, sent_at, consumed_at;

-- name: list_asks
-- See the PostgreSQL file: the open questions (ctx.ask), oldest first.
SELECT t.id AS task_id, t.queue, t.kind, e.response, e.response_at AS asked_at, t.wake_at AS deadline_at
FROM leaseq_tasks t
JOIN leaseq_effects e ON e.id = (SELECT max(x.id) FROM leaseq_effects x
                                 WHERE x.task_id = t.id AND x.action = :action
                                   AND x.response ->> '$.state' = 'waiting')
WHERE t.status = 'waiting' AND t.wait_signal = :signal
  AND (t.wake_at IS NULL OR t.wake_at > (julianday('now') - 2440587.5) * 86400.0)
  AND (:queue IS NULL OR t.queue = :queue)
ORDER BY e.response_at, t.id
LIMIT :limit;

-- name: open_ask
-- See the PostgreSQL file: a task's latest question, open or not, and who answered it.
SELECT e.response, e.response_at AS asked_at, e.response ->> '$.until' AS deadline_at,
       (t.status = 'waiting' AND t.wait_signal = :signal
        AND (t.wake_at IS NULL OR t.wake_at > (julianday('now') - 2440587.5) * 86400.0)) AS open,
       (SELECT y.sent_by FROM leaseq_signals y
        WHERE y.task_id = t.id AND y.name = :signal AND y.sent_at >= e.response_at
        ORDER BY y.id DESC LIMIT 1) AS answered_by,
       (SELECT y.sent_at FROM leaseq_signals y
        WHERE y.task_id = t.id AND y.name = :signal AND y.sent_at >= e.response_at
        ORDER BY y.id DESC LIMIT 1) AS answered_at,
       (julianday('now') - 2440587.5) * 86400.0 AS now
FROM leaseq_tasks t
JOIN leaseq_effects e ON e.id = (SELECT max(x.id) FROM leaseq_effects x
                                 WHERE x.task_id = t.id AND x.action = :action
                                   AND x.response ->> '$.state' = 'waiting')
WHERE t.id = :task_id;

-- name: list_signals
SELECT id, task_id, name, payload, sent_by, sent_at, consumed_generation, consumed_at, consumed_key
FROM leaseq_signals WHERE task_id = :task_id ORDER BY id;

-- STREAMS (schema 28): see the PostgreSQL file.

-- name: append_stream
-- guard: lease
-- See the PostgreSQL file: one entry of the stream, after its attempt's reset entry if it is the attempt's first.
INSERT INTO leaseq_stream_items (task_id, seq, generation, type, item, ledger_key, worker_id)
SELECT t.id,
       coalesce(l.seq, 0) + CASE WHEN n.type = 'reset' OR l.generation IS t.claim_generation THEN 1 ELSE 2 END,
       t.claim_generation, n.type,
       CASE WHEN n.type = 'item' THEN :item END,
       CASE WHEN n.type = 'item' THEN :ledger_key END,
       :worker_id
FROM leaseq_tasks AS t
LEFT JOIN (SELECT s.seq, s.generation FROM leaseq_stream_items AS s
           WHERE s.task_id = :task_id ORDER BY s.seq DESC LIMIT 1) AS l ON 1
JOIN (SELECT column1 AS type FROM (VALUES ('reset'), ('item'))) AS n
  ON n.type = 'item' OR l.generation IS NOT t.claim_generation
WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */
RETURNING task_id, seq, generation, type, at, 0 AS watched;

-- name: notify_stream
-- no-op: SQLite cannot notify; a reader looks again every 50 ms

-- name: list_stream
SELECT task_id, seq, generation, type, item, ledger_key IS NOT NULL AS durable, at
FROM leaseq_stream_items
WHERE task_id = :task_id AND seq > :after
ORDER BY seq
LIMIT :limit;

-- name: stream_stats
SELECT generation, sum(CASE WHEN type = 'item' THEN 1 ELSE 0 END) AS items,
       sum(CASE WHEN type = 'item' AND ledger_key IS NOT NULL THEN 1 ELSE 0 END) AS durable,
       min(seq) AS first_seq, max(seq) AS last_seq, min(at) AS first_at, max(at) AS last_at
FROM leaseq_stream_items
WHERE task_id = :task_id
GROUP BY generation
ORDER BY generation;

-- name: streams_finished_ids
SELECT t.id FROM leaseq_tasks AS t
WHERE t.status IN ('completed', 'cancelled', 'dead', 'denied', 'expired')
  AND t.updated_at < (julianday('now') - 2440587.5) * 86400.0 - :older_than
  AND EXISTS (SELECT 1 FROM leaseq_stream_items AS s WHERE s.task_id = t.id)
ORDER BY t.id
LIMIT :limit;

-- name: prune_streams
DELETE FROM leaseq_stream_items WHERE task_id IN (SELECT value FROM json_each(:task_ids));

-- CHILD TASKS (ctx.spawn, ctx.wait_for) and cancel trees: see the PostgreSQL
-- file. SQLite's transaction holds the write lock: the locks are plain reads.

-- name: set_child_parent
UPDATE leaseq_tasks SET parent_id = :parent_task_id, has_dependents = 1,
    budget_owners = (SELECT p.budget_owners FROM leaseq_tasks AS p WHERE p.id = :parent_task_id)
WHERE id = :task_id
RETURNING *;

-- name: lock_children
SELECT c.id, c.kind, c.queue, c.status, c.result, c.last_error
FROM leaseq_tasks c
WHERE c.parent_id = :task_id AND c.id IN (SELECT value FROM json_each(:child_ids))
ORDER BY c.id;

-- name: lock_waiting_parents
SELECT p.id, p.queue, p.claim_generation, p.wait_children
FROM leaseq_tasks p
WHERE p.status = 'waiting' AND p.wait_children IS NOT NULL
  AND EXISTS (SELECT 1 FROM json_each(p.wait_children) w
              WHERE w.value IN (SELECT value FROM json_each(:task_ids)))
  AND p.id IN (SELECT c.parent_id FROM leaseq_tasks c
               WHERE c.id IN (SELECT value FROM json_each(:task_ids)) AND c.parent_id IS NOT NULL)
ORDER BY p.id;

-- name: wake_parents
UPDATE leaseq_tasks AS p
SET status = 'queued', wait_children = NULL, available_at = (julianday('now') - 2440587.5) * 86400.0,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE p.status = 'waiting' AND p.wait_children IS NOT NULL
  AND EXISTS (SELECT 1 FROM json_each(p.wait_children) w
              WHERE w.value IN (SELECT value FROM json_each(:task_ids)))
  AND p.id IN (SELECT c.parent_id FROM leaseq_tasks c
               WHERE c.id IN (SELECT value FROM json_each(:task_ids)) AND c.parent_id IS NOT NULL)
  AND NOT EXISTS (SELECT 1 FROM leaseq_tasks c
                  WHERE c.id IN (SELECT value FROM json_each(p.wait_children))
                    AND c.status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired'))
RETURNING id, queue;

-- name: lock_children_of
SELECT * FROM leaseq_tasks
WHERE parent_id IS NOT NULL AND parent_id IN (SELECT value FROM json_each(:task_ids))
ORDER BY id;

-- name: open_effects_of
SELECT e.id, e.task_id, e.action, e.effect, e.idempotency_key, e.generation
FROM leaseq_effects e
WHERE e.task_id IN (SELECT value FROM json_each(:task_ids)) AND e.status = 'pending'
ORDER BY e.task_id, e.id;

-- name: intents_of
SELECT id, parent_task_id, kind, queue, status, claim_generation FROM leaseq_tasks
WHERE parent_task_id IS NOT NULL AND parent_task_id IN (SELECT value FROM json_each(:task_ids))
ORDER BY id;

-- BUDGETS SETTLED AFTER THE CALL (schema 31): see the PostgreSQL file.

-- name: charge_attempt
-- guard: lease
INSERT INTO leaseq_limit_charges (task_id, generation, key, reserved, consumed, claimed_at)
SELECT t.id, t.claim_generation, l.key, CASE WHEN l.counts = 'units' THEN t.units ELSE 1 END, :units, t.claimed_at
FROM leaseq_tasks AS t JOIN leaseq_limits l ON l.key = :key
WHERE t.id = :task_id
  AND EXISTS (SELECT 1 FROM json_each(t.limits) k WHERE k.value = l.key)
  AND (l.per_second IS NOT NULL OR l.per_minute IS NOT NULL OR l.per_hour IS NOT NULL OR l.per_day IS NOT NULL)
  /* TEMPLATE: lease_guard */
ON CONFLICT (task_id, generation, key) DO UPDATE SET consumed = consumed + excluded.consumed
RETURNING reserved, consumed;

-- name: charge_limit
-- guard: lease
UPDATE leaseq_limits AS l
SET tokens = CASE WHEN l.per_second IS NULL THEN l.tokens
                  ELSE min(l.burst, l.tokens + ((julianday('now') - 2440587.5) * 86400.0 - l.refilled_at) * l.per_second) - :units END,
    refilled_at = CASE WHEN l.per_second IS NULL THEN l.refilled_at ELSE (julianday('now') - 2440587.5) * 86400.0 END,
    minute_used = CASE WHEN l.per_minute IS NULL THEN l.minute_used
                       WHEN l.minute_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 60 AS INTEGER) THEN l.minute_used + :units ELSE :units END,
    minute_window = CASE WHEN l.per_minute IS NULL THEN l.minute_window ELSE CAST((julianday('now') - 2440587.5) * 86400.0 / 60 AS INTEGER) END,
    hour_used = CASE WHEN l.per_hour IS NULL THEN l.hour_used
                     WHEN l.hour_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 3600 AS INTEGER) THEN l.hour_used + :units ELSE :units END,
    hour_window = CASE WHEN l.per_hour IS NULL THEN l.hour_window ELSE CAST((julianday('now') - 2440587.5) * 86400.0 / 3600 AS INTEGER) END,
    day_used = CASE WHEN l.per_day IS NULL THEN l.day_used
                    WHEN l.day_window = CAST((julianday('now') - 2440587.5) * 86400.0 / 86400 AS INTEGER) THEN l.day_used + :units ELSE :units END,
    day_window = CASE WHEN l.per_day IS NULL THEN l.day_window ELSE CAST((julianday('now') - 2440587.5) * 86400.0 / 86400 AS INTEGER) END
FROM leaseq_tasks AS t
WHERE l.key = :key AND t.id = :task_id
  /* TEMPLATE: lease_guard */
RETURNING key;

-- name: record_spend
-- guard: lease
INSERT INTO leaseq_limit_spend (key, day, tenant, units)
SELECT :key, date('now'), coalesce(t.fairness_key, ''), :units
FROM leaseq_tasks AS t
WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */
ON CONFLICT (key, day, tenant) DO UPDATE SET units = units + excluded.units
RETURNING units;

-- name: charge_task
-- guard: lease
UPDATE leaseq_tasks AS t
SET spent = json_set(coalesce(t.spent, '{}'), '$."' || :key || '"',
                     coalesce(json_extract(t.spent, '$."' || :key || '"'), 0) + :units)
WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */
RETURNING json_extract(budget, '$."' || :key || '"') AS budget_units,
          json_extract(spent, '$."' || :key || '"') AS spent_units;

-- name: budget_request
-- guard: lease
INSERT INTO leaseq_approvals (task_id, request, digest, requested_by, requested_worker, reason, detail)
SELECT t.id, 'budget', :digest, :requested_by, :worker_id, 'budget', :detail
FROM leaseq_tasks AS t
WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */
ON CONFLICT (task_id, request) DO UPDATE
SET digest = excluded.digest, requested_by = excluded.requested_by, requested_at = (julianday('now') - 2440587.5) * 86400.0,
    deadline_at = NULL, decision = NULL, decided_by = NULL, decided_via = NULL, note = NULL, decided_at = NULL,
    requested_worker = excluded.requested_worker, requested_token = NULL, reason = excluded.reason,
    detail = excluded.detail
RETURNING task_id;

-- name: set_budget
UPDATE leaseq_tasks SET budget = :budget,
                        budget_owners = json_insert(coalesce(budget_owners, '[]'), '$[#]', id)
WHERE id IN (SELECT value FROM json_each(:task_ids)) AND budget IS NULL
RETURNING id, budget;

-- name: open_budgets
INSERT INTO leaseq_budgets (owner_id, key, budget, spent)
SELECT t.id, b.key, b.value, 0
FROM leaseq_tasks AS t, json_each(t.budget) AS b
WHERE t.id IN (SELECT value FROM json_each(:task_ids)) AND t.budget IS NOT NULL
  AND t.id IN (SELECT value FROM json_each(t.budget_owners))
ON CONFLICT (owner_id, key) DO NOTHING
RETURNING owner_id;

-- name: charge_budgets
-- guard: lease
-- See the PostgreSQL file. The transaction holds SQLite's write lock: no
-- other consumer charges between the read and the write.
UPDATE leaseq_budgets SET spent = spent + :units
WHERE key = :key
  AND owner_id IN (SELECT o.value FROM leaseq_tasks AS t, json_each(t.budget_owners) AS o
                   WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */
                  )
RETURNING owner_id, key, budget AS budget_units, spent AS spent_units;

-- name: budget_spent
-- guard: lease
SELECT b.owner_id, b.key, b.budget AS budget_units, b.spent AS spent_units
FROM leaseq_tasks AS t, json_each(t.budget_owners) AS o JOIN leaseq_budgets AS b ON b.owner_id = o.value
WHERE t.id = :task_id
  /* TEMPLATE: lease_guard */
  AND b.spent > b.budget
ORDER BY b.owner_id, b.key
LIMIT 1;

-- name: raise_budget
UPDATE leaseq_tasks SET budget = :budget, updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :task_id AND status = 'awaiting_approval'
RETURNING id, budget;

-- name: raise_owner_budget
UPDATE leaseq_tasks SET budget = :budget, updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :task_id AND budget IS NOT NULL
RETURNING id, budget;

-- name: raise_budget_rows
UPDATE leaseq_budgets SET budget = json_extract(:budget, '$."' || key || '"')
WHERE owner_id = :task_id AND json_extract(:budget, '$."' || key || '"') IS NOT NULL
RETURNING owner_id, key, budget AS budget_units, spent AS spent_units;

-- name: drop_charges
-- The charges of the ended attempts of the tasks give_back_slots answered
-- (see the PostgreSQL file's give_back_slots template), deleted: each with
-- what its attempt reserved and did not consume (credit) and when it was
-- claimed. settle_charges then credits those back.
DELETE FROM leaseq_limit_charges
WHERE task_id IN (SELECT value FROM json_each(:task_ids))
  AND generation = (SELECT t.claim_generation FROM leaseq_tasks t WHERE t.id = leaseq_limit_charges.task_id)
RETURNING key, max(0, reserved - consumed) AS credit, claimed_at AS claimed;

-- name: settle_charges
-- The credits drop_charges answered, one item per charge ({"key", "credit",
-- "claimed"}), back to each limit's bucket and to each of its windows still
-- the window of the claim that reserved them.
WITH s AS (
    SELECT i.value ->> '$.key' AS key, i.value ->> '$.credit' AS credit, i.value ->> '$.claimed' AS claimed
    FROM json_each(:items) AS i
)
UPDATE leaseq_limits AS l
SET tokens = l.tokens + CASE WHEN l.per_second IS NULL THEN 0
                             ELSE coalesce((SELECT sum(s.credit) FROM s WHERE s.key = l.key), 0) END,
    minute_used = max(0, l.minute_used - coalesce((SELECT sum(s.credit) FROM s
                         WHERE s.key = l.key AND CAST(s.claimed / 60 AS INTEGER) = l.minute_window), 0)),
    hour_used = max(0, l.hour_used - coalesce((SELECT sum(s.credit) FROM s
                       WHERE s.key = l.key AND CAST(s.claimed / 3600 AS INTEGER) = l.hour_window), 0)),
    day_used = max(0, l.day_used - coalesce((SELECT sum(s.credit) FROM s
                     WHERE s.key = l.key AND CAST(s.claimed / 86400 AS INTEGER) = l.day_window), 0))
WHERE l.key IN (SELECT key FROM s)
RETURNING key;

-- name: limit_spend
-- See the PostgreSQL file; the split by tenant is a JSON text.
SELECT key, day, sum(units) AS units, json_group_object(tenant, units) AS tenants
FROM leaseq_limit_spend
WHERE (:key IS NULL OR key = :key)
  AND day > date('now', '-' || :days || ' days')
GROUP BY key, day
ORDER BY day DESC, key;

-- name: limit_spend_top
-- See the PostgreSQL file: the same rows, by a window over each day's tenants
-- (no LATERAL here; text compares in byte order).
WITH ranked AS (
    SELECT key, day, tenant, units,
           row_number() OVER (PARTITION BY key, day ORDER BY tenant = :other, units DESC, tenant) AS rank
    FROM leaseq_limit_spend
    WHERE day > date('now', '-' || :days || ' days')
)
SELECT key, day, CASE WHEN rank <= :top THEN tenant ELSE :other END AS tenant,
       sum(units) AS units, max(rank > :top OR tenant = :other) AS rest
FROM ranked
GROUP BY 1, 2, 3
ORDER BY 2 DESC, 1, 5, 4 DESC, 3;
