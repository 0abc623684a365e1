"""A throwaway PostgreSQL server the chaos harness owns, so it may restart it.

Restarting a shared server would break everyone else's connections, so the
harness never touches one: it runs ``initdb`` into a temporary folder and
starts a private server on a free loopback port (trust authentication,
127.0.0.1 only, small buffers, no fsync: the data is thrown away, and only
a machine crash, never a server restart, could lose a committed write). When
the harness runs as root, ``initdb`` and the server run as the ``postgres``
operating-system user, since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from leaseq.core.errors import ConfigError


def find_bindir(explicit: str | None = None) -> str | None:
    """The folder holding ``initdb`` and ``pg_ctl``: ``explicit``, ``$PATH``, or the newest Debian install."""
    if explicit:
        return explicit if os.path.exists(os.path.join(explicit, "pg_ctl")) else None
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        # the folder the binaries are in, not a folder of links to some of them
        return os.path.dirname(os.path.realpath(on_path))
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(found[-1]) if found else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThrowawayPostgres:
    """A private PostgreSQL server in a temporary folder: start, restart, terminate backends, remove."""

    def __init__(self, *, bindir: str | None = None, port: int | None = None, max_connections: int = 250):
        found = find_bindir(bindir)
        if found is None:
            raise ConfigError("pg_bin: no PostgreSQL server binaries (initdb, pg_ctl) found; install the "
                              "PostgreSQL server package or pass its bin folder")
        self.bindir = found
        self.port = port or free_port()
        self.max_connections = max_connections
        self.root: Path | None = None
        self.restarts = 0
        self._as_postgres = os.geteuid() == 0

    # -- life cycle --------------------------------------------------------

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [os.path.join(self.bindir, args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise ConfigError(f"pg_bin: {args[0]} failed ({proc.returncode}): "
                              f"{(proc.stderr or proc.stdout).strip()[-500:]}")
        return proc

    @property
    def data(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    def start(self) -> ThrowawayPostgres:
        """Start the server, first creating it (:meth:`create`) unless that was done; returns self."""
        if self.root is None:
            self.create()
        try:
            self._pg_ctl("start")
        except BaseException:
            # pg_ctl gave up waiting (a loaded machine) but the server may still come up: no one
            # would stop it (``with`` calls no __exit__ when __enter__ raises)
            self.stop()
            raise
        return self

    def create(self) -> ThrowawayPostgres:
        """initdb into a new temporary folder, without starting the server; returns self.
        (A test may start a client first, then the server with :meth:`start`.)"""
        self.root = Path(tempfile.mkdtemp(prefix="leaseq-chaos-pg-"))
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n# leaseq chaos: private, throwaway, loopback only\n"
                       f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                       f"unix_socket_directories = '{self.root}'\n"
                       f"max_connections = {self.max_connections}\nshared_buffers = 16MB\n"
                       # No fsync: only the operating system could lose what the server wrote, and
                       # it does not crash here. synchronous_commit stays on: with it off, an
                       # immediate restart loses commits the clients were already told about
                       # (the checker does flag that, as lost tasks and double completions).
                       "fsync = off\nfull_page_writes = off\n")
        return self

    def standby(self, *, synchronous: bool = False) -> ThrowawayPostgres:
        """A streaming standby of this (running) server, started: ``pg_basebackup -R`` into a new folder.

        ``synchronous``: this server then waits, at every commit, for the
        standby to have flushed the commit's WAL (``synchronous_standby_names``,
        reloaded), so nothing acknowledged is missing on it.
        """
        import psycopg

        standby = ThrowawayPostgres(bindir=self.bindir, max_connections=self.max_connections)
        standby.root = Path(tempfile.mkdtemp(prefix="leaseq-chaos-pg-"))
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(standby.root, pw.pw_uid, pw.pw_gid)
        name = f"standby_{standby.port}"
        try:
            self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-D",
                      str(standby.data), "-R", "-X", "stream", "--no-sync", "-c", "fast",
                      "-d", f"application_name={name}")
        except BaseException:
            standby.stop()
            raise
        with open(standby.data / "postgresql.conf", "a") as conf:
            conf.write(f"\n# leaseq chaos: a streaming standby of port {self.port}\nport = {standby.port}\n"
                       f"unix_socket_directories = '{standby.root}'\nsynchronous_standby_names = ''\n")
        standby._pg_ctl("start")
        if synchronous:
            with psycopg.connect(self.dsn(), autocommit=True) as conn:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
                conn.execute("SELECT pg_reload_conf()")
        return standby

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend at once: the server dies as a crashed machine's
        would, and no backend commits another transaction or answers another statement."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    children.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
        # The postmaster first, then every backend at once: none commits another transaction.
        os.kill(pid, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)

    def promote(self) -> None:
        """Promote this standby to a primary (``pg_ctl promote``, waiting until it accepts writes)."""
        self._pg_ctl("promote")

    def _pg_ctl(self, action: str, *extra: str) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                  action, *extra)

    def restart(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: roll back and disconnect; ``immediate``: crash) and start it again."""
        if mode not in ("fast", "immediate"):
            raise ValueError(f"mode must be fast or immediate, not {mode!r}")
        self._pg_ctl("stop", "-m", mode)
        self._pg_ctl("start")
        self.restarts += 1

    def stop(self) -> None:
        """Stop the server and delete its folder. Safe to call twice."""
        if self.root is None:
            return
        try:
            if (self.data / "postmaster.pid").exists():
                self._pg_ctl("stop", "-m", "immediate")
        except (ConfigError, subprocess.TimeoutExpired):
            # pg_ctl could not stop it in time: a postmaster left behind, its folder deleted below,
            # would run on with no parent; end it and its backends as a crash would
            with contextlib.suppress(OSError, ValueError, IndexError):
                self.kill()
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def __enter__(self) -> ThrowawayPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- use ----------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", *, port: int | None = None, application_name: str | None = None) -> str:
        """A DSN for ``dbname`` on this server (or on a proxy at ``port`` in front of it)."""
        dsn = f"postgresql://postgres@127.0.0.1:{port or self.port}/{dbname}"
        return dsn + (f"?application_name={application_name}" if application_name else "")

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its DSN."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def terminate_backends(self, application_name_prefix: str, *, database: str | None = None,
                           sparing: str | None = None) -> int:
        """``pg_terminate_backend`` every backend of this server whose application_name starts with the
        prefix (only those connected to ``database`` when given; never those whose name starts with
        ``sparing``). Returns how many were terminated."""
        import psycopg

        def like(prefix: str) -> str:
            return prefix.replace("%", r"\%").replace("_", r"\_") + "%"

        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE %(prefix)s AND pid <> pg_backend_pid() "
                "AND (%(db)s::text IS NULL OR datname = %(db)s) "
                "AND (%(spare)s::text IS NULL OR application_name NOT LIKE %(spare)s)",
                {"prefix": like(application_name_prefix), "db": database,
                 "spare": like(sparing) if sparing else None}).fetchall()
        return sum(1 for (ok,) in rows if ok)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the server accepts connections."""
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
