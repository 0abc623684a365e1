"""leaseq itself, through its public API only: Queue, App and the worker runtime.

``leaseq`` and ``leaseq-compact`` run on PostgreSQL (the second with the
evidence trail at its most compact setting); ``leaseq-roles`` runs as the
production set-up does, its workers and enqueuer logged in as a worker role
made by ``leaseq roles create`` (the install alone runs as the owner);
``leaseq-sqlite`` runs embedded on a SQLite file, the DSN then being
``sqlite:///…``.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from typing import Any

import psycopg

import leaseq

from . import ENQUEUE_BATCH, Control, timed_callers


class LeaseqSystem:
    """leaseq with every guard and the evidence trail on."""

    def __init__(self, name: str = "leaseq"):
        self.name = name
        self.dialect = "sqlite" if name == "leaseq-sqlite" else "postgres"
        self.label = {"leaseq": "leaseq", "leaseq-compact": "leaseq (compact evidence)",
                      "leaseq-roles": "leaseq (worker role)", "leaseq-sqlite": "leaseq (SQLite, embedded)"}[name]
        self.options: dict[str, Any] = {"evidence": "compact"} if name == "leaseq-compact" else {}

    def version(self) -> str:
        return leaseq.__version__ if hasattr(leaseq, "__version__") else "0.1.0 (this tree)"

    def _queue(self, dsn: str) -> leaseq.Queue:
        return leaseq.connect(self._login(dsn), **self.options)

    def _login(self, dsn: str) -> str:
        """The DSN the queue's users log in with: the owner's, or (``leaseq-roles``) the
        bench's worker role's, named and keyed after the schema so every process finds it."""
        if self.name != "leaseq-roles":
            return dsn
        from leaseq import roles

        role = _role_name(dsn)
        return roles.role_dsn(dsn, role, _password(role))

    def install(self, dsn: str) -> None:
        with leaseq.connect(dsn, **self.options) as q:
            q.migrate()
            if self.name == "leaseq-roles":
                from leaseq import roles

                role = _role_name(dsn)
                with psycopg.connect(dsn, autocommit=True) as conn:  # left by an earlier run
                    conn.execute(f'DROP ROLE IF EXISTS "{role}"')
                roles.create_role(q, "worker", role, password=_password(role))

    def enqueue_one(self, dsn: str, n: int) -> None:
        with self._queue(dsn) as q:
            for i in range(n):
                q.enqueue("noop", {"i": i})

    def enqueue_async(self, dsn: str, n: int, callers: int) -> float:
        """``AsyncQueue.enqueue`` from ``callers`` coroutines (:func:`timed_callers`)."""
        async def go() -> float:
            q = await leaseq.connect_async(self._login(dsn), **self.options)
            try:
                return await timed_callers(n, callers, lambda i: q.enqueue("noop", {"i": i}))
            finally:
                await q.close()
        return asyncio.run(go())

    def enqueue_batch(self, dsn: str, n: int, *, limits: list[str] | None = None,
                      fairness_key: str | None = None) -> None:
        with self._queue(dsn) as q:
            for start in range(0, n, ENQUEUE_BATCH):
                q.enqueue_many("noop", [{"i": i} for i in range(start, min(n, start + ENQUEUE_BATCH))],
                               limits=limits, fairness_key=fairness_key)

    def enqueue_each(self, dsn: str, n: int, *, fairness_key: str | None = None) -> list[int]:
        """``n`` tasks, one enqueue (one commit) each: a tenant's few requests; their ids."""
        with self._queue(dsn) as q:
            return [q.enqueue("noop", {"i": -1 - i}, fairness_key=fairness_key).id for i in range(n)]

    def pickups_ms(self, dsn: str, ids: list[int]) -> list[float]:
        """Milliseconds from each task's enqueue to its (first) claim, by the database's clock."""
        listed = ",".join(str(int(i)) for i in ids)
        if self.dialect == "sqlite":
            sql = f"SELECT (claimed_at - created_at) * 1000 FROM leaseq_tasks WHERE id IN ({listed})"
            with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
                return [float(r[0]) for r in conn.execute(sql)]
        sql = f"SELECT extract(epoch FROM claimed_at - created_at)::float8 * 1000 FROM leaseq_tasks WHERE id IN ({listed})"
        with psycopg.connect(dsn, autocommit=True) as conn:
            return [float(r[0]) for r in conn.execute(sql).fetchall()]

    def set_limit(self, dsn: str, key: str, **limit: Any) -> None:
        with self._queue(dsn) as q:
            q.set_limit(key, **limit, by="bench")

    def enqueue_timed(self, dsn: str, index: int) -> None:
        self._latency_queue(dsn).enqueue("noop", {"i": index})

    def _latency_queue(self, dsn: str) -> leaseq.Queue:
        # One open queue for the whole latency run, so the pool is warm.
        if getattr(self, "_open", None) is None or self._open[0] != dsn:
            self._open = (dsn, self._queue(dsn))
        return self._open[1]

    def close(self) -> None:
        if getattr(self, "_open", None) is not None:
            self._open[1].close()
            self._open = None

    def _one(self, dsn: str, sql: str) -> tuple[Any, ...]:
        if self.dialect == "sqlite":
            with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
                return conn.execute(sql).fetchone()
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute(sql).fetchone()

    def finished(self, dsn: str) -> tuple[int, float | None, float | None]:
        if self.dialect == "sqlite":  # times are already Unix seconds
            return self._one(dsn, "SELECT count(*), min(updated_at), max(updated_at) FROM leaseq_tasks "
                                  "WHERE status = 'completed'")
        return self._one(dsn, "SELECT count(*), extract(epoch FROM min(updated_at))::float8, "
                              "extract(epoch FROM max(updated_at))::float8 FROM leaseq_tasks WHERE status = 'completed'")

    def running(self, dsn: str) -> int:
        return self._one(dsn, "SELECT count(*) FROM leaseq_tasks WHERE status = 'running'")[0]

    async def open_worker(self, dsn: str, control: Control) -> LeaseqRunner:
        return LeaseqRunner(self._login(dsn), self.options, control)


def _password(role: str) -> str:
    """The bench role's password: derived, so each worker process logs in without being told; the
    role lives as long as its trial's schema (bench.database drops both)."""
    import hashlib

    return hashlib.sha256(f"leaseq-bench.{role}".encode()).hexdigest()


def _role_name(dsn: str) -> str:
    """The bench's worker role for the schema of ``dsn``."""
    from psycopg.conninfo import conninfo_to_dict

    options = str(conninfo_to_dict(dsn).get("options") or "")
    schema = options.rsplit("search_path=", 1)[-1].split()[0] if "search_path=" in options else "public"
    return f"bench_worker_{schema}"[:63]


#: Set by the orchestrator for a remote run: the worker goes through ``leaseq serve`` at this URL.
SERVER_ENV, TOKEN_ENV = "LEASEQ_BENCH_SERVER", "LEASEQ_BENCH_TOKEN"


class LeaseqRunner:
    """An App with one handler and a WorkerRuntime, as ``leaseq worker`` would run it: direct, or
    through the HTTP service when ``$LEASEQ_BENCH_SERVER`` and ``$LEASEQ_BENCH_TOKEN`` are set."""

    def __init__(self, dsn: str, options: dict[str, Any], control: Control):
        self.control = control
        self.app = leaseq.App(dsn, **options)
        server = os.environ.get(SERVER_ENV)
        if server:
            from leaseq.client import RemoteQueue

            self.transport: Any = RemoteQueue(server, os.environ[TOKEN_ENV])
        else:
            self.transport = self.app.queue  # connect (and check the schema) before the clock starts
        mode, io_seconds = control.options.mode, control.options.io_seconds
        tool_calls = control.options.tool_calls

        async def lookup(i: int) -> int:  # a tool that answers at once: the ledger's cost alone
            return i

        @self.app.task("noop")
        async def noop(ctx: Any, i: int = 0) -> None:
            control.handler_started(i)
            if tool_calls:
                tool = ctx.tool(lookup, action="bench.lookup", effect="read_only")
                for _ in range(tool_calls):
                    began = time.perf_counter()
                    await tool(i)
                    control.tool_seconds.append(time.perf_counter() - began)
            if mode == "hold":
                await control.stop.wait()
            elif mode == "io":
                await asyncio.sleep(io_seconds)  # the model call
            control.handler_done()

        self.runtime = self.app.worker(transport=self.transport, concurrency=control.options.concurrency,
                                       grace=0.5, lease_seconds=control.options.lease_seconds,
                                       prefetch=control.options.prefetch)
        self._started = time.monotonic()
        control.on_stop.append(self._count)  # before the shutdown's releases
        control.on_stop.append(self.runtime.stop)

    def _count(self) -> None:
        """The renewal statements this worker sent, and over how long (until told to stop)."""
        self.control.counters["renewal_statements"] = self.runtime.stats.renewals
        self.control.counters["run_s"] = time.monotonic() - self._started

    async def run(self) -> None:
        self._started = time.monotonic()
        await self.runtime.run(until_idle=self.control.options.mode in ("drain", "io"))

    async def close(self) -> None:
        self.transport.close()
