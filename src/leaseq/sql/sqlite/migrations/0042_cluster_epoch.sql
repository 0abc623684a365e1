-- leaseq schema, version 42, SQLite: nothing to change. PostgreSQL reads the
-- cluster part of a claim's lease epoch once per server session
-- (leaseq_cluster_epoch, see its file); SQLite's claims keep epoch 0.
SELECT 1;
