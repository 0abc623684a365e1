"""Operator actions taken for a principal: authorized, performed and audited together.

:func:`perform` authorizes one action of the table (:func:`leaseq.access.authorize`)
and calls its :class:`leaseq.Queue` method, which writes the audit entry in the
action's own transaction (so an action never happens without its entry);
:func:`perform_many` does so for each target of a bulk action.
:class:`QueueFacts` answers :func:`authorize`'s look-ups from the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import InvalidInput, LeaseqError, NotFound
from .actions import ACTIONS, Action
from .principals import Principal, _action, authorize, authorize_role
from .tokens import token_held_task, worker_token

if TYPE_CHECKING:  # pragma: no cover
    from ..queue import Queue


class QueueFacts:
    """:class:`Facts` read straight from the queue's database."""

    def __init__(self, q: Queue):
        self.q = q

    def worker_token(self, worker_id: str) -> str | None:
        return worker_token(self.q, worker_id)

    def token_held_task(self, token_id: str, task_id: int) -> bool:
        return token_held_task(self.q, token_id, task_id)

    def task_queue(self, task_id: int) -> str | None:
        return task_queue(self.q, task_id)


def task_queue(q: Queue, task_id: int) -> str | None:
    """The queue of task ``task_id``, or None if there is no such task."""
    try:
        return q.get(task_id).queue
    except NotFound:
        return None


def perform(q: Queue, principal: Principal, action: str, target: Any, *, via: str | None = None,
            **params: Any) -> Any:
    """Authorize and take an operator action; returns what its Queue method returns.

    ``target`` is the task id, queue name or worker id the action acts on;
    ``params`` are its fields (a field left out takes its default). The
    Queue method records ``principal.actor`` in the evidence trail and writes
    the audit row (with ``via``: "api", "dashboard", "cli") in the action's
    own transaction, so an action is never without its audit entry.
    """
    spec = _action(action)
    if not spec.operator:
        raise ValueError(f"{action!r} is not an operator action")
    authorize(principal, action, queue=target if spec.target == "queue" else None,
              task=target if spec.target == "task" else None, facts=QueueFacts(q))
    known = {f.name for f in spec.fields}
    for name in params:
        if name not in known:
            raise InvalidInput(name, "unknown field")
    for f in spec.fields:
        if f.name not in params:
            if f.required:
                raise InvalidInput(f.name, "required field is missing")
            params[f.name] = f.default
    if spec.decision:  # the token that asked for an approval may not decide it
        params["token_id"] = None if principal.local else principal.token_id
    return getattr(q, spec.method or "")(target, **params, by=principal.actor, via=via)


@dataclass(frozen=True)
class Outcome:
    """What one target of :func:`perform_many` came to: the method's return value, or the refusal."""

    target: Any
    result: Any = None
    error: LeaseqError | None = None


def perform_many(q: Queue, principal: Principal, action: str, targets: list[Any], *, via: str | None = None,
                 **params: Any) -> list[Outcome]:
    """Take a bulk action (``bulk=True`` in the table) on each target with the same fields.

    Each target goes through :func:`perform` on its own: authorized, acted on
    and audited in its own transaction, so one refusal (a task in the wrong
    status, say) is reported for that target and the others still happen.
    A principal whose role may not take the action at all is refused before
    any target is touched.
    """
    spec = _action(action)
    if not spec.bulk:
        raise ValueError(f"{action!r} is not a bulk action")
    authorize_role(principal, action)
    outcomes = []
    for target in targets:
        try:
            outcomes.append(Outcome(target, perform(q, principal, action, target, via=via, **dict(params))))
        except LeaseqError as exc:
            outcomes.append(Outcome(target, error=exc))
    return outcomes


def done_message(action: str, target: Any, **params: Any) -> str:
    """What happened, in the words of the action's table entry."""
    return _action(action).done.format_map(_Blank(target=target, **params))


class _Blank(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> str:
        return ""


def operator_actions(surface: str | None = None) -> list[Action]:
    """The operator actions in table order; ``surface`` "dashboard" or "cli" keeps those offered there."""
    return [a for a in ACTIONS.values() if a.operator and (surface is None or getattr(a, surface))]
