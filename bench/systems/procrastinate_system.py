"""procrastinate at its default settings (PsycopgConnector, LISTEN/NOTIFY on).

Its worker fetches one job per statement and finishes each job with its own
call; ``concurrency`` is the number of jobs run at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg

from . import ENQUEUE_BATCH, Control

logging.getLogger("procrastinate").setLevel(logging.WARNING)


def _app(connector: Any) -> tuple[Any, Any]:
    import procrastinate

    app = procrastinate.App(connector=connector)

    @app.task(name="noop")
    async def noop(i: int = 0) -> None:
        return None

    return app, noop


class ProcrastinateSystem:
    """procrastinate: finishes a job by id and status, no fencing token."""

    name = "procrastinate"
    label = "procrastinate"
    dialect = "postgres"

    def version(self) -> str:
        import procrastinate

        return procrastinate.__version__

    def _async_app(self, dsn: str) -> tuple[Any, Any]:
        import procrastinate

        return _app(procrastinate.PsycopgConnector(conninfo=dsn))

    def install(self, dsn: str) -> None:
        async def go() -> None:
            app, _ = self._async_app(dsn)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
        asyncio.run(go())

    def enqueue_one(self, dsn: str, n: int) -> None:
        async def go() -> None:
            app, noop = self._async_app(dsn)
            async with app.open_async():
                for i in range(n):
                    await noop.defer_async(i=i)
        asyncio.run(go())

    def enqueue_batch(self, dsn: str, n: int) -> None:
        async def go() -> None:
            app, noop = self._async_app(dsn)
            async with app.open_async():
                for start in range(0, n, ENQUEUE_BATCH):
                    await noop.batch_defer_async(*[{"i": i} for i in range(start, min(n, start + ENQUEUE_BATCH))])
        asyncio.run(go())

    def enqueue_timed(self, dsn: str, index: int) -> None:
        import procrastinate

        if getattr(self, "_sync", None) is None or self._sync[0] != dsn:
            app, noop = _app(procrastinate.SyncPsycopgConnector(conninfo=dsn))
            app.open()
            self._sync = (dsn, app, noop)
        self._sync[2].defer(i=index)

    def close(self) -> None:
        if getattr(self, "_sync", None) is not None:
            self._sync[1].close()
            self._sync = None

    def finished(self, dsn: str) -> tuple[int, float | None, float | None]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*), extract(epoch FROM min(at))::float8, "
                                "extract(epoch FROM max(at))::float8 FROM procrastinate_events "
                                "WHERE type = 'succeeded'").fetchone()

    def running(self, dsn: str) -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'doing'").fetchone()[0]

    async def open_worker(self, dsn: str, control: Control) -> ProcrastinateRunner:
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
        runner = ProcrastinateRunner(app, control)
        await app.open_async()
        return runner


class ProcrastinateRunner:
    """A procrastinate worker with one no-op task."""

    def __init__(self, app: Any, control: Control):
        self.app, self.control = app, control
        mode = control.options.mode

        @app.task(name="noop")
        async def noop(i: int = 0) -> None:
            control.handler_started(i)
            if mode == "hold":
                await control.stop.wait()
            control.handler_done()

    async def run(self) -> None:
        options = self.control.options
        worker = asyncio.create_task(self.app.run_worker_async(
            concurrency=options.concurrency, wait=options.mode != "drain", install_signal_handlers=False))
        stopper = asyncio.create_task(self.control.stop.wait())
        await asyncio.wait({worker, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not worker.done():
            worker.cancel()  # procrastinate's graceful stop
            await asyncio.gather(worker, return_exceptions=True)
        stopper.cancel()

    async def close(self) -> None:
        await self.app.close_async()
