"""The I/O-free heart of leaseq: states, records, errors and the retry maths."""
