"""Entry point of one chaos worker process: ``python -m leaseq_chaos.worker_process``.

It runs the real :class:`~leaseq.worker.WorkerRuntime` on the chaos
workload, as ``leaseq worker`` does, with two additions a test build needs:

* a :class:`RecordingTransport` around the :class:`leaseq.Queue`, writing
  every guarded call and its verdict to the run's history;
* the skewed clock (:mod:`leaseq_chaos.skewed_clock`) when the harness asks
  for one, installed before anything else reads the clock.

Configuration comes from the environment the harness sets: ``LEASEQ_DSN``,
``LEASEQ_CHAOS_LEDGER_DSN``, ``LEASEQ_CHAOS_HISTORY``, ``LEASEQ_CHAOS_PROC``,
``LEASEQ_CHAOS_CONCURRENCY``, ``LEASEQ_CHAOS_PREFETCH``, ``LEASEQ_CHAOS_SEED`` and the clock variables; a remote
worker gets ``LEASEQ_CHAOS_SERVER`` (the ``leaseq serve`` URL) and
``LEASEQ_CHAOS_TOKEN_FILE`` (its worker token) and talks HTTP only.
"""

from __future__ import annotations

import logging
import os
import random
import sys
from typing import Any

from . import history as history_module
from . import skewed_clock


def _outcome(exc: BaseException) -> str:
    from leaseq.core.errors import InvalidInput, InvalidTransition, LeaseLost, QueuePaused

    if isinstance(exc, (LeaseLost, QueuePaused, InvalidTransition)):
        return "refused"
    if isinstance(exc, InvalidInput):
        return "error"
    return "unknown"  # the connection broke: the call may or may not have committed


class RecordingTransport:
    """The worker's port onto a :class:`leaseq.Queue` (or a RemoteQueue), whose guarded calls
    are written to the history: each awaited on the runtime's loop, as the port's are."""

    def __init__(self, queue: Any, history: history_module.HistoryWriter):
        from leaseq.worker.transport import worker_port

        self._queue = worker_port(queue)
        self._history = history

    def __getattr__(self, name: str) -> Any:  # capabilities, listener, report_loss, close_async...
        return getattr(self._queue, name)

    async def _call(self, op: str, fields: dict[str, Any], fn: Any, *args: Any, **kwargs: Any) -> Any:
        fields["t0"] = history_module.now()  # when the call was made; "t" says when it returned
        try:
            value = await fn(*args, **kwargs)
        except Exception as exc:
            self._history.record(op, _outcome(exc), **fields, error=type(exc).__name__)
            raise
        return value

    async def complete_many(self, worker: Any, done: list) -> set:
        """The batched completion, recorded per task."""
        fields = {"worker": worker.id, "tasks": [[c.task_id, c.generation] for c, _ in done]}
        held = await self._call("complete", fields, self._queue.complete_many, worker, done)
        self._completed(worker, done, held, fields)
        return held

    async def complete_and_claim(self, worker: Any, done: list, **kwargs: Any) -> tuple[set, list]:
        """Completions that lease the next tasks in the same request (remote workers): recorded
        as the completions and the claim they are; a broken call leaves both unknown."""
        fields = {"worker": worker.id, "tasks": [[c.task_id, c.generation] for c, _ in done]}
        try:
            held, claims = await self._call("complete", fields, self._queue.complete_and_claim, worker, done,
                                            **kwargs)
        except Exception as exc:
            self._history.record("claim", _outcome(exc), worker=worker.id, t0=fields["t0"],
                                 error=type(exc).__name__)
            raise
        self._completed(worker, done, held, fields)
        for c in claims:
            self._history.record("claim", "ok", worker=worker.id, task=c.task_id, gen=c.generation,
                                 lease=c.lease_seconds, t0=fields["t0"])
        return held, claims

    def _completed(self, worker: Any, done: list, held: set, fields: dict[str, Any]) -> None:
        for claim, result in done:
            self._history.record("complete", "ok" if claim.task_id in held else "refused", worker=worker.id,
                                 task=claim.task_id, gen=claim.generation, result=result, t0=fields["t0"])

    async def register_worker(self, name: str = "worker", **options: Any) -> Any:
        """Register, and record the identity (the harness revokes workers by it)."""
        worker = await self._queue.register_worker(name, **options)
        self._history.record("register", "ok", worker=worker.id)
        return worker

    async def claim(self, worker: Any, **kwargs: Any) -> list:
        fields = {"worker": worker.id}
        claims = await self._call("claim", fields, self._queue.claim, worker, **kwargs)
        for c in claims:
            self._history.record("claim", "ok", worker=worker.id, task=c.task_id, gen=c.generation,
                                 lease=c.lease_seconds, t0=fields["t0"])
        return claims

    async def renew_leases(self, worker: Any, claims: list) -> dict:
        fields = {"worker": worker.id, "leases": [[c.task_id, c.generation] for c in claims]}
        renewed = await self._call("renew", fields, self._queue.renew_leases, worker, claims)
        for c in claims:
            self._history.record("renew", "ok" if c.task_id in renewed else "refused", worker=worker.id,
                                 task=c.task_id, gen=c.generation, t0=fields["t0"])
        return renewed

    async def complete(self, worker: Any, claim: Any, result: Any = None) -> None:
        fields = {"worker": worker.id, "task": claim.task_id, "gen": claim.generation, "result": result}
        await self._call("complete", fields, self._queue.complete, worker, claim, result)
        self._history.record("complete", "ok", **fields)

    async def fail(self, worker: Any, claim: Any, error: str, **kwargs: Any) -> Any:
        fields = {"worker": worker.id, "task": claim.task_id, "gen": claim.generation}
        task = await self._call("fail", fields, self._queue.fail, worker, claim, error, **kwargs)
        self._history.record("fail", "ok", **fields, next_status=task.status)
        return task

    async def release(self, worker: Any, claim: Any, reason: str = "released", **kwargs: Any) -> Any:
        fields = {"worker": worker.id, "task": claim.task_id, "gen": claim.generation}
        task = await self._call("release", fields, self._queue.release, worker, claim, reason, **kwargs)
        self._history.record("release", "ok", **fields, next_status=task.status)
        return task

    async def retry(self, worker: Any, claim: Any, after: float = 0.0, reason: str = "retry requested") -> Any:
        fields = {"worker": worker.id, "task": claim.task_id, "gen": claim.generation}
        task = await self._call("retry", fields, self._queue.retry, worker, claim, after, reason)
        self._history.record("retry", "ok", **fields, next_status=task.status)
        return task

    async def begin_effect(self, worker: Any, claim: Any, action: str, key: str | None = None,
                           **kwargs: Any) -> Any:
        fields = {"worker": worker.id, "task": claim.task_id, "gen": claim.generation, "action": action}
        fx = await self._call("begin_effect", fields, self._queue.begin_effect, worker, claim, action, key, **kwargs)
        self._history.record("begin_effect", "ok", **fields, key=fx.idempotency_key, effect_id=fx.id,
                             replayed=fx.replayed)
        return fx

    async def finish_effect(self, worker: Any, claim: Any, effect: Any, response: Any = None) -> Any:
        fields = {"worker": worker.id, "task": claim.task_id, "gen": claim.generation, "effect_id": effect.id}
        fx = await self._call("finish_effect", fields, self._queue.finish_effect, worker, claim, effect, response)
        self._history.record("finish_effect", "ok", **fields)
        return fx

    async def dependency_results(self, task_id: int) -> dict:
        """A read: passed through unrecorded."""
        return await self._queue.dependency_results(task_id)


def main() -> None:
    """Run one chaos worker until SIGTERM (or SIGKILL)."""
    offset = float(os.environ.get(skewed_clock.OFFSET_ENV) or 0)
    rate = float(os.environ.get(skewed_clock.RATE_ENV) or 1)
    if offset or rate != 1:
        skewed_clock.install(offset, rate)

    from . import workload

    proc = os.environ.get("LEASEQ_CHAOS_PROC", f"worker-{os.getpid()}")
    random.seed(f"{os.environ.get('LEASEQ_CHAOS_SEED', '0')}/{proc}")  # retry jitter, replayable per process
    history = history_module.HistoryWriter(os.environ["LEASEQ_CHAOS_HISTORY"], proc)
    workload.HISTORY, workload.PROC = history, proc
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {proc} %(levelname)s %(name)s: %(message)s")
    history.record("worker_start", "ok", pid=os.getpid(), clock_offset=offset, clock_rate=rate)
    try:
        server = os.environ.get("LEASEQ_CHAOS_SERVER")

        def connect() -> RecordingTransport:
            # Called by the runtime, and retried while the queue is out of reach
            # (a dropped connection, a restarting database or service).
            if server:  # a remote worker: the HTTP transport, through `leaseq serve`
                from leaseq.client import RemoteQueue

                return RecordingTransport(RemoteQueue.from_token_file(
                    server, os.environ["LEASEQ_CHAOS_TOKEN_FILE"], timeout=10), history)
            return RecordingTransport(workload.app.queue, history)

        stats = workload.app.run_worker(
            connect=connect, queues=[workload.QUEUE],
            concurrency=int(os.environ.get("LEASEQ_CHAOS_CONCURRENCY", "4")), name=proc,
            prefetch=int(os.environ.get("LEASEQ_CHAOS_PREFETCH") or 0),
            poll_interval=0.1, grace=float(os.environ.get("LEASEQ_CHAOS_GRACE", "3")), install_signals=True)
        history.record("worker_stop", "ok", completed=stats.completed, failed=stats.failed, lost=stats.lost,
                       released=stats.released)
    except Exception as exc:
        history.record("worker_stop", "error", error=f"{type(exc).__name__}: {exc}"[:500])
        logging.getLogger("leaseq_chaos").error("worker failed: %r", exc)
        sys.stderr.flush()
        os._exit(3)
    sys.stderr.flush()
    os._exit(0)  # a sync handler ignoring its lost lease must not keep the process alive


if __name__ == "__main__":
    main()
