-- leaseq schema, version 28, PostgreSQL: task progress streams.
--
-- A handler's ctx.emit(item) appends one entry to its task's stream, under
-- the lease (the lease guard, after lock_lease has locked the task row, so
-- the appends of one task are written one after the other and their seq
-- order is their commit order: a reader that resumes after a seq misses
-- nothing). Each attempt (claim generation) that appends anything begins
-- with a 'reset' entry of its generation, written in the same transaction
-- as its first item: a reader never mixes two attempts without being told.
--
--   seq         the entry's place in the task's stream, 1, 2, ...: the
--               cursor a reader resumes after (SSE's event id)
--   generation  the attempt that wrote it
--   type        'reset' (an attempt begins) or 'item'
--   item        the JSON item (NULL for a reset); user data, deleted at the
--               payload cut-off and by the streams' own retention
--   ledger_key  a durable item's key in the action ledger (NULL: not durable):
--               a retried attempt replays it from there, and appends nothing
--   worker_id   the holder that wrote it
CREATE TABLE leaseq_stream_items (
    task_id    bigint NOT NULL REFERENCES leaseq_tasks (id) ON DELETE CASCADE,
    seq        bigint NOT NULL,
    generation bigint NOT NULL,
    type       text NOT NULL CHECK (type IN ('reset', 'item')),
    item       jsonb,
    ledger_key text,
    worker_id  text,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (task_id, seq)
);
