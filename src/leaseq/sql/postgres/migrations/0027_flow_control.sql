-- leaseq schema, version 27, PostgreSQL: singletons and debounce.
-- singleton_key: at most one unfinished task per (queue, key) is enqueued
-- (enqueue(..., singleton_key=..., on_conflict=...)); with on_conflict="queue"
-- one more waits queued behind a running one, and the claim takes a
-- singleton task only when no other task with its key is running and no
-- older one is queued. debounce_key: enqueues with the key inside the
-- window collapse into one task (enqueue(..., debounce=..., key=...)).
-- leaseq_flow_keys: one row per (scope, queue, key) an enqueue has named,
-- which every singleton or debounced enqueue of that key locks (an upsert)
-- before it reads the key's tasks: enqueues of one key run one after the
-- other, on servers without advisory locks too (the portable mode).

ALTER TABLE leaseq_tasks ADD COLUMN singleton_key text, ADD COLUMN debounce_key text;

CREATE INDEX leaseq_tasks_singleton ON leaseq_tasks (queue, singleton_key, id)
    WHERE singleton_key IS NOT NULL AND status NOT IN ('completed', 'cancelled', 'dead', 'denied', 'expired');
CREATE INDEX leaseq_tasks_debounce ON leaseq_tasks (queue, debounce_key, id) WHERE debounce_key IS NOT NULL;

CREATE TABLE leaseq_flow_keys (
    scope     text NOT NULL CHECK (scope IN ('singleton', 'debounce')),
    queue     text NOT NULL,
    key       text NOT NULL,
    locked_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, queue, key)
);
