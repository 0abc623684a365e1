"""How an attempt ends: complete, fail, retry or release, one operation (:func:`end_attempts`).

Each :class:`Ending` names an attempt (an :class:`~leaseq.core.model.AttemptRef`,
or the :class:`~leaseq.core.model.Claim` that holds it) and its outcome, with
that outcome's fields. :func:`end_attempts` ends a batch of them: every item
is checked before anything is written (bad input names its field and changes
nothing), the completions run as one statement (:func:`.leases.complete_many`'s),
and each failure, retry and release as its own guarded statement, in order.
A lease the guard refuses is left out of the answer (``refused``) and the
others go through. ``Queue.complete``, ``fail``, ``retry`` and ``release`` are
a batch of one that raises :class:`LeaseLost` when refused; the service's
``POST /v1/workers/{id}/end`` is the batch.

A refused failure, retry or release commits its (empty) transaction before
the next item begins: the guard wrote nothing, and a caller's joined
transaction (the service's) goes on.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ..core import checks
from ..core.errors import InvalidInput, LeaseLost
from ..core.model import OUTCOMES, AttemptRef, Ended, Ending, Held, Status, Task, Worker
from ..core.retry import MAX_RETRY_SECONDS
from . import limits
from .common import Settings, check_claim, event, heartbeats, to_task, worker_id
from .dependencies import FAILED_ENDS, settle_dependents
from .expiry import route
from .leases import complete_many
from .steps import BEGIN, COMMIT, Op, one

#: The longest delay a failure may ask for.
MAX_DELAY = 10 * 365 * 86400.0
#: Most attempts one call of :func:`end_attempts` may end.
MAX_ENDINGS = 1000


#: Each outcome's own fields, and their values when left out (what may not be set otherwise).
_FIELDS: dict[str, dict[str, Any]] = {
    "complete": {"result": None},
    "fail": {"error": None, "retry": True, "block": False, "delay": None},
    "retry": {"after": 0.0, "reason": None},
    "release": {"reason": None, "started": True},
}
_DEFAULTS: dict[str, Any] = {"result": None, "error": None, "retry": True, "block": False, "delay": None,
                             "after": 0.0, "reason": None, "started": True}


def _checked(wid: str, e: Ending) -> tuple[AttemptRef, Ending]:
    """The attempt an ending names, and the ending with its fields checked (as each
    public method checks them, with the same field names)."""
    if not isinstance(e, Ending):
        raise InvalidInput("ending", f"must be an Ending (got {type(e).__name__})")
    ref = check_claim(wid, e.attempt)
    if e.outcome not in OUTCOMES:
        raise InvalidInput("outcome", f"must be one of {', '.join(OUTCOMES)} (got {e.outcome!r})")
    own = _FIELDS[e.outcome]
    for name, default in _DEFAULTS.items():
        if name not in own and getattr(e, name) != default:
            raise InvalidInput(name, f"is not a field of outcome {e.outcome!r}")
    if e.outcome == "complete":
        checks.check_json("result", e.result)
        return ref, e
    if e.outcome == "fail":
        checks.check_text("error", e.error, required=True)
        if not isinstance(e.retry, bool) or not isinstance(e.block, bool):
            raise InvalidInput("retry" if not isinstance(e.retry, bool) else "block", "must be true or false")
        delay = None if e.delay is None else checks.check_seconds("delay", e.delay, allow_zero=True,
                                                                   maximum=MAX_DELAY)
        return ref, Ending(ref, "fail", error=e.error, retry=e.retry, block=e.block, delay=delay)
    if e.outcome == "retry":
        after = checks.check_seconds("after", e.after, allow_zero=True, maximum=MAX_RETRY_SECONDS)
        checks.check_text("reason", e.reason, required=True)
        return ref, Ending(ref, "retry", after=after, reason=e.reason)
    checks.check_text("reason", e.reason, required=True)
    if type(e.started) is not bool:
        raise InvalidInput("started", f"must be true or false, not {e.started!r}")
    return ref, Ending(ref, "release", reason=e.reason, started=e.started)


def check_endings(wid: str, endings: Sequence[Ending], field: str | None = "endings") -> list[tuple[AttemptRef, Ending]]:
    """Each ending of worker ``wid`` checked (every transport checks them before it writes or
    sends anything), with the attempt it names; InvalidInput naming ``<field>.<i>.<name>``
    (``field`` None: a batch of one, its fields named bare) otherwise."""
    if isinstance(endings, (str, bytes)) or not isinstance(endings, Sequence):
        raise InvalidInput(field or "endings", f"must be a list of Ending (got {type(endings).__name__})")
    if field is not None and len(endings) > MAX_ENDINGS:
        raise InvalidInput(field, f"names {len(endings)} attempts; at most {MAX_ENDINGS}")
    checked: list[tuple[AttemptRef, Ending]] = []
    seen: set[int] = set()
    for i, e in enumerate(endings):
        try:
            ref, e = _checked(wid, e)
        except InvalidInput as exc:
            if field is None:
                raise
            raise InvalidInput(f"{field}.{i}.{exc.field}", exc.problem) from None
        if ref.task_id in seen:
            raise InvalidInput(f"{field}.{i}.task_id" if field else "claim", f"names task {ref.task_id} twice")
        seen.add(ref.task_id)
        checked.append((ref, e))
    return checked


def end_attempts(s: Settings, worker: Worker | str, endings: Sequence[Ending], *,
                 field: str | None = "endings") -> Op[tuple[list[Ended], list[AttemptRef]]]:
    """End each attempt as its :class:`Ending` says; returns what ended (in order) and the
    attempts the lease guard refused. ``field``: the name bad input is reported under
    (``<field>.<i>.<name>``); None for a batch of one, whose fields are named bare."""
    wid = worker_id(worker)
    checked = check_endings(wid, endings, field)
    # the completions first, in one statement (the original Claims: a claim's task tells
    # whether the lean completion may serve it)
    done = [(e.attempt, e.result) for _, e in checked if e.outcome == "complete"]
    completed = (yield from complete_many(s, wid, done, results_checked=True)) if done else set()
    ended: list[Ended] = []
    refused: list[AttemptRef] = []
    for ref, e in checked:
        if e.outcome == "complete":
            if ref.task_id in completed:
                ended.append(Ended(ref.task_id, ref.generation, "complete", None))
            else:
                refused.append(ref)
            continue
        if e.outcome == "fail":
            assert e.error is not None
            task = yield from _fail(s, wid, ref, e.error, retry=e.retry, block=e.block, delay=e.delay)
        elif e.outcome == "retry":
            assert e.reason is not None
            task = yield from _retry(s, wid, ref, e.after, e.reason)
        else:
            assert e.reason is not None
            task = yield from _release(s, wid, ref, e.reason, started=e.started)
        if task is None:
            refused.append(ref)
        else:
            ended.append(Ended(ref.task_id, ref.generation, e.outcome, task))
    return ended, refused


def end_attempt(s: Settings, worker: Worker | str, ending: Ending) -> Op[Task | None]:
    """:func:`end_attempts` of one: the task as the attempt left it (None for a
    completion); :class:`LeaseLost` when the guard refused it."""
    ended, refused = yield from end_attempts(s, worker, [ending], field=None)
    if refused:
        ref = refused[0]
        raise LeaseLost(ref.task_id, ref.generation, f"{ending.outcome} refused: lease no longer held")
    return ended[0].task


def complete(s: Settings, worker: Worker | str, claim: Held, result: Any = None) -> Op[None]:
    """:meth:`leaseq.Queue.complete`."""
    yield from end_attempt(s, worker, Ending(claim, "complete", result=result))


def fail(s: Settings, worker: Worker | str, claim: Held, error: str, *, retry: bool = True,
         block: bool = False, delay: float | None = None) -> Op[Task]:
    """:meth:`leaseq.Queue.fail`. Where the task goes, and why, is the fail_task query's answer."""
    return _task((yield from end_attempt(s, worker, Ending(claim, "fail", error=error, retry=retry, block=block,
                                                           delay=delay))))


def retry(s: Settings, worker: Worker | str, claim: Held, after: float, reason: str) -> Op[Task]:
    """:meth:`leaseq.Queue.retry`: the attempt ends on request, and the task runs again
    ``after`` seconds later; the retry_task query decides where it goes. Past
    ``max_snoozes`` requests the attempt is recorded as a failure instead."""
    return _task((yield from end_attempt(s, worker, Ending(claim, "retry", after=after, reason=reason))))


def release(s: Settings, worker: Worker | str, claim: Held, reason: str = "released", *,
            started: bool = True) -> Op[Task]:
    """:meth:`leaseq.Queue.release`: the lease ends now and the recovery policy routes the task
    (``started=False``: its handler never began, and the attempt is given back with it)."""
    return _task((yield from end_attempt(s, worker, Ending(claim, "release", reason=reason, started=started))))


def _task(task: Task | None) -> Task:
    assert task is not None  # only a completion answers None
    return task


def _backoff(delay: float | None) -> dict[str, float]:
    """The default backoff's parameters for fail_task, which computes it from the row's
    attempts where ``delay`` is None (:func:`leaseq.core.checks.backoff_seconds`'s
    arithmetic): its base, cap and jitter, drawn here as backoff_seconds draws it (only
    when it is used, so the random stream is the same)."""
    return dict(backoff_base=float(checks.BACKOFF_BASE_SECONDS), backoff_cap=float(checks.BACKOFF_CAP_SECONDS),
                jitter=random.random() if delay is None else 0.0)


def _fail(s: Settings, wid: str, ref: AttemptRef, error: str, *, retry: bool, block: bool,
          delay: float | None) -> Op[Task | None]:
    """One failure, checked; None where the guard refused it."""
    yield BEGIN
    row = yield one("fail_task", task_id=ref.task_id, worker_id=wid, generation=ref.generation, error=error,
                    fingerprint=checks.error_fingerprint(error), retry=retry, block=block, delay=delay,
                    **_backoff(delay), max_same_error=s.max_same_error)
    if row is None:
        yield COMMIT
        return None
    yield from limits.release(s, [row])
    detail: dict[str, Any] = dict(error=error, attempt=row["attempts"], next_status=row["status"],
                                  error_streak=row["error_streak"], **heartbeats(row))
    if row["status"] == Status.QUEUED:
        detail["retry_at"] = row["available_at"].isoformat()
    yield from event(s, ref.task_id, "failed", ref.generation, wid, **detail)
    if row["status"] != Status.QUEUED:
        yield from event(s, ref.task_id, row["status"], ref.generation, wid, reason=row["reason"])
    if row["status"] in FAILED_ENDS:
        yield from settle_dependents(s, [ref.task_id])
    task = yield one("get_task", task_id=ref.task_id)
    yield COMMIT
    return to_task(task)


def _retry(s: Settings, wid: str, ref: AttemptRef, after: float, reason: str) -> Op[Task | None]:
    """One retry on request, checked; None where the guard refused it."""
    yield BEGIN
    row = yield one("retry_task", task_id=ref.task_id, worker_id=wid, generation=ref.generation, after=after,
                    max_snoozes=s.max_snoozes)
    if row is None:
        held = yield one("lock_lease", task_id=ref.task_id, worker_id=wid, generation=ref.generation)
        yield COMMIT
        if held is None:
            return None
        # the lease is held, so the limit stopped it: the request counts as a failure
        return (yield from _fail(s, wid, ref, f"retry requested more than max_snoozes={s.max_snoozes} "
                                              f"times; last reason: {reason}", retry=True, block=False,
                                 delay=None))
    yield from limits.release(s, [row])  # the attempt ended: its limit slots come back
    yield from event(s, ref.task_id, "retry_requested", ref.generation, wid, reason=reason, after=after,
                     retry_at=row["available_at"].isoformat(), snoozes=row["snoozes"], next_status=row["status"],
                     **heartbeats(row))
    if row["status"] != Status.QUEUED:
        yield from event(s, ref.task_id, row["status"], ref.generation, wid, reason=row["reason"])
    task = yield one("get_task", task_id=ref.task_id)
    yield COMMIT
    return to_task(task)


def _release(s: Settings, wid: str, ref: AttemptRef, reason: str, *, started: bool) -> Op[Task | None]:
    """One release, checked; None where the guard refused it."""
    yield BEGIN
    row = yield one("expire_lease", task_id=ref.task_id, worker_id=wid, generation=ref.generation,
                    unstarted=not started)
    if row is None:
        yield COMMIT
        return None
    yield from route(s, [row], event_type="lease_released", reason=reason,
                     **({} if started else {"started": False}))
    task = yield one("get_task", task_id=ref.task_id)
    yield COMMIT
    return to_task(task)
