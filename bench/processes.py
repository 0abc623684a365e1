"""Starting, releasing and collecting :mod:`bench.worker` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class WorkerGroup:
    """``count`` worker processes of one system, started together.

    ``start()`` returns once every process is connected and waiting;
    ``go()`` releases them at once; ``wait()`` or ``stop()`` collects
    their results.
    """

    def __init__(self, system: str, dsn: str, *, count: int = 1, mode: str = "drain",
                 concurrency: int = 10, target: int = 0, timeout: float = 600.0, io_seconds: float = 0.0,
                 env: dict[str, str] | None = None, lease_seconds: float | None = None, prefetch: int = 0,
                 tool_calls: int = 0):
        self.timeout = timeout
        env = {**os.environ, **(env or {})}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "bench.worker", system, dsn, "--mode", mode,
               "--concurrency", str(concurrency), "--target", str(target), "--io-seconds", str(io_seconds)]
        if lease_seconds is not None:
            cmd += ["--lease-seconds", str(lease_seconds)]
        if prefetch:
            cmd += ["--prefetch", str(prefetch)]
        if tool_calls:
            cmd += ["--tool-calls", str(tool_calls)]
        self.procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env=env, cwd=str(ROOT)) for _ in range(count)]
        self.results: list[dict[str, Any]] = [{} for _ in self.procs]
        self.errors: list[str] = ["" for _ in self.procs]
        self._readers: list[threading.Thread] = []
        self._ready = [threading.Event() for _ in self.procs]
        self._done = [threading.Event() for _ in self.procs]

    def start(self) -> WorkerGroup:
        for i, proc in enumerate(self.procs):
            self._readers.append(threading.Thread(target=self._read, args=(i, proc), daemon=True))
            self._readers.append(threading.Thread(target=self._read_err, args=(i, proc), daemon=True))
        for reader in self._readers:
            reader.start()
        deadline = time.monotonic() + 60
        for i, ready in enumerate(self._ready):
            if not ready.wait(max(0.0, deadline - time.monotonic())):
                self.kill()
                raise RuntimeError(f"worker {i} did not get ready: {self.errors[i][-2000:]}")
        return self

    def _read(self, i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.startswith("READY"):
                self._ready[i].set()
            elif line.startswith("DONE"):
                self._done[i].set()
            elif line.startswith("RESULT "):
                try:
                    self.results[i] = json.loads(line[len("RESULT "):])
                except ValueError:
                    self.errors[i] += f"unreadable result line: {line[:200]!r}\n"
        self._ready[i].set()  # exited: do not wait for READY or DONE any longer
        self._done[i].set()

    def _read_err(self, i: int, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            self.errors[i] = (self.errors[i] + line)[-20000:]

    def _send(self, command: str) -> None:
        for proc in self.procs:
            try:
                proc.stdin.write(command + "\n")
                proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass

    def go(self) -> None:
        """Release every worker."""
        self._send("GO")

    def stop(self, grace: float = 1.0) -> list[dict[str, Any]]:
        """Ask every worker to stop; after ``grace`` seconds tell it to exit at once. Then collect."""
        self._send("STOP")
        self._exit_after(grace)
        return self.wait()

    def _exit_after(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.02)
        self._send("EXIT")

    def wait(self, finished: Any = None) -> list[dict[str, Any]]:
        """Wait until the work is done, then collect every worker; raise if one failed.

        ``finished()`` says when the measured work is done (read from the
        database); without it, when every worker has said ``DONE``. Workers
        are then told to exit at once: some queues take seconds to shut down
        after the work that was measured.
        """
        deadline = time.monotonic() + self.timeout
        while not all(done.is_set() for done in self._done) and time.monotonic() < deadline:
            if finished is not None and finished():
                break
            time.sleep(0.2 if finished is not None else 0.02)
        self._send("EXIT")
        for i, proc in enumerate(self.procs):
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise RuntimeError(f"worker {i} did not finish within {self.timeout:.0f}s") from None
        for reader in self._readers:
            reader.join(5)
        for i, proc in enumerate(self.procs):
            if proc.returncode != 0 or not self.results[i]:
                raise RuntimeError(f"worker {i} exited with {proc.returncode}: {self.errors[i][-3000:]}")
        return self.results

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
