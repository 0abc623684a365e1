-- leaseq schema, version 32, PostgreSQL: code versions (App(version=...)).
--
--   leaseq_tasks.code_version            the version of the code the task
--                                        started under: the first claim sets
--                                        it to the claiming worker's version
--                                        and later claims keep it; NULL until
--                                        then, or when that worker declared
--                                        none
--   leaseq_workers.code_version          the version a worker runs (NULL:
--                                        none declared)
--   leaseq_workers.compatible_versions   the versions whose started tasks it
--                                        serves (its own among them); NULL:
--                                        any (a worker without a version)
--
-- A claim passes over a started task whose code_version its worker does not
-- serve: the ledger that task recorded was written by code this worker's may
-- no longer replay. A task not yet started is claimable by every worker.
ALTER TABLE leaseq_tasks ADD COLUMN code_version text;
ALTER TABLE leaseq_workers ADD COLUMN code_version text, ADD COLUMN compatible_versions text[];
