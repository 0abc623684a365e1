-- leaseq schema, version 7, SQLite: the statuses of tasks that wait, and of
-- tasks that end without running.
--
--   waiting            not claimable until the tasks it depends on complete
--   awaiting_approval  not claimable until an operator approves it
--   denied             an operator denied it (terminal)
--   expired            its deadline passed before it started (terminal)
--
-- SQLite cannot alter a CHECK constraint, and rebuilding leaseq_tasks would
-- cascade-delete its events and effects (foreign keys are on). Widening a
-- CHECK changes nothing stored, so the table's recorded definition is edited
-- in place: SQLite documents this use of writable_schema for loosening
-- constraints. The migration runner raises the schema cookie before
-- writable_schema is switched off, so every open connection reloads the
-- schema (see SqliteTx.script).

PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql,
                     '''needs_reconciliation'', ''blocked'')',
                     '''needs_reconciliation'', ''blocked'', ''waiting'', ''awaiting_approval'', ''denied'', ''expired'')')
 WHERE type = 'table' AND name = 'leaseq_tasks';
PRAGMA writable_schema = OFF;
