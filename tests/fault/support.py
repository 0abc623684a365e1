"""Helpers for the infrastructure-fault tests: a worker runtime in a thread, handlers
held at a gate, dropped PostgreSQL connections, and a `leaseq serve` subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import leaseq
from leaseq.worker import WorkerRuntime
from leaseq.worker.transport import worker_port

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what} not met within {timeout}s")


class Gate:
    """Handlers that report they started, then wait until the test opens the gate."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.returned: list[int] = []
        self.open = threading.Event()
        self._lock = threading.Lock()

    def hold(self, ctx: leaseq.TaskContext) -> dict:
        with self._lock:
            self.started.append(ctx.task_id)
        assert self.open.wait(60), "the gate never opened"
        with self._lock:
            self.returned.append(ctx.task_id)
        return {"task": ctx.task_id, "generation": ctx.generation}


class GatedCompletions:
    """A real queue whose batched completions wait at a gate before they are sent,
    so a fault can be made to land exactly on the completion."""

    def __init__(self, queue: leaseq.Queue):
        self._queue = worker_port(queue)
        self.gate = threading.Event()
        self.held = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    async def complete_many(self, worker: Any, done: Any) -> set[int]:
        self.held.set()
        await asyncio.to_thread(self.gate.wait, 60)
        return await self._queue.complete_many(worker, done)


class Runner:
    """A WorkerRuntime on its own thread and event loop; ``stop()`` re-raises what run() raised."""

    def __init__(self, runtime: WorkerRuntime, *, wait_registered: bool = True):
        self.runtime = runtime
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        if not wait_registered:
            return
        wait_for(lambda: runtime.worker is not None or not self.thread.is_alive(), 15, "the worker registered")
        assert runtime.worker is not None, f"worker did not start: {self.error!r}"

    def _main(self) -> None:
        try:
            asyncio.run(self.runtime.run())
        except BaseException as exc:
            self.error = exc

    def stop(self, timeout: float = 30) -> None:
        self.runtime.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker did not stop"
        if self.error is not None:
            raise self.error


def first_attempt_completed(q: leaseq.Queue, task_ids: list[int]) -> None:
    """Every task is completed by its first attempt, with no failure or loss on record."""
    for task_id in task_ids:
        task = q.get(task_id)
        assert (task.status, task.attempts, task.claim_generation) == ("completed", 1, 1), task
        assert task.last_error is None, task.last_error
        types = [e.type for e in q.events(task_id)]
        assert "failed" not in types and "lease_lost" not in types and "lease_expired" not in types, types


def backends(admin_dsn: str, application_name: str) -> list[int]:
    """Pids of the server backends whose application_name is ``application_name``."""
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        return [pid for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND pid <> pg_backend_pid()",
            (application_name,)).fetchall()]


def drop_connections(admin_dsn: str, application_name: str) -> int:
    """``pg_terminate_backend`` every backend named ``application_name`` (from a separate
    admin connection); returns how many, once they are gone."""
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        pids = [pid for (pid, ok) in conn.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()", (application_name,)).fetchall() if ok]
        wait_for(lambda: not conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)",
                                          (pids,)).fetchall(), 10, "the terminated backends exited")
    return len(pids)


class Service:
    """`leaseq serve` in a subprocess on a fixed port, killed and restarted at will."""

    def __init__(self, dsn: str, port: int, log: Path, extra_args: tuple[str, ...] = ()):
        self.dsn = dsn
        self.port = port
        self.extra_args = tuple(extra_args)
        self.url = f"http://127.0.0.1:{port}"
        self._log = log
        self.proc: subprocess.Popen | None = None

    def _text(self) -> str:
        return self._log.read_text() if self._log.exists() else ""

    def start(self) -> Service:
        """Start the service and wait until it listens."""
        before = self._text().count("listening on")
        env = dict(os.environ, LEASEQ_DSN=self.dsn)
        with open(self._log, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "leaseq.cli", "serve", "--port", str(self.port), "--log-level", "warning",
                 "--rate", "10000", "--burst", "10000", *self.extra_args],
                cwd=ROOT, env=env, stdout=log, stderr=log)
        wait_for(lambda: self._text().count("listening on") > before or self.proc.poll() is not None, 30,
                 "the service started")
        assert self.proc.poll() is None, self._text()[-2000:]
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class AppWorkers:
    """Worker processes of one test app (``python -m tests.fault.<module>``), each logging to
    ``<fault_dir>/<name>.log``; the app reads ``LEASEQ_DSN`` and ``FAULT_DIR`` and may write
    ``<name>-<task>.log`` lines (counted by :meth:`count`). :meth:`close` kills what is left."""

    def __init__(self, module: str, dsn: str, fault_dir: Path):
        self.module, self.dsn, self.fault_dir = module, dsn, fault_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, **env: str) -> subprocess.Popen[bytes]:
        full = dict(os.environ, LEASEQ_DSN=self.dsn, FAULT_DIR=str(self.fault_dir),
                    PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]), **env)
        with open(self.fault_dir / f"{name}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", f"tests.fault.{self.module}"], cwd=ROOT, env=full,
                                    stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.fault_dir / f"{name}.log").read_text()

    def count(self, name: str, task_id: int) -> int:
        path = self.fault_dir / f"{name}-{task_id}.log"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
