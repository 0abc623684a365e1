"""The ceiling: leaseq's guarded cycle written by hand in raw psycopg.

A yardstick, not part of leaseq: it runs on leaseq's own tables (migrated
by leaseq) but skips everything leaseq adds around the SQL: no evidence
trail, no routing of expired leases, no paused-queue or revoked-worker
checks, no Python objects per task. It keeps the part that makes a lease a
lease: a batch claim with SKIP LOCKED that advances the generation, and a
batched completion guarded by owner, generation and a live deadline.

The worker mirrors leaseq's runtime shape: claims sized to free capacity,
completions batched while the previous batch is being written, one
connection claiming and one completing. For pickup latency it adds a third
connection LISTENing on leaseq's channel, read on the event loop itself: the
least a LISTEN/NOTIFY wake-up and a guarded claim can take here. Its
enqueue is one INSERT and its NOTIFY in one transaction, as leaseq's.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import leaseq

from . import ASYNC_POOL, ENQUEUE_BATCH, Control, timed_callers

CLAIM = """
UPDATE leaseq_tasks t
SET status = 'running', lease_owner = %(owner)s, lease_expires_at = now() + interval '30 seconds',
    claim_generation = t.claim_generation + 1, attempts = t.attempts + 1, claimed_at = now(), updated_at = now()
FROM (SELECT id FROM leaseq_tasks
      WHERE status = 'queued' AND queue = 'default' AND available_at <= now()
      ORDER BY priority DESC, available_at, id
      LIMIT %(limit)s
      FOR UPDATE SKIP LOCKED) AS c
WHERE t.id = c.id
RETURNING t.id, t.claim_generation, t.payload
"""

COMPLETE = """
UPDATE leaseq_tasks t
SET status = 'completed', result = 'null', lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(generations)s::bigint[]) AS c(id, generation)
WHERE t.id = c.id
  AND t.claim_generation = c.generation
  AND t.status = 'running'
  AND t.lease_owner = %(owner)s
  AND t.lease_expires_at >= now()
RETURNING t.id
"""

INSERT_ONE = """
INSERT INTO leaseq_tasks (queue, kind, payload, effect, idempotency_key, max_attempts, lease_seconds)
VALUES ('default', 'noop', %s, 'read_only', %s, 5, 30)
"""

NOTIFY = "SELECT pg_notify('leaseq_work', 'default')"

COPY = "COPY leaseq_tasks (queue, kind, payload, effect, idempotency_key, max_attempts, lease_seconds) FROM STDIN"


class RawSystem:
    """Hand-written SQL on leaseq's schema: the most a guarded cycle can do here."""

    name = "raw"
    label = "raw psycopg ceiling"
    dialect = "postgres"

    def version(self) -> str:
        return f"psycopg {psycopg.__version__}"

    def install(self, dsn: str) -> None:
        with leaseq.connect(dsn) as q:
            q.migrate()

    def enqueue_one(self, dsn: str, n: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(n):
                conn.execute(INSERT_ONE, (Jsonb({"i": i}), uuid.uuid4().hex))

    def enqueue_async(self, dsn: str, n: int, callers: int) -> float:
        """One INSERT per call from ``callers`` coroutines sharing a pool of ASYNC_POOL
        connections (:func:`timed_callers`)."""
        from psycopg_pool import AsyncConnectionPool

        async def go() -> float:
            async with AsyncConnectionPool(dsn, min_size=ASYNC_POOL, max_size=ASYNC_POOL, open=False,
                                           kwargs={"autocommit": True}) as pool:
                await pool.wait()

                async def enqueue(i: int) -> None:
                    async with pool.connection() as conn:
                        await conn.execute(INSERT_ONE, (Jsonb({"i": i}), uuid.uuid4().hex))
                return await timed_callers(n, callers, enqueue)
        return asyncio.run(go())

    def enqueue_batch(self, dsn: str, n: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for start in range(0, n, ENQUEUE_BATCH):
                with conn.transaction(), conn.cursor().copy(COPY) as copy:
                    for i in range(start, min(n, start + ENQUEUE_BATCH)):
                        copy.write_row(("default", "noop", f'{{"i": {i}}}', "read_only", uuid.uuid4().hex, 5, 30))

    def enqueue_timed(self, dsn: str, index: int) -> None:
        if getattr(self, "_conn", None) is None or self._conn[0] != dsn:
            self._conn = (dsn, psycopg.connect(dsn, autocommit=True))
        conn = self._conn[1]
        with conn.transaction():
            conn.execute(INSERT_ONE, (Jsonb({"i": index}), uuid.uuid4().hex))
            conn.execute(NOTIFY)

    def close(self) -> None:
        if getattr(self, "_conn", None) is not None:
            self._conn[1].close()
            self._conn = None

    def finished(self, dsn: str) -> tuple[int, float | None, float | None]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*), extract(epoch FROM min(updated_at))::float8, "
                                "extract(epoch FROM max(updated_at))::float8 FROM leaseq_tasks "
                                "WHERE status = 'completed'").fetchone()

    def running(self, dsn: str) -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM leaseq_tasks WHERE status = 'running'").fetchone()[0]

    async def open_worker(self, dsn: str, control: Control) -> RawRunner:
        runner = RawRunner(control)
        runner.claimer = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        runner.completer = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        for conn in (runner.claimer, runner.completer):
            # the ceiling writes leases with bare statements: as the schema's owner, the one role
            # leaseq's lease-column trigger lets write them outside the definer functions
            await conn.execute("SET ROLE leaseq_owner")
        if control.options.mode == "latency":
            runner.listener = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            await runner.listener.execute("LISTEN leaseq_work")
        return runner


class RawRunner:
    """Claim up to free capacity, run no-op handlers, complete in batches."""

    def __init__(self, control: Control):
        self.control = control
        self.owner = f"raw-{uuid.uuid4().hex[:12]}"
        self.claimer: psycopg.AsyncConnection | None = None
        self.completer: psycopg.AsyncConnection | None = None
        self.listener: psycopg.AsyncConnection | None = None
        self.running = 0
        self.done: list[tuple[int, int]] = []
        self.wake = asyncio.Event()
        self.flusher: asyncio.Task | None = None
        self.unflushed = 0

    async def _handle(self, task_id: int, generation: int, payload: Any) -> None:
        self.control.handler_started((payload or {}).get("i", 0))
        self.running -= 1
        self.done.append((task_id, generation))
        self.wake.set()
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        await asyncio.sleep(0)
        while self.done:
            batch, self.done = self.done, []
            await self.completer.execute(COMPLETE, {"ids": [b[0] for b in batch],
                                                    "generations": [b[1] for b in batch], "owner": self.owner})
            self.unflushed -= len(batch)
            for _ in batch:
                self.control.handler_done()
            self.wake.set()

    async def _listen(self) -> None:
        async for _ in self.listener.notifies():
            self.wake.set()

    async def run(self) -> None:
        concurrency = self.control.options.concurrency
        listening = asyncio.create_task(self._listen()) if self.listener is not None else None
        while not self.control.stop.is_set():
            self.wake.clear()
            free = concurrency - self.running
            rows = []
            if free > 0:
                cur = await self.claimer.execute(CLAIM, {"owner": self.owner, "limit": free})
                rows = await cur.fetchall()
            for task_id, generation, payload in rows:
                self.running += 1
                self.unflushed += 1
                asyncio.create_task(self._handle(task_id, generation, payload))
            if self.control.options.mode == "drain" and not rows and self.unflushed == 0:
                return
            if not rows or len(rows) >= free:
                try:
                    await asyncio.wait_for(self.wake.wait(), 1.0)
                except asyncio.TimeoutError:
                    pass
        if listening is not None:
            listening.cancel()
        if self.flusher is not None:
            await self.flusher

    async def close(self) -> None:
        for conn in (self.claimer, self.completer, self.listener):
            if conn is not None:
                await conn.close()
