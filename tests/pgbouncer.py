"""A private PgBouncer in transaction mode in front of the test server, started and stopped by a test.

Debian's ``pgbouncer`` package (``.ci/run`` installs it); a test that needs it
calls :func:`require_tool` through the ``pgbouncer`` fixture, so a machine
without it skips naming it (CI fails instead).

Each :class:`PgBouncer` listens on a free port of 127.0.0.1 and serves one
database name, ``leaseq``, whose server connections go to the test server's
database with ``search_path`` set to a test's schema (PgBouncer 1.18 passes
no ``options`` startup parameter through: ``connect_query`` sets it, once per
server connection). Logins are trusted, for the users listed in its
``auth_file``; the pool is per user, as PgBouncer pools are.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """One ``pgbouncer`` process in transaction mode (``pool_size`` server connections per user)."""

    DATABASE = "leaseq"

    def __init__(self, binary: str, server_dsn: str, schema: str, *, pool_size: int = 4,
                 users: tuple[str, ...] = ("postgres",)):
        server = urlsplit(server_dsn)
        self.port = free_port()
        # PgBouncer refuses to run as root: run as root, it is told to become nobody, who must
        # reach its files (a test's tmp_path is private to its owner)
        self.folder = folder = Path(tempfile.mkdtemp(prefix="leaseq-pgbouncer-"))
        as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
        if as_user:
            folder.chmod(0o777)
        self.log = folder / "pgbouncer.log"
        (folder / "users.txt").write_text("".join(f'"{u}" ""\n' for u in users))
        target = (f"host={server.hostname or '127.0.0.1'} port={server.port or 5432} "
                  f"dbname={server.path.lstrip('/')} connect_query='SET search_path = {schema}'")
        (folder / "pgbouncer.ini").write_text(f"""[databases]
{self.DATABASE} = {target}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {folder / 'users.txt'}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 500
server_check_delay = 0
logfile = {self.log}
pidfile = {folder / 'pgbouncer.pid'}
""")
        self.process = subprocess.Popen([binary, *as_user, str(folder / "pgbouncer.ini")], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT)
        self._wait_ready()

    def dsn(self, user: str = "postgres", password: str | None = None) -> str:
        """A DSN reaching the schema through this PgBouncer (no leaseq option: add one)."""
        secret = f":{password}" if password else ""
        return f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{self.DATABASE}"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.process.returncode}): {self._log_tail()}")
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer not serving after 10 s: {self._log_tail()}") from None
                time.sleep(0.02)

    def _log_tail(self) -> str:
        try:
            return self.log.read_text()[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the process (its clients' connections end with it)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover - pgbouncer ends on SIGTERM
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
