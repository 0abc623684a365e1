"""Exceptions raised by leaseq. Every one derives from :class:`LeaseqError`."""

from __future__ import annotations


class LeaseqError(Exception):
    """Base class for every error leaseq raises on purpose."""

    code = "error"


class LeaseLost(LeaseqError):
    """The caller no longer holds the lease it names.

    Raised by every guarded write (heartbeat, complete, fail, release,
    begin/finish effect) when the task is not ``running`` under this worker
    and this claim generation with a live lease. Nothing was changed.
    """

    code = "lease_lost"

    def __init__(self, task_id: int, generation: int, reason: str = "lease lost"):
        self.task_id = task_id
        self.generation = generation
        self.reason = reason
        super().__init__(f"task {task_id} generation {generation}: {reason}")


class InvalidInput(LeaseqError, ValueError):
    """A value given to leaseq is not acceptable. ``field`` names it."""

    code = "invalid"

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class NotFound(LeaseqError, LookupError):
    """The task (or other record) named does not exist."""

    code = "not_found"


class UnknownWorker(LeaseqError):
    """The worker was never registered with this queue, or was revoked."""

    code = "unknown_worker"


class InvalidTransition(LeaseqError):
    """The operation does not apply to the task in its current status."""

    code = "invalid_transition"


class QueuePaused(LeaseqError):
    """The queue's off-switch is on: no new actions may start."""

    code = "paused"


class ConfigError(LeaseqError):
    """The DSN or another setting cannot be used."""

    code = "config"


class BackendUnavailable(LeaseqError):
    """The database could not be reached."""

    code = "unavailable"


class StaleToken(LeaseqError):
    """A downstream write carried a fencing token older than one already accepted."""

    code = "stale_token"


class Permanent(LeaseqError):
    """Raise from a task handler to fail the attempt with no retry: the task goes to ``dead``."""

    code = "permanent"


class CredentialMissing(LeaseqError):
    """Raise from a task handler when a credential is missing or revoked: the task
    goes to ``blocked`` until an operator unblocks it (a new worker would not help)."""

    code = "credential_missing"
