"""Database backends. Each runs the named queries of its ``sql/<dialect>/`` folder.

The contract between the lease logic (:mod:`leaseq.queue`) and a backend is
small: open a transaction, run a named query with named parameters, get dict
rows back with times as aware datetimes and JSON columns decoded. Which SQL a
name stands for is the backend's business; what the names mean is the same
on every backend (``tests/conformance`` runs one suite against all of them).
"""

from .base import Store, Tx, open_store, parse_dsn

__all__ = ["Store", "Tx", "open_store", "parse_dsn"]
