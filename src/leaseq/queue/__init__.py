"""Queue: the synchronous driver of the queue's operations.

Each operation is written once, without I/O, in :mod:`leaseq.engine` (where
it validates, which named statements it runs, what it decides); this class
runs them on the backend, blocking. :class:`leaseq.AsyncQueue` drives the
same operations on the event loop, with the same signatures. The lease
guard itself is in SQL (``sql/<dialect>/queries.sql``).

The methods that run an operation are written once, awaited, in the ``*_async``
modules (those of :class:`leaseq.AsyncQueue`); the blocking modules below are
generated from them (``python -m leaseq.queue.generate``, see :mod:`.generate`),
except :mod:`.base` and :mod:`.fences`, written by hand.

The class is assembled from one module per concern:

- :mod:`.base`: settings, the backend, running an operation, ``joined``
- :mod:`.leases`: claim, heartbeat, renew, complete, fail, retry, release,
  report a loss, sweep, intend (guarded by the lease)
- :mod:`.fences`: ``hold_attempt`` and ending a revoked worker's leases
- :mod:`.effects`: the action ledger (``begin_effect``, ``finish_effect``)
- :mod:`.children`: child tasks (``spawn``, ``wait_children``, guarded by the lease)
- :mod:`.enqueue`: adding tasks
- :mod:`.operator`: operator actions (cancel, reconcile, pause, limits,
  approvals, workers)
- :mod:`.reads`: tasks, events, stats, queues, workers, limits, ``wait``
- :mod:`.schema`: migrations and retention
"""

from __future__ import annotations

import os
from typing import Any

from ..engine.common import EVIDENCE_LEVELS, ROUTINE_EVENTS
from ..engine.enqueue import ENQUEUE_CHUNK
from ..engine.expiry import ROUTE_BATCH
from ..store import open_store
from .children import ChildOps
from .effects import EffectOps
from .enqueue import EnqueueOps
from .fences import FenceOps
from .leases import LeaseOps
from .operator import OperatorOps
from .reads import ReadOps
from .schema import SchemaOps

__all__ = ["ENQUEUE_CHUNK", "EVIDENCE_LEVELS", "ROUTE_BATCH", "ROUTINE_EVENTS", "Queue", "connect"]


class Queue(ReadOps, OperatorOps, ChildOps, EffectOps, LeaseOps, FenceOps, EnqueueOps, SchemaOps):
    """A leaseq queue on one database. Thread-safe; share one per process.

    Create it with :func:`leaseq.connect`. Worker-side calls (``claim``,
    ``heartbeat``, ``complete``, ``fail``, ``begin_effect``...) are guarded
    by the lease; operator calls (``cancel``, ``reconcile``...) are not.
    """

    # The bases are listed last concern first: the reference lists inherited
    # methods from the last base to the first (set-up, schema, enqueue, leases,
    # effects, operator actions, reads).


def connect(dsn: str | None = None, **options: Any) -> Queue:
    """Open a queue. ``dsn``: ``postgresql://…`` or ``sqlite:///path.db``; by
    default ``$LEASEQ_DSN``, else ``sqlite:///leaseq.db`` in the current folder.

    ``signer`` (an :class:`leaseq.fencing.ActionSigner`) makes every effect
    carry a signed action token; by default one is built from
    ``$LEASEQ_ACTION_KEYS`` when that is set. ``evidence="compact"`` keeps the
    routine events' detail out of the trail (see :class:`Queue`). ``max_snoozes``
    (default 100) bounds the retries on request (:class:`leaseq.Retry`) of
    one task; ``max_same_error`` the same error in a row. Other options
    go to the backend (e.g. ``max_size`` of the PostgreSQL pool)."""
    settings = {name: options.pop(name) for name in ("max_same_error", "max_snoozes", "signer", "action_token_ttl",
                                                   "evidence")
                if name in options}
    if "signer" not in settings and os.environ.get("LEASEQ_ACTION_KEYS"):
        # Imported here: the fencing kit pulls in the ASGI stack, which most
        # queue users (and every CLI call) do not need.
        from ..fencing.tokens import ActionSigner

        settings["signer"] = ActionSigner.from_env()
    return Queue(open_store(dsn, **options), **settings)
