"""Fixtures for the service tests: a real uvicorn server on 127.0.0.1, per backend.

``svc`` serves the migrated queue of the shared ``q`` fixture (a SQLite file
or a PostgreSQL schema) on an ephemeral loopback port, in a thread of the
test process, and hands out tokens and clients for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn

import leaseq
from leaseq import auth
from leaseq.client import RemoteQueue
from leaseq.service import create_app
from leaseq.service.app import server_config


@contextmanager
def serve(q: leaseq.Queue, **settings: Any) -> Iterator[tuple[str, Any]]:
    """Run the service for ``q`` on 127.0.0.1 (ephemeral port); yields ``(url, app)``."""
    app = create_app(q, **settings)
    # server_config: the uvicorn settings `leaseq serve` uses (forwarded headers trusted as configured)
    server = uvicorn.Server(server_config(app, host="127.0.0.1", port=0, log_level="warning",
                                         lifespan="on", access_log=False))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:  # uvicorn offers a flag, not an event
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        # A dashboard live stream whose browser went away ends at its next tick; wait for
        # that, since its database calls must not outlive the queue the test closes next.
        deadline = time.monotonic() + 5
        while (app.state.live_streams or app.state.task_streams) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not app.state.live_streams, "a live stream outlived its client by 5 s"
        assert not app.state.task_streams, "a task's stream outlived its client by 5 s"
        # Maintenance stops here, before the test closes the queue: its threads use the
        # queue's connections, and a SQLite connection closed under a running statement
        # crashes the process. Clients are closed and no request is in flight; uvicorn
        # needs ~0.2 s of ticks to wind down, which the next test need not wait for.
        app.state.maintenance.stop()
        server.should_exit = True


@dataclass
class Service:
    """A running service and helpers to talk to it."""

    url: str
    app: Any
    q: leaseq.Queue
    dsn: str
    _clients: list[Any] = field(default_factory=list)

    def token(self, role: str, name: str | None = None, **options: Any) -> str:
        token, _ = auth.create_token(self.q, name=name or f"{role}-test", role=role, created_by="test", **options)
        return token

    def http(self, token: str | None = None, **headers: str) -> httpx.Client:
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        client = httpx.Client(base_url=self.url, headers=headers, timeout=10)
        self._clients.append(client)
        return client

    def remote(self, token: str) -> RemoteQueue:
        rq = RemoteQueue(self.url, token, timeout=10)
        self._clients.append(rq)
        return rq

    def close(self) -> None:
        for c in self._clients:
            c.close()


@pytest.fixture
def svc(q: leaseq.Queue, dsn: str) -> Iterator[Service]:
    """The service over a migrated queue, on both backends."""
    with serve(q) as (url, app):
        s = Service(url, app, q, dsn)
        try:
            yield s
        finally:
            s.close()
