"""A private PgBouncer in transaction mode in front of one schema of the test server.

The process is :class:`leaseq_chaos.pgbouncer.PgBouncer` (Debian's
``pgbouncer``; ``.ci/run`` installs it, and a test that needs it finds it
through :func:`system_tools.require_tool`). It serves one database name,
``leaseq``, whose server connections go to the test server's database with
``search_path`` set to the test's schema: PgBouncer 1.18 passes no
``options`` startup parameter through, so ``connect_query`` sets it, once per
server connection. A role made during the test (``leaseq roles create``) logs
in through it too: users it does not list are looked up as ``postgres``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from leaseq_chaos.pgbouncer import PgBouncer

DATABASE = "leaseq"


class SchemaBouncer(PgBouncer):
    """A PgBouncer whose database ``leaseq`` is ``schema`` on the server of ``server_dsn``."""

    def __init__(self, binary: str, server_dsn: str, schema: str, *, pool_size: int = 4,
                 users: tuple[str, ...] = ("postgres",)):
        server = urlsplit(server_dsn)
        target = (f"host={server.hostname or '127.0.0.1'} port={server.port or 5432} "
                  f"dbname={server.path.lstrip('/')} connect_query='SET search_path = {schema}'")
        super().__init__({DATABASE: target}, binary=binary, pool_size=pool_size, users=users,
                         auth_user="postgres")
        try:
            self.wait_ready(DATABASE)
        except BaseException:
            self.stop()
            raise

    def dsn(self, database: str = DATABASE, user: str = "postgres", password: str | None = None) -> str:
        """A DSN reaching the schema (no leaseq option: the test adds ``?pooler=transaction``)."""
        return super().dsn(database, user, password)
