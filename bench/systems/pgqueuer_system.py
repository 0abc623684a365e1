"""pgqueuer at its default settings.

Defaults kept: ``batch_size=10``, no cap on concurrent tasks (pgqueuer's
cap must be at least twice the batch size, so "concurrency 10" cannot be
expressed; the ``hold`` mode caps it at the requested concurrency so each
worker holds its share), a 30 s heartbeat timeout, LISTEN/NOTIFY on.

``pgqueuer`` runs on asyncpg, the driver pgqueuer's own CLI picks first
(the bench extra installs it), falling back to psycopg as that CLI does when
asyncpg is missing; ``pgqueuer-psycopg`` always runs on psycopg's async
driver.
"""

from __future__ import annotations

import asyncio
import importlib.util
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import psycopg

from . import ASYNC_POOL, ENQUEUE_BATCH, Control, timed_callers


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _asyncpg_target(dsn: str) -> tuple[str, dict[str, str]]:
    """asyncpg takes no libpq ``options``: the trial's search_path becomes a server setting."""
    parts = urlsplit(dsn)
    settings, query = {}, []
    for key, value in parse_qsl(parts.query):
        if key == "options" and unquote(value).startswith("-csearch_path="):
            settings["search_path"] = unquote(value).removeprefix("-csearch_path=")
        else:
            query.append((key, value))
    return urlunsplit(parts._replace(query=urlencode(query))), settings


class PgqueuerSystem:
    """pgqueuer: completes by job id, no fencing token."""

    dialect = "postgres"

    def __init__(self, name: str = "pgqueuer"):
        self.name = name
        self.label = {"pgqueuer": "pgqueuer", "pgqueuer-psycopg": "pgqueuer on psycopg"}[name]
        self.driver = "asyncpg" if name == "pgqueuer" and importlib.util.find_spec("asyncpg") else "psycopg"

    def version(self) -> str:
        import pgqueuer

        if self.driver == "asyncpg":
            import asyncpg

            return f"{pgqueuer.__version__} (asyncpg {asyncpg.__version__})"
        return f"{pgqueuer.__version__} (psycopg {psycopg.__version__})"

    async def _driver(self, dsn: str) -> tuple[Any, Any]:
        """pgqueuer's driver over a fresh connection, and the connection (to close)."""
        if self.driver == "asyncpg":
            import asyncpg
            from pgqueuer import AsyncpgDriver

            target, settings = _asyncpg_target(dsn)
            conn = await asyncpg.connect(target, server_settings=settings)
            return AsyncpgDriver(conn), conn
        from pgqueuer import PsycopgDriver

        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        return PsycopgDriver(conn), conn

    async def _queries(self, dsn: str) -> tuple[Any, Any]:
        from pgqueuer import Queries

        driver, conn = await self._driver(dsn)
        return Queries(driver), conn

    def install(self, dsn: str) -> None:
        async def go() -> None:
            queries, conn = await self._queries(dsn)
            await queries.install()
            await conn.close()
        _run(go())

    def enqueue_one(self, dsn: str, n: int) -> None:
        async def go() -> None:
            queries, conn = await self._queries(dsn)
            for i in range(n):
                await queries.enqueue("noop", str(i).encode())
            await conn.close()
        _run(go())

    def enqueue_async(self, dsn: str, n: int, callers: int) -> float:
        """``Queries.enqueue`` from ``callers`` coroutines (:func:`timed_callers`), over a pool of
        ASYNC_POOL connections (pgqueuer's pool driver: asyncpg's pool, or psycopg's)."""
        async def go() -> float:
            from pgqueuer import Queries

            if self.driver == "asyncpg":
                import asyncpg
                from pgqueuer import AsyncpgPoolDriver

                target, settings = _asyncpg_target(dsn)
                pool = await asyncpg.create_pool(target, min_size=ASYNC_POOL, max_size=ASYNC_POOL,
                                                 server_settings=settings)
                try:
                    queries = Queries(AsyncpgPoolDriver(pool))
                    return await timed_callers(n, callers, lambda i: queries.enqueue("noop", str(i).encode()))
                finally:
                    await pool.close()
            from pgqueuer import PsycopgDriver
            from psycopg_pool import AsyncConnectionPool

            # pgqueuer's psycopg driver takes one connection: one per caller's turn, from a pool
            async with AsyncConnectionPool(dsn, min_size=ASYNC_POOL, max_size=ASYNC_POOL, open=False,
                                           kwargs={"autocommit": True}) as pool:
                await pool.wait()

                async def enqueue(i: int) -> None:
                    async with pool.connection() as conn:
                        await Queries(PsycopgDriver(conn)).enqueue("noop", str(i).encode())
                return await timed_callers(n, callers, enqueue)
        return _run(go())

    def enqueue_batch(self, dsn: str, n: int) -> None:
        async def go() -> None:
            queries, conn = await self._queries(dsn)
            for start in range(0, n, ENQUEUE_BATCH):
                size = min(n, start + ENQUEUE_BATCH) - start
                await queries.enqueue(["noop"] * size, [str(i).encode() for i in range(start, start + size)],
                                      [0] * size)
            await conn.close()
        _run(go())

    def enqueue_timed(self, dsn: str, index: int) -> None:
        # A fresh event loop per call would dominate; keep one sync connection.
        from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
        from pgqueuer.queries import SyncQueries

        if getattr(self, "_sync", None) is None or self._sync[0] != dsn:
            conn = psycopg.connect(dsn, autocommit=True)
            self._sync = (dsn, conn, SyncQueries(SyncPsycopgDriver(conn)))
        self._sync[2].enqueue("noop", str(index).encode())

    def close(self) -> None:
        if getattr(self, "_sync", None) is not None:
            self._sync[1].close()
            self._sync = None

    def finished(self, dsn: str) -> tuple[int, float | None, float | None]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*), extract(epoch FROM min(created))::float8, "
                                "extract(epoch FROM max(created))::float8 FROM pgqueuer_log "
                                "WHERE status = 'successful'").fetchone()

    def running(self, dsn: str) -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM pgqueuer WHERE status = 'picked'").fetchone()[0]

    async def open_worker(self, dsn: str, control: Control) -> PgqueuerRunner:
        from pgqueuer import PgQueuer

        driver, conn = await self._driver(dsn)
        return PgqueuerRunner(PgQueuer(driver), conn, control)


class PgqueuerRunner:
    """A PgQueuer with one no-op entrypoint."""

    def __init__(self, pgq: Any, conn: Any, control: Control):
        self.pgq, self.conn, self.control = pgq, conn, control
        mode = control.options.mode

        @pgq.entrypoint("noop")
        async def noop(job: Any) -> None:
            control.handler_started(int(job.payload or 0))
            if mode == "hold":
                await control.stop.wait()
            control.handler_done()

        control.on_stop.append(pgq.shutdown.set)

    async def run(self) -> None:
        from pgqueuer.domain.types import QueueExecutionMode

        mode = self.control.options.mode
        options: dict[str, Any] = {}
        if mode == "drain":
            options["mode"] = QueueExecutionMode.drain
        if mode == "hold":
            options["max_concurrent_tasks"] = max(20, self.control.options.concurrency)
        await self.pgq.run(**options)

    async def close(self) -> None:
        await self.conn.close()

    # pgqueuer's own default, spelled out for the report
    DEFAULTS = {"batch_size": 10, "heartbeat_timeout": timedelta(seconds=30)}
