"""leaseq's remote workers: the same runtime, reaching the queue through ``leaseq serve`` over HTTP.

The orchestrator side is :class:`~bench.systems.leaseq_system.LeaseqSystem`'s
(tasks are enqueued and counted in the database directly, as an
application with database access would). :meth:`install` also creates a
worker token and starts one ``leaseq serve`` process on that database; the
worker processes find its address and the token in their environment
(``LEASEQ_BENCH_SERVER``, ``LEASEQ_BENCH_TOKEN``), where leaseq's own runner
(:class:`~bench.systems.leaseq_system.LeaseqRunner`) picks them up and goes
through the service with the same handler and options as a direct worker
(prefetch, tool calls). :meth:`close` stops it and
takes the two variables out of the environment again: a direct worker
started later in the same run (``leaseq``'s runner goes remote when they are
set) must not go to a service that is gone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from leaseq import access

from . import Control
from .leaseq_system import SERVER_ENV, TOKEN_ENV, LeaseqRunner, LeaseqSystem


class RemoteSystem(LeaseqSystem):
    """leaseq workers over HTTP, through one service process."""

    def __init__(self, processes: int = 1) -> None:
        super().__init__("leaseq")
        self.processes = processes
        self.name = "leaseq-remote" if processes == 1 else f"leaseq-remote-{processes}p"
        self.label = "leaseq remote (HTTP)" if processes == 1 else f"leaseq remote (HTTP, {processes} service processes)"
        self._service: subprocess.Popen | None = None

    def install(self, dsn: str) -> None:
        super().install(dsn)
        self.close_service()
        with self._queue(dsn) as q:
            token, _ = access.create_token(q, name="bench-remote", role="worker", created_by="bench", all_queues=True)
        self._service = subprocess.Popen(
            [sys.executable, "-m", "leaseq.cli", "--dsn", dsn, "serve", "--host", "127.0.0.1", "--port", "0",
             "--rate", "0", "--log-level", "warning", "--processes", str(self.processes)],
            stderr=subprocess.PIPE, text=True)
        line = self._service.stderr.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if m is None:
            self.close_service()
            raise RuntimeError(f"the service did not start: {line}")
        os.environ[SERVER_ENV], os.environ[TOKEN_ENV] = m.group(1), token

    def close_service(self) -> None:
        os.environ.pop(SERVER_ENV, None)
        os.environ.pop(TOKEN_ENV, None)
        proc, self._service = self._service, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stderr.close()

    def close(self) -> None:
        super().close()
        self.close_service()

    async def open_worker(self, dsn: str, control: Control) -> LeaseqRunner:
        # leaseq's own runner: with the service's address in the environment it goes
        # through the service, with the same handler and options (prefetch, tool calls).
        return LeaseqRunner(dsn, self.options, control)
