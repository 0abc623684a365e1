"""Who is calling, and the one place access is decided.

A :class:`Principal` is a verified token's identity, role and scope (or the
local command line's). :func:`authorize` allows it an action of the table
(:data:`leaseq.access.actions.ACTIONS`) on what the request names, or raises
:class:`AccessDenied`; :func:`can` answers whether its role may take an
action at all (what a page offers). Every API route, dashboard page and form,
and CLI operator command asks these two, and nothing else decides access.
The intent/executor split (:func:`authorize_intent`), a child's queue
(:func:`authorize_spawn`) and the upstreams a task may wait for
(:func:`authorize_upstreams`) are the request-specific rules beside them.
"""

from __future__ import annotations

import getpass
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from ..core.errors import AccessDenied
from ..engine.dependencies import no_such_upstream
from .actions import ACTIONS, RIGHTS, Action


@dataclass(frozen=True)
class Principal:
    """Who is calling: the verified token's identity, role and scope."""

    token_id: str
    name: str
    role: str
    queues: frozenset[str] | None
    read_payloads: bool
    expires_at: datetime | None = None
    #: may record intents that run without approval on queues it may claim from itself
    own_intents: bool = False
    #: True for the local command line (database credentials, no token): acts as ``name``.
    local: bool = False

    @property
    def actor(self) -> str:
        """The identity written into events and the audit log."""
        return self.name if self.local else f"{self.name} ({self.role} token {self.token_id})"

    def can(self, action: str) -> bool:
        """True if the role may take ``action`` (a name in :data:`ACTIONS`) at all: :func:`can`."""
        return can(self, action)

    def may_use_queue(self, queue: str) -> bool:
        """True unless the token is limited to queues that exclude ``queue``."""
        return self.queues is None or queue in self.queues


class Facts(Protocol):
    """What :func:`authorize` may need to look up (the service caches these)."""

    def worker_token(self, worker_id: str) -> str | None:
        """The id of the token that registered ``worker_id`` (None: none did, or no such worker)."""

    def token_held_task(self, token_id: str, task_id: int) -> bool:
        """Whether a worker of ``token_id`` holds or has held a lease on ``task_id``."""

    def task_queue(self, task_id: int) -> str | None:
        """The queue of task ``task_id`` (None: no such task)."""


def _action(name: str) -> Action:
    spec = ACTIONS.get(name)
    if spec is None:
        raise ValueError(f"unknown action {name!r}")
    return spec


def _role_allows(principal: Principal, spec: Action) -> bool:
    return ((spec.right is None or spec.right in RIGHTS.get(principal.role, frozenset()))
            and (not spec.sees_payload or principal.read_payloads))


def _offered(principal: Principal, spec: Action) -> bool:
    """Whether ``principal`` may take ``spec`` at all: its role, and its scope for what spans every queue."""
    return _role_allows(principal, spec) and not (spec.every_queue and principal.queues is not None)


def can(principal: Principal, action: str) -> bool:
    """True if ``principal``'s role may take ``action`` (a name in :data:`ACTIONS`) at all.

    Scope (queues, own workers, held tasks) is checked by :func:`authorize` for a
    concrete request; this answers "should the page offer it?". The same rules as
    :func:`authorize_role`, which raises where this answers False."""
    return _offered(principal, _action(action))


def _limited(principal: Principal) -> str:
    return f"this token is limited to queues {', '.join(sorted(principal.queues or ()))}"


def authorize_role(principal: Principal, action: str) -> Action:
    """The part of :func:`authorize` a request's target does not change (its role, and a
    queue-limited token's refusal of what spans every queue), for a check made before the
    targets are known (a bulk action, a dashboard form); each target is then authorized in
    full. Raises :class:`AccessDenied`."""
    spec = _action(action)
    if spec.sees_payload and not principal.read_payloads:
        raise AccessDenied(f"this token may not read payloads, so it cannot {spec.summary}: a decision is bound "
                           "to a payload its maker has seen")
    if spec.every_queue and principal.queues is not None:
        raise AccessDenied(f"{_limited(principal)}, so it cannot {spec.summary} (that spans every queue)")
    if not _role_allows(principal, spec) and not (spec.lease_holders and "work" in RIGHTS.get(principal.role, ())):
        raise AccessDenied(f"the {principal.role} role cannot {spec.summary}")
    return spec


def authorize(principal: Principal, action: str, *, queue: str | None = None, worker_id: str | None = None,
              task: int | None = None, facts: Facts | None = None) -> Action:
    """Allow ``principal`` to take ``action`` on what the request names, or raise :class:`AccessDenied`.

    ``queue``: the queue the request names (actions with ``queue_scope``);
    ``worker_id``: the worker it acts as (``own_worker``); ``task``: the task
    it reads or acts on (``lease_holders``, ``task_scope``: needed for a
    worker or queue-limited token); ``facts`` looks up worker and lease
    links and a task's queue.
    The only place access is decided. Returns the action's table entry.
    """
    spec = authorize_role(principal, action)
    if not _role_allows(principal, spec):  # a worker token reading a task (authorize_role let it through)
        if task is None or facts is None:
            raise TypeError(f"authorize({action!r}) for a worker token needs task= and facts=")
        # A worker token reads the tasks its own workers hold or have held, and no others
        # (whether another task exists is not its business either).
        if principal.local or not facts.token_held_task(principal.token_id, task):
            raise AccessDenied(f"a worker token may read only the tasks its own workers have held a lease on "
                               f"(not task {task})")
    elif spec.task_scope and principal.queues is not None:
        if task is None or facts is None:
            raise TypeError(f"authorize({action!r}) for a queue-limited token needs task= and facts=")
        # A task on another queue is refused exactly as one that does not exist: whether it
        # exists is not this token's business.
        queue_of = facts.task_queue(task)
        if queue_of is None or not principal.may_use_queue(queue_of):
            raise AccessDenied(f"{_limited(principal)}, and task {task} is not on them (or does not exist)")
    if spec.queue_scope:
        if queue is None:
            raise TypeError(f"authorize({action!r}) needs queue=")
        if not principal.may_use_queue(queue):
            raise AccessDenied(f"this token may not use queue {queue!r} ({_limited(principal)})")
    if spec.own_worker:
        if worker_id is None or facts is None:
            raise TypeError(f"authorize({action!r}) needs worker_id= and facts=")
        owner = facts.worker_token(worker_id)
        if owner is None or principal.local or not hmac.compare_digest(owner, principal.token_id):
            raise AccessDenied(f"worker {worker_id!r} was not registered with this token")
    return spec


def authorize_intent(principal: Principal, queue: str, approval: str | None) -> None:
    """Allow ``principal`` (already allowed ``intend`` for its worker) to record an intent on ``queue``.

    The intent/executor split: an intent is written for an executor pool,
    and the token that proposes it must not be the one that performs it. An
    intent gated by ``approval="required"`` may go to any queue: a person
    decides before anything runs. An ungated one runs as soon as a worker
    claims it, so it is refused on a queue the token may not use (that would
    be an enqueue outside its queues) and on a queue it may claim from
    itself (it would execute its own proposal), unless the token was created
    with ``own_intents=True``. In short, without that opt-in every intent of
    a token waits for a person.
    """
    if approval == "required":
        return
    if not principal.may_use_queue(queue):
        raise AccessDenied(f"this token may record an intent on queue {queue!r}, outside its queues, only with "
                           "approval='required'")
    if not principal.own_intents:
        raise AccessDenied(f"this token may claim from queue {queue!r} itself, so an intent it records there needs "
                           "approval='required' (the intent/executor split; a token created with own_intents "
                           "may execute its own intents)")


def authorize_spawn(principal: Principal, queue: str) -> None:
    """Allow ``principal`` (already allowed ``spawn`` for its worker) to spawn a child task on
    ``queue``: a child is an enqueue, so only on a queue the token may use (a child on the
    spawning task's own queue, the default, is always within it)."""
    if not principal.may_use_queue(queue):
        raise AccessDenied(f"this token may not spawn a child task on queue {queue!r}, outside its queues")


def authorize_upstreams(principal: Principal, after: list[int], queues: Mapping[int, str]) -> None:
    """Allow ``principal`` to make a task wait for the tasks of ``after`` (checked ids, in order),
    ``queues`` naming the queue of each that exists; raise otherwise.

    A token limited to some queues may name only tasks on those queues: waiting for
    a task is reading its result (:func:`readable_upstreams`). Any other is refused
    exactly as a task that does not exist would be, so the refusal tells it nothing
    (:func:`leaseq.engine.dependencies.no_such_upstream`)."""
    for upstream in after:
        queue = queues.get(upstream)
        if queue is None:
            return  # the enqueue itself refuses the first task that does not exist
        if not principal.may_use_queue(queue):
            raise no_such_upstream(upstream)


def readable_queues(principal: Principal, queue: str | None) -> list[str] | None:
    """The queues a listing for ``principal`` may show: None for every queue (an unlimited
    token asking for none), else the queues to read, ``[queue]`` when one was asked for.
    A queue-limited token asking for another queue is refused (:class:`AccessDenied`)."""
    authorize(principal, "read_queues")
    if principal.queues is None:
        return None if queue is None else [queue]
    if queue is None:
        return sorted(principal.queues)
    if not principal.may_use_queue(queue):
        raise AccessDenied(f"this token may not use queue {queue!r} ({_limited(principal)})")
    return [queue]


def readable_upstreams(principal: Principal, queues: Mapping[int, str]) -> set[int]:
    """Of the upstream tasks in ``queues`` (id: its queue), those whose results ``principal`` may
    read through a task that waits for them: a token limited to some queues, those on its queues."""
    return {upstream for upstream, queue in queues.items() if principal.may_use_queue(queue)}


def local_principal() -> Principal:
    """The principal of the local command line: database access means every right; acts as ``cli:<user>``."""
    try:
        user = getpass.getuser()
    except Exception:  # pragma: no cover - no user database in some containers
        user = "unknown"
    return Principal(token_id="", name=f"cli:{user}", role="admin", queues=None, read_payloads=True, local=True)
