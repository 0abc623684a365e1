"""The queue service of a chaos run with remote workers: a real ``leaseq serve`` process.

Remote workers reach the queue only through it (the HTTP transport, with a
worker token each, created as an operator would with ``leaseq tokens
create``). The ``service`` fault SIGKILLs the process and starts it again on
the same port after a pause, so a remote worker sees connection refusals,
then the same URL answering again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

from .pgserver import free_port


class ServiceProcess:
    """Runs ``python -m leaseq.cli.main serve`` on a fixed loopback port; kill and restart it at will."""

    def __init__(self, dsn: str, *, env: dict[str, str], log_dir: Path, record: Callable[..., None]):
        self.dsn = dsn
        self.env = env
        self.log_dir = log_dir
        self.record = record
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.down_on_purpose = False  # killed by the service fault, which starts it again itself
        self.lock = threading.Lock()
        self.start_lock = threading.RLock()

    def start(self, *, wait: float = 60.0) -> None:
        """Start the service and wait until it answers HTTP."""
        with self.start_lock:  # one start at a time: the fault's and the harness's never race for the port
            self._start(wait)

    def _start(self, wait: float) -> None:
        with self.lock:
            self.down_on_purpose = False
            self.starts += 1
            log = open(self.log_dir / f"service.{self.starts}.log", "w")
            # Rate limits off in practice: the workers are trusted and the run measures faults, not limits.
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "leaseq.cli.main", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                 "--rate", "100000", "--burst", "100000", "--log-level", "warning"],
                env=dict(self.env, LEASEQ_DSN=self.dsn), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
            log.close()
            self.record("service_start", "ok", pid=self.proc.pid, port=self.port, start=self.starts)
        self.wait_ready(wait)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the service answers HTTP at all (``/healthz`` may say 503 while the database is
        being faulted: the service is up, and that is the fault's business); raise if it died or never
        answered."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"leaseq serve exited (see {self.log_dir}/service.{self.starts}.log)")
            try:
                httpx.get(f"{self.url}/healthz", timeout=2)
                return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"leaseq serve did not answer within {timeout:g}s")
            time.sleep(0.1)

    def kill(self) -> bool:
        """SIGKILL the service (no graceful shutdown); False if it was not running."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                return False
            self.down_on_purpose = True
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            return True

    def ensure_running(self, *, even_if_killed: bool = True) -> None:
        """Start the service again if it is down (a crash, or with ``even_if_killed`` a fault's kill)."""
        with self.start_lock:
            down = self.proc is None or self.proc.poll() is not None
            if down and (even_if_killed or not self.down_on_purpose):
                self._start(60.0)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a few seconds."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                return
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
