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
from datetime import datetime
from typing import Any, Protocol

from ..core.capabilities import Capabilities
from ..core.model import Claim, Effect, Task, Worker

__all__ = ["Capabilities", "Transport"]


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
    def sleep(self, worker: Worker, claim: Claim, key: str, *, seconds: float | None = None,
              until: Any = None) -> dict[str, Any]: ...
    def wait_signal(self, worker: Worker, claim: Claim, key: str, name: str, *,
                    timeout: float | None = None) -> dict[str, Any]: ...
    def intend(self, worker: Worker, claim: Claim, kind: str, payload: Any = None, *, key: str,
               **options: Any) -> Task: ...
    def consume(self, worker: Worker, claim: Claim, key: str, limit_key: str, units: int) -> dict[str, Any]: ...


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
    async def asleep(self, worker: Worker, claim: Claim, key: str, *, seconds: float | None = None,
                     until: Any = None) -> dict[str, Any]: ...
    async def await_signal(self, worker: Worker, claim: Claim, key: str, name: str, *,
                           timeout: float | None = None) -> dict[str, Any]: ...
    async def aconsume(self, worker: Worker, claim: Claim, key: str, limit_key: str,
                       units: int) -> dict[str, Any]: ...
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
