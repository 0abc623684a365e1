"""The port the worker runtime awaits for every call, and what each transport declares it can do.

The runtime talks to the queue through one async interface,
:class:`Transport`, awaited on its own event loop for every call: no call
is run in a thread on the runtime's behalf. Two ports implement it:

* :class:`leaseq.AsyncQueue`, the direct one: each call drives the queue's
  engine operation with :func:`leaseq.engine.adrive` (psycopg's asyncio
  connections on PostgreSQL, so a worker process keeps one pool; sqlite3,
  which has no asyncio form, in a thread);
* :class:`leaseq.client.AsyncRemoteQueue`, the HTTP one: urllib3 with
  kept-alive connections, each request sent from a thread of the client's
  own while the loop goes on (an asyncio HTTP client cost twice the CPU).

:func:`worker_port` turns what a user hands the runtime (a :class:`leaseq.Queue`,
a :class:`leaseq.client.RemoteQueue`, or a port already) into the port.

Each port declares its :class:`Capabilities` once, as ``port.capabilities``;
the runtime reads those flags and never probes a port for methods. A port
that wraps another (to record, count or gate calls) forwards the wrapped
one's declaration, and with it the promise of the calls each flag names.

A sync handler runs in a thread; its ledger calls (``ctx.effect``,
``ctx.tool``, ``fx.record``, ``ctx.intend``) reach the port on the runtime's
loop through :func:`call_on_loop`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from ..core.capabilities import Capabilities
from ..core.model import Claim, Effect, Task, Worker

__all__ = ["Capabilities", "Transport", "call_on_loop", "worker_port"]

T = TypeVar("T")


class Transport(Protocol):
    """What the runtime awaits of a queue: :class:`leaseq.AsyncQueue` or :class:`leaseq.client.AsyncRemoteQueue`.

    Every call raises the library's exceptions: :class:`~leaseq.LeaseLost`
    when the lease guard refuses, :class:`~leaseq.BackendUnavailable` when the
    queue cannot be reached (:func:`leaseq.core.errors.is_transient`: the
    runtime retries those), and so on.
    """

    capabilities: Capabilities

    async def register_worker(self, name: str, *, kinds: list[dict[str, Any]] | None = None,
                              heartbeat_seconds: float | None = None, lease_seconds: float | None = None,
                              version: str | None = None, compatible_versions: list[str] | None = None) -> Worker: ...
    async def heartbeat_worker(self, worker: Worker) -> None: ...
    async def stop_worker(self, worker: Worker, reason: str = "stopped") -> None: ...
    async def claim(self, worker: Worker, *, queue: str, limit: int, lease_seconds: float | None = None,
                    kinds: list[str] | None = None, wait: float = 0.0) -> list[Claim]:
        """``wait`` only where ``capabilities.long_poll`` says the queue waits for work."""
    async def renew_leases(self, worker: Worker, claims: list[Claim]) -> dict[int, datetime]: ...
    async def complete(self, worker: Worker, claim: Claim, result: Any = None) -> None: ...
    async def complete_many(self, worker: Worker, done: Sequence[tuple[Claim, Any]]) -> set[int]: ...
    async def fail(self, worker: Worker, claim: Claim, error: str, *, retry: bool = True, block: bool = False,
                   delay: float | None = None) -> Task: ...
    async def release(self, worker: Worker, claim: Claim, reason: str = "released", *,
                      started: bool = True) -> Task: ...
    async def retry(self, worker: Worker, claim: Claim, after: float = 0.0,
                    reason: str = "retry requested") -> Task: ...
    async def begin_effect(self, worker: Worker, claim: Claim, action: str, key: str | None = None, *,
                           resource: str | None = None, effect: str | None = None,
                           args_digest: str | None = None) -> Effect: ...
    async def finish_effect(self, worker: Worker, claim: Claim, effect: Effect, response: Any = None) -> Effect: ...
    async def dependency_results(self, task_id: int) -> dict[int, Any]: ...
    async def sleep(self, worker: Worker, claim: Claim, key: str, *, seconds: float | None = None,
                    until: Any = None) -> dict[str, Any]: ...
    async def wait_signal(self, worker: Worker, claim: Claim, key: str, name: str, *,
                          timeout: float | None = None, ask: dict[str, Any] | None = None) -> dict[str, Any]: ...
    async def intend(self, worker: Worker, claim: Claim, kind: str, payload: Any = None, *, key: str,
                     **options: Any) -> Task: ...
    async def emit(self, worker: Worker, claim: Claim, item: Any, *, key: str | None = None) -> dict[str, Any]: ...
    async def spawn(self, worker: Worker, claim: Claim, kind: str, payload: Any = None, *, key: str,
                    **options: Any) -> Task: ...
    async def wait_children(self, worker: Worker, claim: Claim, key: str,
                            child_ids: Sequence[int], *, timeout: float | None = None) -> dict[str, Any]: ...
    async def consume(self, worker: Worker, claim: Claim, key: str, limit_key: str, units: int) -> dict[str, Any]: ...
    async def enqueue(self, kind: str, payload: Any = None, **options: Any) -> Task: ...
    async def close_async(self) -> None:
        """Close the connections opened for the running event loop (the runtime does, as it ends)."""

    # -- the calls a capability flag promises (made only where the port declares it) ---------

    async def complete_and_claim(self, worker: Worker, done: Sequence[tuple[Claim, Any]], *, queue: str,
                                 limit: int, lease_seconds: float | None = None,
                                 kinds: list[str] | None = None) -> tuple[set[int], list[Claim]]:
        """``capabilities.claim_with_completion``."""
    async def interrupt_claims(self, worker: Worker) -> None:
        """``capabilities.long_poll``."""
    async def listener(self, queues: list[str]) -> Any:
        """``capabilities.listen_notify``: a waiter whose ``wait(timeout)`` and ``close()`` are awaited."""
    async def report_loss(self, worker: Worker, claim: Claim, reason: str) -> None:
        """``capabilities.loss_reports``."""


def worker_port(transport: Any) -> Any:
    """The port the runtime awaits for ``transport``: an :class:`leaseq.AsyncQueue` over a
    :class:`leaseq.Queue`; what a blocking transport names as its port (``worker_port()``:
    :meth:`leaseq.client.RemoteQueue.worker_port`); else ``transport`` itself, a port already."""
    from ..aio import AsyncQueue
    from ..queue import Queue

    if isinstance(transport, Queue):
        return AsyncQueue(transport)
    named = getattr(type(transport), "worker_port", None)
    if callable(named):
        return named(transport)
    return transport


def call_on_loop(loop: asyncio.AbstractEventLoop, call: Callable[..., Awaitable[T]], *args: Any,
                 **kwargs: Any) -> T:
    """Await ``call(*args, **kwargs)`` on ``loop`` from another thread (a sync handler's),
    blocking that thread until it is done; its result or exception is this call's."""
    return asyncio.run_coroutine_threadsafe(_awaited(call, args, kwargs), loop).result()


async def _awaited(call: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    return await call(*args, **kwargs)
