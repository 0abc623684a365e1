"""Tests of the database layer (leaseq.db) under the queue and the fencing kit."""
