"""Access control: who is calling, what they may do, and their tokens.

Roles, each a fixed set of rights (:data:`RIGHTS`):

* ``worker``: register workers and hold their leases on its queues (a worker
  token is limited to named queues unless created with ``all_queues=True``);
  enqueue; read only the tasks its own workers have held a lease on;
* ``viewer``: read tasks, events and stats; payloads, results, errors and
  free-text reasons and notes are redacted unless the token has
  ``read_payloads``;
* ``operator``: a viewer that can also cancel, reconcile, unblock, requeue,
  pause and resume, revoke workers, and enqueue;
* ``admin``: an operator that can also manage tokens and retention.

A worker, viewer or operator token may be limited to named queues
(``queues=``): it reads, enqueues, claims and acts on those queues only, and
is refused what spans every queue (the overview, limits, revoking a worker).
Worker tokens must say which: ``queues=`` or the explicit ``all_queues=True``.
An admin token manages tokens, so it is never limited.

The intent/executor split: a token may record an intent that runs without a
person's approval only on a queue it may not claim from, so an agent never
executes its own proposals, unless it was created with ``own_intents=True``.

Where each part lives, each importing only those before it:

- :mod:`.actions`: the roles and the table of actions (:data:`ACTIONS`)
- :mod:`.principals`: :class:`Principal`, the one :func:`authorize` and :func:`can`
- :mod:`.tokens`: tokens and dashboard sessions; the token check, creating and revoking a
  token are engine operations (``verifying``, ``creating_token``, ``revoking_token``), driven
  blocking by the functions beside them or awaited with :func:`leaseq.engine.adrive`
- :mod:`.operator`: operator actions, authorized and audited (:func:`perform`)

The HTTP pieces (bearer tokens, rate limits, the FastAPI dependencies) are
:mod:`leaseq.service.access`: they need the web framework, which the service
layer owns, and they decide nothing: they call :func:`authorize`.
"""

from ..core.errors import AccessDenied, RateLimited, Unauthorized
from .actions import ACTIONS, DEFAULT_READ_PAYLOADS, RIGHTS, ROLES, Action, Field
from .operator import Outcome, QueueFacts, done_message, operator_actions, perform, perform_many, task_queue
from .principals import (Facts, Principal, authorize, authorize_intent, authorize_role, authorize_spawn,
                         authorize_upstreams, can, local_principal, readable_queues, readable_upstreams)
from .tokens import (MAX_SESSION_SECONDS, acheck_token, audit_log, averify_token, check_token, create_session,
                     create_token, creating_token, end_session, hash_token, list_tokens, record_action, revoke_token,
                     revoke_worker_token, revoking_token, session_hash, token_check, token_hashes, token_held_task, token_id_of,
                     verify_session, verify_token, verifying, worker_token)

__all__ = ["ACTIONS", "AccessDenied", "Action", "DEFAULT_READ_PAYLOADS", "Facts", "Field", "MAX_SESSION_SECONDS",
           "Outcome", "Principal", "QueueFacts", "RIGHTS", "ROLES", "RateLimited", "Unauthorized", "acheck_token",
           "audit_log", "authorize", "authorize_intent", "authorize_role", "authorize_spawn", "authorize_upstreams",
           "averify_token", "can", "check_token", "create_session", "create_token", "creating_token", "done_message", "end_session",
           "hash_token", "list_tokens", "local_principal", "operator_actions", "perform", "perform_many",
           "readable_queues", "readable_upstreams", "record_action", "revoke_token", "revoke_worker_token", "revoking_token",
           "session_hash", "task_queue", "token_check", "token_hashes", "token_held_task", "token_id_of",
           "verify_session", "verify_token", "verifying", "worker_token"]
