"""Fixtures for running a worker runtime in a background thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import leaseq
from leaseq.worker import WorkerRuntime


class RunningWorker:
    """A WorkerRuntime on its own thread and event loop, stopped at teardown."""

    def __init__(self, runtime: WorkerRuntime):
        self.runtime = runtime
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while self.runtime.worker is None and time.monotonic() < deadline and self.thread.is_alive():
            time.sleep(0.01)
        assert self.runtime.worker is not None, f"worker did not start: {self.error!r}"

    def _main(self) -> None:
        try:
            asyncio.run(self.runtime.run())
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def stop(self, timeout: float = 15) -> None:
        self.runtime.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker did not stop"
        if self.error is not None:
            raise self.error


@pytest.fixture
def app(dsn: str) -> Iterator[leaseq.App]:
    """An App on a fresh database of each backend."""
    application = leaseq.App(dsn)
    yield application
    application.queue.close()


@pytest.fixture
def start_worker(app: leaseq.App) -> Iterator[Callable[..., RunningWorker]]:
    """Start a worker for ``app`` in the background: ``start_worker(concurrency=4, ...)``."""
    started: list[RunningWorker] = []

    def start(**options: Any) -> RunningWorker:
        options.setdefault("poll_interval", 0.05)
        running = RunningWorker(app.worker(**options))
        started.append(running)
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.stop()


def lease_live(q: leaseq.Queue, task_id: int) -> bool:
    """Whether the task is running on a lease the database's clock has not passed."""
    task = q.get(task_id)
    return task.status == "running" and task.lease_expires_at is not None and task.lease_expires_at > q.now()


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
