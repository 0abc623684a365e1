"""Questions put to a person (``ctx.ask``): the open ones, and the answer that resumes a task.

A question is a durable signal wait (:func:`leaseq.engine.durable.wait_signal`
with ``ask=``): the attempt records the question and its JSON schema with the
wait's beginning in the action ledger (action :data:`~.durable.ASK_ACTION`),
ends under its lease, and the task rests in ``waiting`` for the signal
:data:`~.durable.ANSWER_SIGNAL`, holding no lease and no slot. A question is
*open* while its task waits so, before its deadline.

:func:`answer` checks the answer against the recorded schema before anything
is written, then sends it as that signal, under the task's lock: the task is
claimable at once, and its next attempt's ``ctx.ask`` consumes it (once) and
records it in the ledger. A task that is not waiting for an answer takes none,
so a second answer is refused, not kept.
"""

from __future__ import annotations

from typing import Any

from ..core import answers, checks
from ..core.errors import InvalidInput, InvalidTransition
from .common import Settings, acting, audit, event, require_task
from .durable import _ENDED, ANSWER_SIGNAL, ASK_ACTION
from .steps import BEGIN, COMMIT, Op, one, rows


def _ask(row: dict[str, Any]) -> dict[str, Any]:
    """An open question as :meth:`leaseq.Queue.asks` shows it."""
    asked = row["response"]
    return {"task_id": row["task_id"], "queue": row["queue"], "kind": row["kind"],
            "question": asked.get("question"), "schema": answers.recorded(asked), "key": asked.get("key"),
            "asked_at": row["asked_at"], "deadline_at": row["deadline_at"]}


def asks(s: Settings, *, queue: str | None = None, limit: int = 100) -> Op[list[dict[str, Any]]]:
    """:meth:`leaseq.Queue.asks`: the open questions, oldest first."""
    if queue is not None:
        checks.check_name("queue", queue)
    limit = checks.check_int("limit", limit, minimum=1, maximum=10_000)
    yield BEGIN
    found: list[dict[str, Any]] = yield rows("list_asks", queue=queue, limit=limit, signal=ANSWER_SIGNAL,
                                                action=ASK_ACTION)
    yield COMMIT
    return [_ask(r) for r in found]


def answer(s: Settings, task_id: int, value: Any, *, by: str | None = None,
           via: str | None = None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.answer`."""
    task_id = checks.check_task_id(task_id)
    checks.check_json("answer", value)
    yield BEGIN
    by, via = yield from acting(by, via)
    task = yield from require_task(task_id, lock=True)
    status = task["status"]
    if status in _ENDED:
        raise InvalidTransition(f"task {task_id} is {status}: it waits for no answer")
    asked: dict[str, Any] | None = yield one("open_ask", task_id=task_id, signal=ANSWER_SIGNAL,
                                                action=ASK_ACTION)
    if asked is None:
        raise InvalidTransition(f"task {task_id} has asked no question")
    if not asked["open"]:
        if asked["answered_by"] is not None:
            raise InvalidTransition(f"task {task_id}'s question was answered already, by {asked['answered_by']} "
                                    f"at {asked['answered_at'].isoformat()}: an answer is taken once")
        if asked["deadline_at"] is not None and asked["deadline_at"] <= asked["now"]:
            raise InvalidTransition(f"the time to answer task {task_id}'s question ran out at "
                                    f"{asked['deadline_at'].isoformat()}")
        raise InvalidTransition(f"task {task_id} waits for no answer now (it is {status})")
    question = asked["response"]
    try:
        answers.validate(answers.recorded(question), value)
    except InvalidInput as exc:  # the field as the person sees it, and what the question wanted
        raise InvalidInput(exc.field, f"{exc.problem}; the question wants "
                                      f"{answers.summary(answers.recorded(question))}") from None
    sent = yield one("insert_signal", task_id=task_id, name=ANSWER_SIGNAL, payload=value, actor=by)
    woken = yield one("wake_for_signal", task_id=task_id, name=ANSWER_SIGNAL)
    generation = task["claim_generation"] or None
    key = question.get("key")
    yield from event(s, task_id, "answered", generation, None, by=by, key=key, signal_id=sent["id"])
    yield from event(s, task_id, "woke", generation, None, reason="answer", signal=ANSWER_SIGNAL, by=by)
    yield rows("notify_work", queue=task["queue"])
    yield from audit(by, via, "answer", f"task:{task_id}", key=key, signal_id=sent["id"])
    yield COMMIT
    return {"task_id": task_id, "key": key, "question": question.get("question"), "answered_by": sent["sent_by"],
            "answered_at": sent["sent_at"], "signal_id": sent["id"], "woke": woken is not None}
