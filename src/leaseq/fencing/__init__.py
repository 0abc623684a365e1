"""The downstream fencing kit: let the receiving system refuse a stale worker.

A lease stops a stale worker inside the queue, but not a request it already
sent, or one it sends after waking from a pause. Only the system receiving
the write can refuse that, and this kit gives it the means. It needs none of
the rest of leaseq: a downstream service installs leaseq for this package
alone and keeps the kit's two tables (``leaseq_fence_*``) in its own
PostgreSQL or SQLite database.

Fencing and idempotency answer different questions; use both when a task
can be retried and reassigned:

- A **fencing token** says "this worker's authority is newer than that
  one's". It is the claim generation of the attempt (``fx.fencing_token``),
  growing with every claim of the task. The receiver remembers the newest
  token it accepted per resource and refuses anything older, so a worker
  that paused past its lease cannot overwrite the work of the one that
  recovered the task. Tokens of different tasks are not ordered against
  each other: name resources so that one task's attempts contend for them.
- An **idempotency key** says "these retries are the same logical action".
  It stays the same across attempts (``fx.idempotency_key``), and the
  receiver stores the outcome of the first success under it and returns
  that outcome to every retry, so the action happens once.

What is here:

- :class:`FencedStore` (``apply``, ``newest_token``, ``outcome``): the
  fence and the idempotency records, atomic with writes made on its own
  connection.
- :class:`FencingMiddleware`: the same rules for an ASGI service, from the
  ``Leaseq-Fencing-Token`` and ``Idempotency-Key`` headers.
- :class:`ActionSigner` / :class:`ActionClaims`: signed action tokens, so a
  service can check without a database that a request comes from the
  queue and is scoped to one action of one attempt. Lease authority stays
  separate from tool authority: a token authorises that action, nothing else.
"""

from ..core.errors import StaleToken
from .errors import IdempotencyKeyReused, InvalidActionToken
from .middleware import FenceGrant, FencingMiddleware, fence_grant
from .store import FencedStore, StoredOutcome
from .tokens import ActionClaims, ActionSigner

__all__ = [
    "ActionClaims", "ActionSigner", "FenceGrant", "FencedStore", "FencingMiddleware", "IdempotencyKeyReused",
    "InvalidActionToken", "StaleToken", "StoredOutcome", "fence_grant",
]
