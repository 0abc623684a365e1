-- leaseq schema, version 21, PostgreSQL: the intent/executor split.
-- A token may record an intent that runs without a person's approval on a queue
-- it may itself claim from only when it was created with own_intents (an explicit,
-- loudly named opt-in: otherwise an agent's proposals would be executed by the
-- agent's own workers, with no one between the proposal and the action).
-- Existing tokens keep the refusal: the default is false.

ALTER TABLE leaseq_tokens ADD COLUMN own_intents boolean NOT NULL DEFAULT false;
