"""Deprecated: the table of actions and :func:`authorize` live in :mod:`leaseq.access`
(this module re-exports them).

Import from :mod:`leaseq.access` instead; these names stay importable from here.
"""

from .access.actions import ACTIONS as ACTIONS, Action as Action, Field as Field
from .access.operator import (Outcome as Outcome, QueueFacts as QueueFacts, done_message as done_message,
                             operator_actions as operator_actions, perform as perform, perform_many as perform_many,
                             task_queue as task_queue)
from .access.principals import (Facts as Facts, authorize as authorize, authorize_intent as authorize_intent,
                                authorize_role as authorize_role, authorize_spawn as authorize_spawn,
                                authorize_upstreams as authorize_upstreams, can as can,
                                local_principal as local_principal, readable_queues as readable_queues,
                                readable_upstreams as readable_upstreams)
