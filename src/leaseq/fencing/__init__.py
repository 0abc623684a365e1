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
  one's". It names the task, the lease epoch and the claim generation of
  the attempt (``fx.fencing_token`` is ``"<task_id>.<epoch>.<generation>"``,
  or ``"<task_id>.<generation>"`` when the epoch is 0, as on SQLite);
  generations grow with every claim of one task, and the epoch grows when
  the queue's database fails over (docs: how-to/failover). The receiver
  remembers the newest (epoch, generation) it accepted per resource *and
  task* and refuses that task's older ones, so a worker that paused past
  its lease, or whose claim a failover lost, cannot overwrite the work of
  the one that recovered the task. Generations of different tasks
  are never compared: two tasks writing one record do not refuse each other.
- An **idempotency key** says "these retries are the same logical action".
  It stays the same across attempts (``fx.idempotency_key``), and the
  receiver stores the outcome of the first success under it and returns
  that outcome to every retry, so the action happens once.

What is here:

- :class:`FencedStore` (``apply``, ``newest_attempt``, ``outcome``): the
  fence and the idempotency records, atomic with writes made on its own
  connection; with ``lease_check=QueueLeaseCheck(...)`` it also asks the
  queue, in the same transaction, whether the attempt still holds its lease.
- :class:`FencingMiddleware`: the same rules for an ASGI service, from a
  ``Leaseq-Action-Token`` (required unless the loudly named
  ``insecure_trust_all_callers=True``), each guarded route's action declared
  in ``actions=`` (:class:`RouteActions`: a token for another action, a route
  with no declared action and a request naming no resource are refused,
  unless the route is in ``exempt=``); :func:`route_param` names resources
  from the app's own routes, one key per record.
- :class:`QueueVerifier`: the default check of an action token, online:
  the queue's database minted it (a reference, of which it keeps only the
  SHA-256) and answers whether it is genuine, in scope, and whether its
  attempt still holds a live lease, through a verifier role that can do
  nothing else. Lease authority stays separate from tool authority: a token
  authorises one action of one attempt, nothing else.
- :class:`ActionSigner` / :class:`ActionClaims`: the offline mode, HMAC
  tokens a service checks without reaching the queue; every key holder can
  mint one, and a superseded attempt's token is good until it expires, so
  the middleware warns (:class:`UnsafeOfflineTokens`) when it runs so.
"""

from ..core.errors import StaleToken
from .errors import IdempotencyKeyReused, InvalidActionToken
from .lease_check import LeaseCheck, QueueLeaseCheck
from .middleware import FenceGrant, FencingMiddleware, UnsafeAnyAction, UnsafeOfflineTokens, fence_grant
from .online import QueueVerifier
from .routes import RouteActions, RouteMatch, match_route, route_param
from .store import Attempt, FencedStore, StoredOutcome, fencing_token, parse_token
from .tokens import ActionClaims, ActionSigner

__all__ = [
    "ActionClaims", "ActionSigner", "Attempt", "FenceGrant", "FencedStore", "FencingMiddleware", "IdempotencyKeyReused",
    "InvalidActionToken", "LeaseCheck", "QueueLeaseCheck", "QueueVerifier", "RouteActions", "RouteMatch",
    "StaleToken", "StoredOutcome", "UnsafeAnyAction", "UnsafeOfflineTokens", "fence_grant", "fencing_token",
    "match_route", "parse_token", "route_param",
]
