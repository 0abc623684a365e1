"""The database layer under the queue's store and the fencing kit.

Both talk to the same two databases the same way, so the connection code
lives here once:

* :mod:`.dsn`: which database a DSN names (``parse_dsn``) and the checks a
  PostgreSQL DSN passes before a pool is opened;
* :mod:`.errors`: the one mapping from driver errors to leaseq errors
  (a database that cannot be reached is :class:`leaseq.BackendUnavailable`);
* :mod:`.postgres`: psycopg pools whose connections are checked at checkout,
  sync and asyncio;
* :mod:`.sqlite`: per-thread SQLite connections to a file created owner-only,
  and the ``BEGIN IMMEDIATE`` transaction whose rollback never hides the
  error that caused it.

What is particular to a user (the named queries, how rows are decoded) stays
with the user: :mod:`leaseq.store` and :mod:`leaseq.fencing.backends`.
"""

from .dsn import DEFAULT_DSN, parse_dsn
from .errors import map_driver_errors, unavailable

__all__ = ["DEFAULT_DSN", "map_driver_errors", "parse_dsn", "unavailable"]
