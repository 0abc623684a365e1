"""One instance of each registered error class (tests/unit/test_errors.py, tests/service/test_error_round_trip.py)."""

from __future__ import annotations

from leaseq.core import errors
from leaseq.core.errors import LeaseqError

#: One instance of each registered class, as the code that raises it builds it.
SAMPLES: dict[type[LeaseqError], LeaseqError] = {
    errors.LeaseqError: errors.LeaseqError("something went wrong"),
    errors.LeaseLost: errors.LeaseLost(17, 3, "lease expired"),
    errors.InvalidInput: errors.InvalidInput("limit", "must be at least 1"),
    errors.BodyTooLarge: errors.BodyTooLarge("request body is larger than 10 bytes"),
    errors.NotFound: errors.NotFound("task 99 not found"),
    errors.UnknownWorker: errors.UnknownWorker("worker w-1 is not registered"),
    errors.InvalidTransition: errors.InvalidTransition("task 4 is completed"),
    errors.QueuePaused: errors.QueuePaused("queue 'default' is paused"),
    errors.ConfigError: errors.ConfigError("max_size: must be positive"),
    errors.BackendUnavailable: errors.BackendUnavailable("PostgreSQL: server closed the connection"),
    errors.StaleToken: errors.StaleToken("token 3 is older than 5"),
    errors.Permanent: errors.Permanent("bad payload"),
    errors.CredentialMissing: errors.CredentialMissing("no API key"),
    errors.AccessDenied: errors.AccessDenied("the viewer role cannot operate"),
    errors.Unauthorized: errors.Unauthorized("token revoked"),
    errors.RateLimited: errors.RateLimited("slow down", 2.5),
    errors.IdempotencyKeyReused: errors.IdempotencyKeyReused("k", "order:1", "order:2"),
    errors.IdempotencyKeyConflict: errors.IdempotencyKeyConflict(
        "doc-2", "default", 10, {"kind": "its kind is 'summarize', not 'send_welcome'", "payload": ""}),
    errors.ApprovalMismatch: errors.ApprovalMismatch(7, "v2:sha256:00"),
    errors.ApprovalExpired: errors.ApprovalExpired(7, "2030-01-31T09:00:00+00:00", "approve"),
    errors.ToolCallDiverged: errors.ToolCallDiverged("run-1:llm.chat:0"),
    errors.WaitTimedOut: errors.WaitTimedOut("approval"),
    errors.ChildFailed: errors.ChildFailed(12, "dead", "boom"),
    errors.BudgetSpent: errors.BudgetSpent(7, 2, {"key": "tokens", "budget": 10, "spent": 12, "owner": 3}),
}
