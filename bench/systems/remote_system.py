"""leaseq's remote workers: the same runtime, reaching the queue through ``leaseq serve`` over HTTP.

The orchestrator side is :class:`~bench.systems.leaseq_system.LeaseqSystem`'s
(tasks are enqueued and counted in the database directly, as an
application with database access would). :meth:`install` also creates a
worker token and starts one ``leaseq serve`` process on that database; the
worker processes find its address and the token in their environment
(``LEASEQ_BENCH_SERVER``, ``LEASEQ_BENCH_TOKEN``). :meth:`close` stops it and
takes the two variables out of the environment again: a direct worker
started later in the same run (``leaseq``'s runner goes remote when they are
set) must not go to a service that is gone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import leaseq
from leaseq import auth
from leaseq.client import RemoteQueue
from leaseq.worker import WorkerRuntime

from . import Control
from .leaseq_system import SERVER_ENV, TOKEN_ENV, LeaseqSystem


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
            token, _ = auth.create_token(q, name="bench-remote", role="worker", created_by="bench")
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

    async def open_worker(self, dsn: str, control: Control) -> RemoteRunner:
        return RemoteRunner(os.environ[SERVER_ENV], os.environ[TOKEN_ENV], control)


class RemoteRunner:
    """An App with one no-op handler and a WorkerRuntime over a RemoteQueue, as
    ``leaseq worker --server`` runs it."""

    def __init__(self, url: str, token: str, control: Control):
        self.control = control
        self.rq = RemoteQueue(url, token)
        self.app = leaseq.App(name="bench-remote")  # never connects: the worker goes through the service
        mode = control.options.mode

        @self.app.task("noop")
        async def noop(ctx: Any, i: int = 0) -> None:
            control.handler_started(i)
            if mode == "hold":
                await control.stop.wait()
            control.handler_done()

        self.runtime = WorkerRuntime(self.app, self.rq, concurrency=control.options.concurrency, grace=0.5)
        control.on_stop.append(self.runtime.stop)

    async def run(self) -> None:
        await self.runtime.run(until_idle=self.control.options.mode == "drain")

    async def close(self) -> None:
        self.rq.close()
