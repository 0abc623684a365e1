-- leaseq schema, version 10, PostgreSQL: the caller's trace context, carried in the task.
--
-- trace_context is the W3C traceparent of the span that enqueued the task
-- ("00-<trace id>-<span id>-<flags>"), or NULL when the caller was not
-- tracing. The worker starts the task's spans under it, so they join the
-- caller's trace. Adding a nullable column without a default rewrites
-- nothing: old rows read NULL.

ALTER TABLE leaseq_tasks ADD COLUMN trace_context text;
