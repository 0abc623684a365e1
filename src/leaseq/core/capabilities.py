"""What a worker transport declares it can do (:class:`Capabilities`).

It lives in the core, beneath every layer that declares it (the direct queue,
the HTTP client) and the worker runtime that reads it;
:mod:`leaseq.worker.transport` names it beside the port it describes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    """What a transport offers beyond the calls every transport has.

    Each flag promises the calls it names; the defaults describe the smallest
    transport (one call per outcome, polling). Every call of the port is
    awaited (:class:`leaseq.worker.transport.Transport`), whatever the flags.
    """

    #: ``complete_many(worker, [(claim, result), ...]) -> set[task_id]`` finishes
    #: many tasks in one guarded statement.
    batched_completion: bool = False
    #: ``await listener(queues)`` gives a waiter (``await wait(timeout)``) woken
    #: when work is enqueued, so an idle worker need not poll often.
    listen_notify: bool = False
    #: ``report_loss(worker, claim, reason)`` adds the worker's account of a
    #: lost lease to the evidence trail.
    loss_reports: bool = False
    #: the backend runs one write at a time: a second claim in flight beside the
    #: claim loop's would only wait for the lock.
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
