-- leaseq schema, version 24, PostgreSQL: autovacuum and fill factor for the
-- tables every claim, renewal and completion changes, so that a queue under
-- steady load stays the same size.
--
-- leaseq_tasks: every change of a task sets updated_at, which indexes read
-- (leaseq_tasks_ended, leaseq_tasks_finished), and a claim or a renewal moves
-- lease_expires_at (leaseq_tasks_leases): no update of a task is HOT, so free
-- room in its pages would stay empty and no fill factor is set. What keeps it
-- flat is vacuuming soon: after 2 % of its rows changed rather than
-- PostgreSQL's 20 % (a table of a million tasks waits for 200,000 dead rows
-- otherwise), without the cost delay that lets a busy table outrun its vacuum.
ALTER TABLE leaseq_tasks SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                              autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02,
                              autovacuum_vacuum_cost_delay = 0);
-- leaseq_events: written once and deleted by retention in batches; vacuumed
-- after inserts too, so its visibility map lets index-only scans skip the heap.
ALTER TABLE leaseq_events SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_insert_scale_factor = 0.05,
                               autovacuum_analyze_scale_factor = 0.05);
ALTER TABLE leaseq_effects SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.05);
-- Small tables whose few rows are updated at every heartbeat or claim, in
-- columns no index reads: a worker's last_heartbeat_at, a limit's running
-- count and tokens, the maintenance leader's lease. Room in each page lets
-- the update be HOT (the new row version on the same page, no index entry),
-- and a low threshold vacuums them before their dead versions spill over.
ALTER TABLE leaseq_workers SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.05,
                                autovacuum_vacuum_threshold = 200);
ALTER TABLE leaseq_limits SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.05,
                               autovacuum_vacuum_threshold = 200);
ALTER TABLE leaseq_leader SET (fillfactor = 50);
