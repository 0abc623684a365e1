"""Flow control at enqueue: singletons and debounce, decided in the database.

Both take the key's lock first (``flow_lock``: an upsert of the key's row in
``leaseq_flow_keys``, held until the transaction ends), then read the key's
tasks in a later statement, so concurrent enqueues of one key are decided
one after the other, each seeing what the one before it committed, on both
backends and through every transport.

**Singletons** (``enqueue(..., singleton_key=..., on_conflict=...)``): at
most one unfinished task per key in a queue. When one holds the key:

- ``skip`` (the default): nothing is written; the enqueue returns the task
  that holds the key, with ``enqueue_outcome == "skipped"`` (a
  ``singleton_skipped`` event on it records the skipped enqueue);
- ``cancel_running``: the tasks that hold the key are cancelled as
  :meth:`leaseq.Queue.cancel` cancels (their leases cleared: a holder's next
  guarded write is refused; limit slots given back; their waiters move on;
  a ``cancelled`` event naming the new task), and the new task is enqueued;
- ``queue``: one task may wait behind a running one. If the key's tasks are
  all running, the new task is enqueued; if one has not started, the enqueue
  returns it (``skipped``). At most one queued and one running.

The claim hands out a task with a singleton key only when no other task with
its key is running and no older one is queued: never two running.

**Debounce** (``enqueue(..., debounce=seconds, key=..., debounce_mode=...,
max_delay=...)``): repeated enqueues of a key inside the window collapse into
one task (``enqueue_outcome == "collapsed"``, a ``debounced`` event on it):

- ``trailing`` (the default): the first enqueue makes a task that runs
  ``debounce`` seconds later; each later one, while that task has not
  started, replaces its payload (the last one wins) and moves its run to
  ``debounce`` seconds from now, never past ``max_delay`` seconds after the
  first. Once it has started, the next enqueue makes a new task;
- ``leading``: the first enqueue's task runs at once; later ones within
  ``debounce`` seconds of it are dropped, answered with it.
"""

from __future__ import annotations

from typing import Any

from ..core import checks
from ..core.errors import InvalidInput
from ..core.model import Status
from . import limits
from .common import Settings, acting, event_params
from .dependencies import settle_dependents
from .steps import Op, one, rows

#: What a singleton enqueue does when its key is held.
ON_CONFLICT = ("skip", "cancel_running", "queue")
#: How a debounced enqueue collapses.
DEBOUNCE_MODES = ("trailing", "leading")
#: The longest debounce window and maximum delay: ten years.
LONGEST = 10 * 365 * 86400.0


def check_flow(*, singleton_key: Any, on_conflict: Any, debounce: Any, key: Any, debounce_mode: Any,
               max_delay: Any, idempotency_key: Any, delay: Any, approval: Any, after: Any) -> dict[str, Any]:
    """The flow-control parameters of an enqueue, checked (InvalidInput names the field)."""
    out: dict[str, Any] = dict(singleton_key=None, on_conflict="skip", debounce=None, debounce_key=None,
                               debounce_mode="trailing", max_delay=None)
    if not isinstance(on_conflict, str) or on_conflict not in ON_CONFLICT:
        raise InvalidInput("on_conflict", f"must be one of {', '.join(ON_CONFLICT)} (got {on_conflict!r})")
    if not isinstance(debounce_mode, str) or debounce_mode not in DEBOUNCE_MODES:
        raise InvalidInput("debounce_mode", f"must be one of {', '.join(DEBOUNCE_MODES)} (got {debounce_mode!r})")
    if singleton_key is not None:
        out["singleton_key"] = checks.check_key("singleton_key", singleton_key)
        out["on_conflict"] = on_conflict
    elif on_conflict != "skip":
        raise InvalidInput("on_conflict", "applies to a singleton: give singleton_key with it")
    if debounce is None:
        for name, value, default in (("key", key, None), ("debounce_mode", debounce_mode, "trailing"),
                                     ("max_delay", max_delay, None)):
            if value != default:
                raise InvalidInput(name, "applies to a debounced enqueue: give debounce (seconds) with it")
    else:
        out["debounce"] = checks.check_seconds("debounce", debounce, allow_zero=False, maximum=LONGEST)
        if key is None:
            raise InvalidInput("key", "a debounced enqueue needs a key: the enqueues with one key collapse")
        out["debounce_key"] = checks.check_key("key", key)
        out["debounce_mode"] = debounce_mode
        if max_delay is not None:
            if debounce_mode == "leading":
                raise InvalidInput("max_delay", "applies to trailing debounce (a leading one runs at once)")
            out["max_delay"] = checks.check_seconds("max_delay", max_delay, allow_zero=False, maximum=LONGEST)
        if singleton_key is not None:
            raise InvalidInput("debounce", "cannot be combined with singleton_key: pick one")
        if idempotency_key is not None:
            raise InvalidInput("idempotency_key", "cannot be combined with debounce: the debounce key names "
                                                  "the task enqueues collapse into")
        if delay not in (0, 0.0):
            raise InvalidInput("delay", "cannot be combined with debounce: the window sets when it runs")
    if out["singleton_key"] is not None or out["debounce"] is not None:
        what = "singleton_key" if out["singleton_key"] is not None else "debounce"
        if approval is not None:
            raise InvalidInput("approval", f"cannot be combined with {what}")
        if after:
            raise InvalidInput("after", f"cannot be combined with {what}")
    return out


def singleton(s: Settings, params: dict[str, Any], on_conflict: str,
              by: str | None) -> Op[tuple[dict[str, Any] | None, str]]:
    """Enqueue ``params`` (insert_task's, with its singleton_key) under the key's lock, in the
    open transaction. Returns the row that answers the enqueue and the outcome: ``created``,
    ``existing`` (its idempotency key named a task), ``skipped``."""
    queue, key = params["queue"], params["singleton_key"]
    yield rows("flow_lock", scope="singleton", queue=queue, key=key)
    holders: list[dict[str, Any]] = list((yield rows("singleton_holders", queue=queue, singleton_key=key)))
    if holders and on_conflict == "skip":
        return (yield from _skipped(s, holders[-1], key, on_conflict, by))
    if on_conflict == "queue":
        waiting = [h for h in holders if h["status"] != Status.RUNNING.value]
        if waiting:
            return (yield from _skipped(s, waiting[-1], key, on_conflict, by))
    ended: list[dict[str, Any]] = []
    if holders and on_conflict == "cancel_running":
        reason = f"cancelled: replaced by a newer enqueue with singleton key {key!r}"
        ended = list((yield rows("cancel_singleton", holder_ids=[h["id"] for h in holders], queue=queue,
                                 singleton_key=key, reason=reason)))
    row = yield one("insert_task", **params)
    if row is None:  # its idempotency key names a task: the caller reads it
        if ended:
            raise InvalidInput("idempotency_key", "names a task already: a replacing enqueue makes a new one")
        return None, "existing"
    if ended:
        yield from _cancelled(s, holders, ended, key, row["id"], by)
    return row, "created"


def _skipped(s: Settings, holder: dict[str, Any], key: str, on_conflict: str,
             by: str | None) -> Op[tuple[dict[str, Any], str]]:
    detail = dict(singleton_key=key, on_conflict=on_conflict, by=by)
    yield rows("flow_event", type="singleton_skipped", holder_id=holder["id"], queue=holder["queue"], key=key,
               detail=detail)
    return holder, "skipped"


def _cancelled(s: Settings, holders: list[dict[str, Any]], ended: list[dict[str, Any]], key: str, new_id: int,
               by: str | None) -> Op[None]:
    """What :func:`leaseq.engine.operator.cancel` does after its update, for the tasks a
    ``cancel_running`` enqueue cancelled: limit slots back, events, waiters moved on."""
    actor, via = yield from acting(by, "enqueue")
    before = {h["id"]: h for h in holders}
    done = [before[r["id"]] for r in ended]
    yield from limits.release(s, [h for h in done if h["status"] == Status.RUNNING.value])
    events = []
    for h in done:
        detail: dict[str, Any] = dict(by=actor, reason=f"replaced by task {new_id} (singleton key {key!r})",
                                      previous_status=h["status"], singleton_key=key, replaced_by=new_id)
        if h["status"] == Status.RUNNING.value:
            detail["revoked_lease_of"] = h["lease_owner"]
            detail["open_intents"] = h["open_effects"]
        events.append(event_params(s, h["id"], "cancelled", h["claim_generation"] or None, None, **detail))
    yield rows("insert_events", events=events)
    yield from settle_dependents(s, [h["id"] for h in done])


def debounced(s: Settings, params: dict[str, Any], flow: dict[str, Any],
              by: str | None) -> Op[tuple[dict[str, Any] | None, str]]:
    """Enqueue ``params`` (insert_task's, with its debounce_key; ``delay`` is set here) under the
    key's lock, in the open transaction. Returns the answering row and ``created`` or ``collapsed``."""
    queue, key, window = params["queue"], params["debounce_key"], flow["debounce"]
    trailing = flow["debounce_mode"] == "trailing"
    max_delay = LONGEST if flow["max_delay"] is None else flow["max_delay"]
    yield rows("flow_lock", scope="debounce", queue=queue, key=key)
    holder = yield one("debounce_holder", queue=queue, debounce_key=key, window_seconds=window)
    if holder is not None and trailing and holder["pending"]:
        row = yield one("debounce_task", holder_id=holder["id"], queue=queue, debounce_key=key,
                        payload=params["payload"], window_seconds=window, max_delay=max_delay)
        if row is not None:
            yield rows("flow_event", type="debounced", holder_id=row["id"], queue=queue, key=key,
                       detail=dict(debounce_key=key, mode="trailing", by=by, payload_replaced=True))
            return dict(row), "collapsed"
    if holder is not None and not trailing and holder["recent"]:
        yield rows("flow_event", type="debounced", holder_id=holder["id"], queue=queue, key=key,
                   detail=dict(debounce_key=key, mode="leading", by=by, dropped=True))
        return dict(holder), "collapsed"
    params["delay"] = min(window, max_delay) if trailing else 0.0
    row = yield one("insert_task", **params)
    return row, "created"
