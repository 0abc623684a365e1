"""Durable waits: a handler's sleep and signal wait, and the signals sent to a task.

A wait ends the attempt, under its lease: the ``suspend_task`` query ends the
lease, gives the attempt back (a wait is neither a failure nor a try) and
rests the task in ``waiting`` with no lease and no slot, until its wake time
(``wake_at``, by the database's clock) or, for a signal wait, a signal of the
name it waits for. The claim routes due sleepers before it claims, as it
routes expired leases (:func:`leaseq.engine.expiry.wake_due`).

Each wait is an entry of the action ledger, keyed by the handler's
attempt-stable key (``<task key>:sleep:<position>``, ``<task key>:signal:
<name>:<position>``), written under the lease. The next attempt runs the
handler from the top: a sleep whose recorded wake time has passed returns at
once, a signal already received returns its recorded payload, and a signal
wait whose recorded timeout has passed times out, so execution resumes after
the wait and nothing the ledger recorded is done twice.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from ..core import answers, checks
from ..core.errors import InvalidInput, InvalidTransition, LeaseLost
from ..core.model import Held, Status, Worker
from . import limits
from .common import Settings, acting, audit, check_claim, event, heartbeats, require_task, worker_id
from .replay import diverge
from .steps import BEGIN, COMMIT, Op, one, rows

#: The ledger actions of the waits.
SLEEP_ACTION = "leaseq.sleep"
SIGNAL_ACTION = "leaseq.signal"
#: A question put to a person (ctx.ask): its wait and its answer.
ASK_ACTION = "leaseq.ask"
#: The signal an accepted answer comes as (reserved: q.signal refuses it; q.answer sends it).
ANSWER_SIGNAL = "leaseq.answer"
#: The longest a wait may last (seconds).
MAX_WAIT_SECONDS = 10 * 365 * 86400.0
#: How far a recorded wake time may sit past the clock it was read from (seconds): SQLite's
#: JSON keeps 15 significant digits of it (10 us), so "0 seconds from now" can read a hair late.
_PRECISION = 1e-3
#: The statuses a task takes no signal in: it will never wait again.
_ENDED = frozenset(s.value for s in (Status.COMPLETED, Status.CANCELLED, Status.DEAD, Status.DENIED,
                                     Status.EXPIRED))


def check_signal_name(name: Any) -> str:
    """A signal's name: as a task kind, 1-200 characters; not :data:`ANSWER_SIGNAL`."""
    checked: str = checks.check_kind(name, "name")
    if checked == ANSWER_SIGNAL:
        raise InvalidInput("name", f"{ANSWER_SIGNAL!r} is reserved for the answers to ctx.ask: answer a question "
                                   "with q.answer(task_id, answer) (leaseq answer, POST /v1/tasks/{id}/answer)")
    return checked


def check_ask(ask: Any) -> dict[str, Any]:
    """A question put to a person: ``{"question": text, "schema": JSON schema}``."""
    if not isinstance(ask, dict) or set(ask) - {"question", "schema"}:
        raise InvalidInput("ask", "must be an object of question and schema")
    question = checks.check_text("question", ask.get("question"), required=True)
    return {"question": question, "schema": answers.check_schema(ask.get("schema", answers.TEXT))}


def check_until(until: Any) -> float:
    """A wake time: an aware datetime, or Unix seconds."""
    if isinstance(until, datetime):
        if until.tzinfo is None:
            raise InvalidInput("until", "must be an aware datetime (with its time zone), or Unix seconds")
        return until.timestamp()
    if isinstance(until, bool) or not isinstance(until, (int, float)) or not math.isfinite(until) or until < 0:
        raise InvalidInput("until", f"must be an aware datetime or Unix seconds (got {until!r})")
    return float(until)


def _lease(claim: Held, wid: str, what: str) -> Op[dict[str, Any]]:
    held: dict[str, Any] | None = yield one("lock_lease", task_id=claim.task_id, worker_id=wid,
                                            generation=claim.generation)
    if held is None:
        raise LeaseLost(claim.task_id, claim.generation, f"{what} refused: lease no longer held")
    return held


def _entry(s: Settings, claim: Held, wid: str, key: str, action: str) -> Op[dict[str, Any] | None]:
    """The ledger entry recorded under ``key``, which must be this kind of wait's (else the
    handler diverged from its recorded run: :func:`leaseq.engine.replay.diverge`)."""
    found: dict[str, Any] | None = yield one("get_effect", task_id=claim.task_id, idempotency_key=key)
    if found is not None and found["action"] != action:
        yield from diverge(s, claim, wid, key, f"ledger entry {key!r} was recorded as action {found['action']!r}, "
                                               f"not {action!r}: the retried handler diverged from the recorded run",
                           recorded={"action": found["action"]}, requested={"action": action})
    return found


def _record(claim: Held, wid: str, key: str, action: str, response: dict[str, Any], *,
            seconds: float | None = None, until: float | None = None) -> Op[dict[str, Any]]:
    row: dict[str, Any] | None = yield one("record_wait", task_id=claim.task_id, worker_id=wid,
                                           generation=claim.generation, action=action, idempotency_key=key,
                                           response=response, seconds=seconds, until=until)
    if row is None:  # lock_lease held it in this transaction: never
        raise LeaseLost(claim.task_id, claim.generation, "record_wait refused: lease no longer held")
    return row


def suspend(s: Settings, claim: Held, wid: str, key: str, *, until: float | None,
            signal: str | None, question: str | None = None, children: list[int] | None = None,
            approval: bool = False) -> Op[dict[str, Any]]:
    """End the attempt in a wait (the lease ends, the slot and the attempt come back): until
    ``until``, a signal ``signal`` (a person's answer to ``question``), the end of the last of
    the child tasks ``children``, or with ``approval`` a person's approval (a budget spent: see
    :mod:`leaseq.engine.budgets`)."""
    row: dict[str, Any] | None = yield one("suspend_task", task_id=claim.task_id, worker_id=wid,
                                           generation=claim.generation, until=until, signal=signal,
                                           children=children, approval=approval)
    if row is None:
        raise LeaseLost(claim.task_id, claim.generation, "suspend refused: lease no longer held")
    yield from limits.release(s, [row])
    waiting_for = ("approval" if approval else "children" if children is not None
                   else "answer" if question is not None else "signal" if signal is not None else "sleep")
    detail: dict[str, Any] = dict(waiting_for=waiting_for, key=key,
                                  until=None if row["wake_at"] is None else row["wake_at"].isoformat(),
                                  next_status=row["status"], attempts=row["attempts"], **heartbeats(row))
    if signal is not None:
        detail["signal"] = signal
    if question is not None:
        detail["question"] = question
    if children is not None:
        detail["children"] = children
    yield from event(s, claim.task_id, "suspended", claim.generation, wid, **detail)
    if row["status"] != (Status.AWAITING_APPROVAL if approval else Status.WAITING):
        yield from event(s, claim.task_id, row["status"], claim.generation, wid, reason=row["reason"])
    return row


def sleep(s: Settings, worker: Worker | str, claim: Held, key: str, *, seconds: float | None = None,
          until: Any = None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.sleep`: the sleep recorded under ``key`` (``seconds`` from now by the
    database's clock, or ``until``), then either over (``{"state": "resumed"}``) or begun, the
    attempt ended (``{"state": "suspended"}``); ``until`` is its wake time (Unix seconds)."""
    wid = worker_id(worker)
    claim = check_claim(wid, claim)
    checks.check_key("key", key)
    if (seconds is None) == (until is None):
        raise InvalidInput("seconds", "give either seconds or until")
    wake = None if until is None else check_until(until)
    if seconds is not None:
        seconds = checks.check_seconds("seconds", seconds, allow_zero=True, maximum=MAX_WAIT_SECONDS)
    yield BEGIN
    held = yield from _lease(claim, wid, "sleep")
    now = held["now"].timestamp()
    entry = yield from _entry(s, claim, wid, key, SLEEP_ACTION)
    if entry is None:
        from .budgets import gate  # a new wait: a spent budget of the tree stops the attempt here
        yield from gate(s, claim, wid, held, key)
        entry = yield from _record(claim, wid, key, SLEEP_ACTION, {}, seconds=seconds, until=wake)
        now = max(now, entry["response_at"].timestamp())  # the clock the wake time was read from
    wake_at = float(entry["response"]["until"])
    if wake_at <= now + _PRECISION:
        yield COMMIT
        return {"state": "resumed", "until": wake_at, "key": key}
    yield from suspend(s, claim, wid, key, until=wake_at, signal=None)
    yield COMMIT
    return {"state": "suspended", "until": wake_at, "key": key}


def wait_signal(s: Settings, worker: Worker | str, claim: Held, key: str, name: str, *,
                timeout: float | None = None, ask: dict[str, Any] | None = None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.wait_signal`: the wait for a signal ``name`` recorded under ``key``.

    Answers ``{"state": "received", "payload": ..., "sent_by": ...}`` (a signal kept for
    the task is consumed now, or was by an earlier attempt: replayed), ``{"state":
    "timed_out"}`` (``timeout`` seconds from the first attempt that waited have
    passed), or ``{"state": "suspended"}``: the attempt ended, the task waits.

    With ``ask`` (``{"question": ..., "schema": ...}``, ``ctx.ask``) the wait is for a
    person's answer, the signal :data:`ANSWER_SIGNAL` that :func:`leaseq.engine.asks.answer`
    sends once the answer fits the schema; the question and its schema are recorded with
    the wait's beginning (action :data:`ASK_ACTION`), where ``q.asks()`` finds them.
    """
    wid = worker_id(worker)
    claim = check_claim(wid, claim)
    checks.check_key("key", key)
    action = SIGNAL_ACTION
    if ask is None:
        name = check_signal_name(name)
    else:
        if name != ANSWER_SIGNAL:
            raise InvalidInput("name", f"a question's answer comes as the signal {ANSWER_SIGNAL!r} (got {name!r})")
        ask, action = check_ask(ask), ASK_ACTION
    if timeout is not None:
        timeout = checks.check_seconds("timeout", timeout, allow_zero=True, maximum=MAX_WAIT_SECONDS)
    yield BEGIN
    held = yield from _lease(claim, wid, "wait_for_signal" if ask is None else "ask")
    outcome = yield from _entry(s, claim, wid, key, action)
    if outcome is not None:  # received (or timed out) on an earlier attempt: replayed
        yield COMMIT
        return {**outcome["response"], "key": key, "replayed": True}
    wait_key = _wait_key(key)
    if held["budget_owners"] is not None and \
            (yield one("get_effect", task_id=claim.task_id, idempotency_key=wait_key)) is None:
        from .budgets import gate  # a new wait: a spent budget of the tree stops the attempt here
        yield from gate(s, claim, wid, held, key)
    pending = yield one("pending_signal", task_id=claim.task_id, name=name)
    if pending is not None:
        consumed = yield one("consume_signal", signal_id=pending["id"], task_id=claim.task_id, worker_id=wid,
                             generation=claim.generation, idempotency_key=key)
        if consumed is None:
            raise LeaseLost(claim.task_id, claim.generation, "wait_for_signal refused: lease no longer held")
        response = {"state": "received", "signal": name, "signal_id": consumed["id"],
                    "payload": consumed["payload"], "sent_by": consumed["sent_by"],
                    "sent_at": consumed["sent_at"].isoformat()}
        yield from _record(claim, wid, key, action, response)
        yield from event(s, claim.task_id, "signal_received", claim.generation, wid, signal=name,
                         signal_id=consumed["id"], sent_by=consumed["sent_by"], key=key)
        yield COMMIT
        return {**response, "key": key, "replayed": False}
    begun = yield from _entry(s, claim, wid, wait_key, action)
    if begun is None:
        waiting: dict[str, Any] = {"state": "waiting", "signal": name}
        if ask is not None:  # what q.asks() shows, and q.answer() checks an answer against
            waiting.update(question=ask["question"], schema=answers.stored(ask["schema"]), key=key)
        begun = yield from _record(claim, wid, wait_key, action, waiting, seconds=timeout)
        now = max(held["now"].timestamp(), begun["response_at"].timestamp())
    else:
        now = held["now"].timestamp()
    deadline = begun["response"].get("until")
    if deadline is not None and float(deadline) <= now + _PRECISION:
        response = {"state": "timed_out", "signal": name, "until": float(deadline)}
        yield from _record(claim, wid, key, action, response)
        yield from event(s, claim.task_id, "wait_timed_out", claim.generation, wid, signal=name, key=key,
                         until=datetime.fromtimestamp(float(deadline), held["now"].tzinfo).isoformat())
        yield COMMIT
        return {**response, "key": key, "replayed": False}
    yield from suspend(s, claim, wid, key, until=None if deadline is None else float(deadline), signal=name,
                       question=None if ask is None else begun["response"].get("question"))
    yield COMMIT
    return {"state": "suspended", "signal": name, "until": deadline, "key": key}


def _wait_key(key: str) -> str:
    """The ledger key of a signal wait's beginning (its deadline), beside its outcome's."""
    wait_key = f"{key}:wait"
    if len(wait_key) > 255:
        import hashlib
        wait_key = "wait:" + hashlib.sha256(wait_key.encode()).hexdigest()
    return wait_key


def signal(s: Settings, task_id: int, name: str, payload: Any = None, *, by: str | None = None,
           via: str | None = None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.signal`."""
    task_id = checks.check_task_id(task_id)
    name = check_signal_name(name)
    checks.check_json("payload", payload)
    yield BEGIN
    by, via = yield from acting(by, via)
    task = yield from require_task(task_id, lock=True)
    if task["status"] in _ENDED:
        raise InvalidTransition(f"task {task_id} is {task['status']}: it will wait for no signal")
    sent = yield one("insert_signal", task_id=task_id, name=name, payload=payload, actor=by)
    woken = yield one("wake_for_signal", task_id=task_id, name=name)
    yield from event(s, task_id, "signal_sent", task["claim_generation"] or None, None, by=by, signal=name,
                     signal_id=sent["id"], woke=woken is not None)
    if woken is not None:
        yield from event(s, task_id, "woke", task["claim_generation"] or None, None, reason="signal",
                         signal=name, by=by)
        yield rows("notify_work", queue=task["queue"])
    yield from audit(by, via, "signal", f"task:{task_id}", signal=name, signal_id=sent["id"])
    yield COMMIT
    return {"id": sent["id"], "task_id": task_id, "name": name, "sent_by": sent["sent_by"],
            "sent_at": sent["sent_at"], "woke": woken is not None}


def signals(s: Settings, task_id: int) -> Op[list[dict[str, Any]]]:
    """:meth:`leaseq.Queue.signals`: a task's signals, oldest first, consumed or not."""
    task_id = checks.check_task_id(task_id)
    yield BEGIN
    yield from require_task(task_id)
    found: list[dict[str, Any]] = yield rows("list_signals", task_id=task_id)
    yield COMMIT
    return found
