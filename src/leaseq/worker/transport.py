"""The port the worker runtime talks through, and what each transport declares it can do.

Two transports implement it: :class:`leaseq.Queue` (direct database access)
and :class:`leaseq.client.RemoteQueue` (the HTTP service). Each declares its
:class:`Capabilities` once, as ``transport.capabilities``; the runtime reads
those flags and never probes a transport for methods or compares dialect
names. A transport that wraps another (to record or gate calls) forwards
the wrapped one's declaration, and with it the promise of the calls each
flag names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from ..core.model import Claim, Effect, Task, Worker


@dataclass(frozen=True)
class Capabilities:
    """What a transport offers beyond the calls every transport has.

    Each flag promises the calls it names; the defaults describe the smallest
    transport (one call per outcome, polling, a thread per call).
    """

    #: ``aclaim``, ``acomplete_many``, ``abegin_effect``, ``afinish_effect`` and
    #: ``close_async`` run on the event loop itself (no thread hop): the worker,
    #: and an async handler's tool calls, await them directly.
    native_async: bool = False
    #: ``complete_many(worker, [(claim, result), ...]) -> set[task_id]`` finishes
    #: many tasks in one guarded statement.
    batched_completion: bool = False
    #: ``listener(queues)`` gives a blocking waiter woken when work is enqueued,
    #: so an idle worker need not poll often.
    listen_notify: bool = False
    #: ``report_loss(worker, claim, reason)`` adds the worker's account of a
    #: lost lease to the evidence trail.
    loss_reports: bool = False
    #: the backend runs one write at a time: more database threads would only
    #: hand the lock back and forth.
    serial_writes: bool = False
    #: ``claim(..., wait=seconds)`` waits on the queue's side for work when none
    #: is due (an idle worker need not poll), and ``interrupt_claims(worker)``
    #: ends such a wait at once, empty-handed.
    long_poll: bool = False
    #: ``complete_and_claim(worker, done, queue=, limit=, lease_seconds=, kinds=)
    #: -> (completed ids, claims)`` records a batch of completions and leases the
    #: next tasks in one round trip (a batch's freed slots refilled at once).
    claim_with_completion: bool = False

    @property
    def idle_poll_interval(self) -> float:
        """Seconds an idle worker waits between claims: long where a notification wakes it."""
        return 2.0 if self.listen_notify else 0.2


class Transport(Protocol):
    """What the runtime needs from a queue: :class:`leaseq.Queue` or the HTTP client.

    Every call raises the library's exceptions: :class:`~leaseq.LeaseLost`
    when the lease guard refuses, :class:`~leaseq.BackendUnavailable` when the
    queue cannot be reached (the runtime retries those), and so on.
    """

    capabilities: Capabilities

    def register_worker(self, name: str, *, kinds: list[dict[str, Any]] | None = None,
                        heartbeat_seconds: float | None = None, lease_seconds: float | None = None) -> Worker: ...
    def heartbeat_worker(self, worker: Worker) -> None: ...
    def stop_worker(self, worker: Worker, reason: str = "stopped") -> None: ...
    def claim(self, worker: Worker, *, queue: str, limit: int, lease_seconds: float | None = None,
              kinds: list[str] | None = None) -> list[Claim]: ...
    def renew_leases(self, worker: Worker, claims: list[Claim]) -> dict[int, datetime]: ...
    def complete(self, worker: Worker, claim: Claim, result: Any = None) -> None: ...
    def fail(self, worker: Worker, claim: Claim, error: str, *, retry: bool = True, block: bool = False,
             delay: float | None = None) -> Task: ...
    def release(self, worker: Worker, claim: Claim, reason: str = "released", *, started: bool = True) -> Task: ...
    def retry(self, worker: Worker, claim: Claim, after: float = 0.0, reason: str = "retry requested") -> Task: ...
    def begin_effect(self, worker: Worker, claim: Claim, action: str, key: str | None = None, *,
                     resource: str | None = None, effect: str | None = None,
                     args_digest: str | None = None) -> Effect: ...
    def finish_effect(self, worker: Worker, claim: Claim, effect: Effect, response: Any = None) -> Effect: ...
    def dependency_results(self, task_id: int) -> dict[int, Any]: ...
    def intend(self, worker: Worker, claim: Claim, kind: str, payload: Any = None, *, key: str,
               **options: Any) -> Task: ...


class BatchedTransport(Transport, Protocol):
    """A transport with ``capabilities.batched_completion``."""

    def complete_many(self, worker: Worker, done: Sequence[tuple[Claim, Any]]) -> set[int]: ...


class NativeTransport(BatchedTransport, Protocol):
    """A transport with ``capabilities.native_async`` (and batched completion)."""

    async def aclaim(self, worker: Worker, *, queue: str, limit: int, lease_seconds: float | None = None,
                     kinds: list[str] | None = None) -> list[Claim]: ...
    async def acomplete_many(self, worker: Worker, done: Sequence[tuple[Claim, Any]]) -> set[int]: ...
    async def abegin_effect(self, worker: Worker, claim: Claim, action: str, key: str | None = None, *,
                            resource: str | None = None, effect: str | None = None,
                            args_digest: str | None = None) -> Effect: ...
    async def afinish_effect(self, worker: Worker, claim: Claim, effect: Effect, response: Any = None) -> Effect: ...
    async def close_async(self) -> None: ...


class RefillingTransport(BatchedTransport, Protocol):
    """A transport with ``capabilities.claim_with_completion``."""

    def complete_and_claim(self, worker: Worker, done: Sequence[tuple[Claim, Any]], *, queue: str, limit: int,
                           lease_seconds: float | None = None,
                           kinds: list[str] | None = None) -> tuple[set[int], list[Claim]]: ...


class ListeningTransport(Transport, Protocol):
    """A transport with ``capabilities.listen_notify``."""

    def listener(self, queues: list[str]) -> Any: ...


class LongPollTransport(Transport, Protocol):
    """A transport with ``capabilities.long_poll``."""

    def claim(self, worker: Worker, *, queue: str, limit: int, lease_seconds: float | None = None,
              kinds: list[str] | None = None, wait: float = 0.0) -> list[Claim]: ...
    def interrupt_claims(self, worker: Worker) -> None: ...


class ReportingTransport(Transport, Protocol):
    """A transport with ``capabilities.loss_reports``."""

    def report_loss(self, worker: Worker, claim: Claim, reason: str) -> None: ...
