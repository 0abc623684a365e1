"""A private PgBouncer in transaction mode, started and stopped by its owner (a chaos run, a test).

Debian's ``pgbouncer`` package. It listens on a free port of 127.0.0.1 and
serves the databases it is given (``name -> libpq settings``: host, port,
dbname, connect_query...), with ``pool_size`` server connections per
database and user (PgBouncer pools per user: a login role has a pool of its
own). Logins are trusted, for the users listed in its ``auth_file`` (and, with
``auth_user``, for any role the server knows: looked up as that user, so a role
made while it runs logs in through it); the server behind it decides (the test
server trusts 127.0.0.1).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from leaseq.core.errors import ConfigError

from .pgserver import free_port

#: Where Debian installs it (``/usr/sbin`` may be missing from a user's ``$PATH``).
DEBIAN_PATH = "/usr/sbin/pgbouncer"


def find_pgbouncer() -> str | None:
    """The path of ``pgbouncer``: ``$PATH``, else Debian's; None when it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return DEBIAN_PATH if os.access(DEBIAN_PATH, os.X_OK) else None


class PgBouncer:
    """One ``pgbouncer`` process in transaction mode; :meth:`stop` ends it and removes its files."""

    def __init__(self, databases: dict[str, str], *, binary: str | None = None, pool_size: int = 4,
                 users: tuple[str, ...] = ("postgres",), max_client_conn: int = 500,
                 auth_user: str | None = None):
        binary = binary or find_pgbouncer()
        if binary is None:
            raise ConfigError("pooler: pgbouncer is not installed (install Debian's pgbouncer package)")
        self.port = free_port()
        # PgBouncer refuses to run as root: run as root, it is told to become nobody, who must
        # reach its files (a test's tmp_path is private to its owner)
        self.folder = folder = Path(tempfile.mkdtemp(prefix="leaseq-pgbouncer-"))
        as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
        if as_user:
            folder.chmod(0o777)
        self.log = folder / "pgbouncer.log"
        (folder / "users.txt").write_text("".join(f'"{u}" ""\n' for u in users))
        entries = "\n".join(f"{name} = {target}" for name, target in databases.items())
        # a user missing from the auth_file is looked up in pg_shadow (trusted all the same)
        lookup = ("" if auth_user is None else f"auth_user = {auth_user}\n"
                  "auth_query = SELECT usename, passwd FROM pg_catalog.pg_shadow WHERE usename = $1\n")
        (folder / "pgbouncer.ini").write_text(f"""[databases]
{entries}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {folder / 'users.txt'}
{lookup}pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = {max_client_conn}
server_check_delay = 0
logfile = {self.log}
pidfile = {folder / 'pgbouncer.pid'}
""")
        self.process = subprocess.Popen([binary, *as_user, str(folder / "pgbouncer.ini")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def dsn(self, database: str, user: str = "postgres", password: str | None = None) -> str:
        """A DSN of ``database`` through this PgBouncer (no leaseq option: the caller adds one)."""
        secret = f":{password}" if password else ""
        return f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{database}"

    def wait_ready(self, database: str, timeout: float = 10.0) -> PgBouncer:
        """Return once a client gets through to ``database``; returns self."""
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.process.returncode}): {self.log_tail()}")
            try:
                psycopg.connect(self.dsn(database), connect_timeout=2).close()
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer not serving after {timeout:g} s: {self.log_tail()}") from None
                time.sleep(0.02)

    def log_tail(self) -> str:
        """The end of its log, for error messages."""
        try:
            return self.log.read_text()[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the process (its clients' connections end with it) and remove its files. Safe twice."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover - pgbouncer ends on SIGTERM
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
