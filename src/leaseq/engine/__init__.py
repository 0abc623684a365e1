"""Each queue operation, written once and free of I/O.

An operation is a generator (see :mod:`.steps`): it validates its input,
yields the named statements it needs, decides between their answers, and
returns its result. :class:`leaseq.Queue` drives it synchronously,
:class:`leaseq.AsyncQueue` on the event loop (:mod:`.drive`). Where each
operation lives:

- :mod:`.leases`: claim, renew, complete many, report a loss
- :mod:`.endings`: how an attempt ends (complete, fail, retry, release), one attempt or a batch
- :mod:`.expiry`: leases that end without their holder: routing by the recovery policy, the sweep
- :mod:`.effects`: begin and finish an effect, the action ledger
- :mod:`.durable`: durable waits (a handler's sleep and signal wait) and signals
- :mod:`.streams`: task progress streams (a handler's emit, reading a stream after a cursor)
- :mod:`.asks`: questions put to a person (``ctx.ask``) and their answers
- :mod:`.budgets`: usage settled after the call (``ctx.consume``), task budgets, spend per day
- :mod:`.enqueue`: enqueue one task or many
- :mod:`.approvals`: approval gates: request, approve, deny, deadlines
- :mod:`.intents`: intents a task records for an executor
- :mod:`.replay`: a retried handler that diverged from its recorded run (code changes under replay)
- :mod:`.children`: child tasks a handler spawns and waits for, and cancel trees
- :mod:`.dependencies`: tasks that wait for others, and moving them on when those end
- :mod:`.waits`: what waiting for a task's end returns on
- :mod:`.operator`: workers in and out, cancel, reconcile, unblock, requeue, pause
- :mod:`.limits`: limits shared by every worker, their usage and slots
- :mod:`.reads`: tasks, events, workers, queues, stats, the database clock
- :mod:`.schema`: migrations and retention
"""

from . import (approvals, asks, budgets, children, dependencies, durable, effects, endings, enqueue, expiry, intents,
               leases, limits, operator, reads, replay, schema, streams, waits)
from .common import Settings
from .drive import adrive, adrive_in, drive, drive_in

__all__ = ["Settings", "adrive", "adrive_in", "approvals", "asks", "budgets", "children", "dependencies", "drive",
           "durable", "drive_in", "effects", "endings", "enqueue", "expiry", "intents", "leases", "limits", "operator", "reads",
           "replay", "schema", "streams", "waits"]
