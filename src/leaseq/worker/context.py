"""What a task handler sees: ``ctx``, its lease, and its effects.

A handler holds a lease only as long as the runtime keeps renewing it. When
the lease is lost, ``ctx.lost`` turns true, ``ctx.check()`` and every new
``ctx.effect(...)`` raise :class:`leaseq.LeaseLost`, and the handler's result
will not be published. The guards in the database refuse a stale worker
anyway; the context makes it stop early instead of wasting tool calls.

In the worker runtime the context talks to the runtime's port, on the
runtime's loop: awaited there by async handlers, and reached from a sync
handler's thread through :func:`leaseq.worker.transport.call_on_loop`
(:meth:`TaskContext.port_call`). A context made by hand around a blocking
queue (``TaskContext(queue, worker, claim, log)``, no ``loop``: tests,
adapters) calls it directly, and in a thread when awaited.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from ..core import answers, checks
from ..core.errors import BudgetSpent, ChildFailed, InvalidInput, LeaseLost, Suspended, WaitTimedOut, is_transient
from ..core.model import ChildHandle, Claim, Task, Worker
from ..engine.durable import ANSWER_SIGNAL, MAX_WAIT_SECONDS, check_signal_name
from .effect_scope import EffectScope
from .transport import call_on_loop

if TYPE_CHECKING:  # pragma: no cover
    from .tools import Tool
    from .transport import Transport


#: Guards every context's loss flag; held for a few instructions at a time.
_LOSS_LOCK = threading.Lock()


#: What names one attempt in a worker: (task id, lease epoch, generation).
AttemptKey = tuple[int, int, int]

#: ctx.wait_for_signal's default: none given (WaitTimedOut is raised on a timeout)
_NO_DEFAULT: Any = object()

_T = TypeVar("_T")


def _child_id(handle: Any) -> int:
    """The task id of a child handle (a :class:`ChildHandle`, a child :class:`Task` or its id)."""
    value = handle.id if isinstance(handle, (ChildHandle, Task)) else handle
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput("handle", f"must be a handle ctx.spawn returned (got {handle!r})")
    return value


def _ledger_key(task_key: str, what: str, position: int) -> str:
    """The ledger key of a durable wait: ``<task key>:sleep:<position>``, ``<task key>:signal:<name>:<position>``."""
    from .tools import tool_key
    return tool_key(task_key, what, position)


def _asked(params: dict[str, Any]) -> dict[str, Any]:
    """What ``ctx.ask`` records: the question and its JSON schema."""
    return {"question": params["question"], "schema": params["schema"]}


class TaskContext:
    """The handler's view of one claimed task."""

    def __init__(self, transport: Transport, worker: Worker, claim: Claim,
                 log: logging.LoggerAdapter[logging.Logger], *, loop: asyncio.AbstractEventLoop | None = None):
        #: the runtime's port (with ``loop``), or a blocking queue (without)
        self._transport = transport
        #: the loop the port's calls are awaited on (None: ``transport`` blocks)
        self._loop = loop
        self.worker = worker
        self.claim = claim
        self.log = log
        self._lost = False
        #: made on the first ctx.sleep(): most handlers never sleep on it
        self._lost_event: threading.Event | None = None
        self.lost_reason: str | None = None
        #: True when the loss was only inferred on this worker's clock (no successful
        #: renewal within the lease length), not told by the queue: a renewal whose
        #: answer was lost may still have extended the lease in the database.
        self.loss_inferred = False
        #: monotonic time at which the last successful renewal was *sent*:
        #: the lease cannot outlive it by more than its length.
        self.renewed_at = time.monotonic()
        #: monotonic time at which the last renewal was sent, answered or not: if
        #: it committed unanswered, the lease may last until this plus its length.
        self.renewal_sent_at = self.renewed_at
        #: True once the renewer stopped renewing the lease after its handler returned (a
        #: renewal was refused): the guarded write of its outcome decides what happened.
        self.renewals_ended = False
        #: holds one of the worker's handler slots (with prefetch): released as the handler returns
        self.slot_held = False
        #: set by the runtime's observer once the handler begins (a task claimed ahead may never)
        self.handler_began = False
        #: set by the runtime once this attempt's outcome is recorded
        self.outcome_recorded = False
        #: set by the runtime: called (from any thread) when the context finds out itself
        self.on_lost: Callable[[TaskContext, str], object] | None = None
        #: the next position of each tool action in this attempt (ctx.tool)
        self._tool_positions: dict[str, int] = {}
        #: kept by the runtime's observer: when the handler started (monotonic), how long it
        #: ran (seconds), how the attempt ended, and its OpenTelemetry run span
        self.started_at = 0.0
        self.duration: float | None = None
        self.outcome: str | None = None
        self.span: Any = None
        #: the runtime's: the handler returned and its slot waits, reserved, for the
        #: claim sent with this completion (claim_with_completion)
        self.refill_slot = False
        #: set by the runtime: the handler is a coroutine function (ctx.sleep and
        #: ctx.wait_for_signal then return awaitables)
        self.handler_is_async = False
        #: the answer of the durable wait that ended this attempt (None: none did)
        self.suspended: dict[str, Any] | None = None
        #: set by the runtime: the handlers it runs (ctx.spawn takes a declared kind's options from it)
        self.registry: Any = None

    # -- the queue ------------------------------------------------------------

    def port_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call the queue's ``name`` from blocking code (a sync handler) and return its answer.

        A ledger step refused because a budget covering the task is spent (:class:`BudgetSpent`:
        the queue ended the attempt, the task waits for an approval) stops the handler as a
        durable wait does (:class:`Suspended`)."""
        try:
            return self._port_call(name, *args, **kwargs)
        except BudgetSpent as exc:
            raise self._budget_spent(exc.figures) from None

    async def aport_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Await the queue's ``name`` (an async handler) and return its answer (see :meth:`port_call`)."""
        try:
            return await self._aport_call(name, *args, **kwargs)
        except BudgetSpent as exc:
            raise self._budget_spent(exc.figures) from None

    def _budget_spent(self, figures: dict[str, Any]) -> Suspended:
        """The attempt ended because a budget covering the task is spent (``figures``)."""
        self.suspended = {"state": "paused", "figures": figures}
        owner = figures.get("owner")
        whose = "its budget" if owner is None else f"the budget of task {owner}"
        waiting_for = (f"an approval: {whose} of {figures.get('key')} is spent "
                       f"({figures.get('spent')} of {figures.get('budget')})")
        self.mark_lost(f"suspended: waits for {waiting_for}")
        return Suspended(self.task_id, self.generation, None, waiting_for)

    def on_worker_loop(self) -> bool:
        """Whether the caller runs on the worker's event loop (an async handler's own code), where
        a blocking call stalls every handler and renewal of the worker."""
        return self._loop is not None and _running_loop() is self._loop

    def _port_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        loop = self._loop
        if loop is None:  # made by hand around a blocking queue
            return getattr(self._transport, name)(*args, **kwargs)
        if _running_loop() is loop:
            # Blocking code on the loop's own thread (an async handler's blocking call):
            # waiting there for the loop would never end. The port's blocking twin answers.
            return getattr(getattr(self._transport, "sync"), name)(*args, **kwargs)
        return call_on_loop(loop, getattr(self._transport, name), *args, **kwargs)

    async def _aport_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        loop = self._loop
        if loop is None:  # made by hand around a blocking queue
            return await asyncio.to_thread(getattr(self._transport, name), *args, **kwargs)
        if _running_loop() is loop:
            return await getattr(self._transport, name)(*args, **kwargs)
        # awaited on a loop of the handler's own (asyncio.run in a sync handler): the port is the runtime's
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            getattr(self._transport, name)(*args, **kwargs), loop))

    # -- the lease ------------------------------------------------------------

    @property
    def task(self) -> Task:
        """The task as claimed."""
        return self.claim.task

    @property
    def task_id(self) -> int:
        return self.claim.task_id

    @property
    def key(self) -> AttemptKey:
        """(task id, lease epoch, generation): one attempt. A worker may hold a stale and a new
        attempt of the same task at once, so the runtime tracks attempts, not tasks; after a
        failover lost its claim, the stale and the new one can even share the generation."""
        return (self.claim.task_id, self.claim.epoch, self.claim.generation)

    @property
    def generation(self) -> int:
        """The claim generation: this attempt's fencing token."""
        return self.claim.generation

    @property
    def lost(self) -> bool:
        """True once this worker no longer holds the lease."""
        return self._lost

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is gone. Call it between steps."""
        if self._lost:
            raise LeaseLost(self.task_id, self.generation, self.lost_reason or "lease lost")

    def pause(self, seconds: float) -> None:
        """Sleep in place, holding the lease and the slot (sync handlers), waking early with
        :class:`LeaseLost` if the lease is lost. For a wait that frees both, :meth:`sleep`."""
        with _LOSS_LOCK:
            if self._lost_event is None:
                self._lost_event = threading.Event()
                if self._lost:
                    self._lost_event.set()
            event = self._lost_event
        if event.wait(seconds):
            self.check()

    # -- durable waits --------------------------------------------------------

    def sleep(self, seconds: float) -> Any:
        """Sleep durably for ``seconds``, holding no lease and no slot meanwhile.

        ``await ctx.sleep(60)`` in an async handler, ``ctx.sleep(60)`` in a sync one.
        The sleep is recorded in the task's ledger (keyed ``<task key>:sleep:<position>``)
        with its wake time, by the database's clock, and the attempt ends: the lease is
        released, the worker's slot freed, and the task waits in ``waiting`` until the
        wake time, when it is claimable again. The next attempt runs the handler from the
        top: tool calls and effects the ledger recorded replay without being made again,
        a sleep whose wake time has passed returns at once, and the handler goes on after
        it. A sleep is neither a failure nor a try (``max_attempts`` is not spent).
        Code after the call runs only in the attempt that finds the sleep over. To wait
        in place, holding the lease, use :meth:`pause`.
        """
        return self._wait("sleep", lambda: {"seconds": seconds})

    def sleep_until(self, when: Any) -> Any:
        """:meth:`sleep` until ``when`` (an aware datetime, or Unix seconds)."""
        return self._wait("sleep", lambda: {"until": when})

    def wait_for_signal(self, name: str, timeout: float | None = None, default: Any = _NO_DEFAULT) -> Any:
        """Wait durably for the signal ``name`` and return its payload (``q.signal(task_id, name,
        payload)``, ``leaseq signal``, ``POST /v1/tasks/{id}/signals/{name}``).

        ``payload = await ctx.wait_for_signal("approved")`` in an async handler, without
        ``await`` in a sync one. A signal sent before the wait is kept; each is consumed
        once, by the attempt that waits for it, and recorded in the ledger with its sender.
        With none kept, the attempt ends as in :meth:`sleep`: no lease, no slot, the task
        ``waiting`` until the signal comes (then claimable at once) or ``timeout`` seconds
        have passed since the first attempt that waited, when the next attempt raises
        :class:`leaseq.WaitTimedOut` here, or returns ``default`` if one is given. The
        next attempt replays the handler up to here from the ledger.
        """
        check_signal_name(name)
        return self._wait("signal", lambda: {"name": name, "timeout": timeout}, default)

    def ask(self, question: str, schema: Any = None, *, timeout: float | None = None,
            default: Any = _NO_DEFAULT) -> Any:
        """Ask a person ``question`` and return the answer, waiting durably for it.

        ``answer = await ctx.ask("Refund order 7?", schema=Decision)`` in an async handler,
        without ``await`` in a sync one. ``schema`` is a pydantic model class (the answer is
        returned as an instance of it), a JSON schema (a dict; the answer is returned as
        JSON), or None: a line of text. The question and its JSON schema are recorded in the
        task's ledger (``<task key>:ask:<position>``) and the attempt ends as in
        :meth:`wait_for_signal`: no lease, no slot, the task ``waiting`` until a person
        answers (``q.answer(task_id, answer)``, ``leaseq answer``, ``POST
        /v1/tasks/{id}/answer``, the dashboard's inbox; ``q.asks()`` and ``leaseq asks``
        list the open questions), then claimable at once. An answer is checked against the
        schema before it is accepted, and taken once. With ``timeout`` (seconds from the
        first attempt that asked) the question closes unanswered when it passes: the next
        attempt raises :class:`leaseq.WaitTimedOut` here, or returns ``default`` if one is
        given (the "deny unless answered" of an approval). The next attempt replays the
        handler up to here from the ledger.
        """
        json_schema, model = answers.schema_of(schema)
        if not isinstance(question, str) or not question.strip():
            raise InvalidInput("question", "must be a non-empty string")
        answers.check_schema(json_schema)
        params = {"question": question, "schema": json_schema, "timeout": timeout, "model": model}
        return self._wait("ask", lambda: params, default)

    def await_for_signal(self, name: str, timeout: float | None = None, default: Any = _NO_DEFAULT) -> Any:
        """:meth:`wait_for_signal`, awaited from any async code of the handler (a framework's
        async hook in a sync handler too): ``payload = await ctx.await_for_signal("approved")``."""
        check_signal_name(name)
        return self._wait("signal", lambda: {"name": name, "timeout": timeout}, default, blocking=False)

    def wait_for_signal_blocking(self, name: str, timeout: float | None = None, default: Any = _NO_DEFAULT) -> Any:
        """:meth:`wait_for_signal`, blocking the calling thread even in an async handler's code (a
        sync framework's node); never on the event loop of an async handler."""
        check_signal_name(name)
        return self._wait("signal", lambda: {"name": name, "timeout": timeout}, default, blocking=True)

    def _wait(self, what: str, args: Callable[[], dict[str, Any]], default: Any = None, *,
              blocking: bool | None = None) -> Any:
        """One durable wait: its ledger key taken in call order, the guarded call, its outcome
        (``blocking``: answered in place, else awaitable; None: as the handler is)."""
        self.check()
        params = args()
        if what == "sleep":
            key = _ledger_key(self.task.idempotency_key, "sleep", self.next_tool_position("leaseq:sleep"))
        elif what == "ask":
            key = _ledger_key(self.task.idempotency_key, "ask", self.next_tool_position("leaseq:ask"))
        elif what == "children":
            key = _ledger_key(self.task.idempotency_key, "children", self.next_tool_position("leaseq:children"))
        else:
            name = params["name"]
            key = _ledger_key(self.task.idempotency_key, f"signal:{name}",
                              self.next_tool_position(f"leaseq:signal:{name}"))
        if blocking is None:
            blocking = not self.handler_is_async
        if blocking:
            return self._outcome(self._call_wait(what, key, params), default, params)
        return self._await_wait(what, key, params, default)

    async def _await_wait(self, what: str, key: str, params: dict[str, Any], default: Any) -> Any:
        return self._outcome(await self._acall_wait(what, key, params), default, params)

    def _wait_call(self, what: str, key: str, params: dict[str, Any]) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        """The queue's call that records the wait ``what`` under the lease: its name and arguments."""
        if what == "sleep":
            return "sleep", (self.worker, self.claim, key), params
        if what == "ask":
            return "wait_signal", (self.worker, self.claim, key, ANSWER_SIGNAL), \
                {"timeout": params["timeout"], "ask": _asked(params)}
        if what == "children":
            return "wait_children", (self.worker, self.claim, key, params["children"]), \
                {} if params["timeout"] is None else {"timeout": params["timeout"]}
        return "wait_signal", (self.worker, self.claim, key, params["name"]), {"timeout": params["timeout"]}

    def _call_wait(self, what: str, key: str, params: dict[str, Any]) -> dict[str, Any]:
        name, args, kwargs = self._wait_call(what, key, params)
        return self._retried(what, lambda: self.port_call(name, *args, **kwargs))

    async def _acall_wait(self, what: str, key: str, params: dict[str, Any]) -> dict[str, Any]:
        name, args, kwargs = self._wait_call(what, key, params)
        return await self._aretried(what, lambda: self.aport_call(name, *args, **kwargs))

    def _retried(self, what: str, call: Callable[[], _T]) -> _T:
        """A guarded write of this context: a refusal is the lost lease; the queue's trouble in
        transit is tried again while the lease may be live (:meth:`transit_pause`)."""
        tries = 0
        while True:
            try:
                return call()
            except LeaseLost as exc:
                self._refused(exc)
                raise
            except Exception as exc:
                if not is_transient(exc):
                    raise
                tries += 1
                time.sleep(self.transit_pause(what, exc, tries))

    async def _aretried(self, what: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """:meth:`_retried`, awaited."""
        tries = 0
        while True:
            try:
                return await call()
            except LeaseLost as exc:
                self._refused(exc)
                raise
            except Exception as exc:
                if not is_transient(exc):
                    raise
                tries += 1
                await asyncio.sleep(self.transit_pause(what, exc, tries))

    def transit_pause(self, what: str, exc: BaseException, tries: int) -> float:
        """After the ``tries``-th failure in transit of a write made for the handler (a ledger
        entry, a wait): how long to wait before trying it again, or :class:`LeaseLost` when the
        lease could run out first (the queue's trouble is never the handler's failure)."""
        from .completer import INITIAL_BACKOFF, next_backoff
        backoff = INITIAL_BACKOFF
        delay = backoff
        for _ in range(tries):
            delay, backoff = next_backoff(backoff, exc)
        if self.lost or time.monotonic() + delay >= self.may_last_until():
            reason = f"{what} could not be written before the lease could run out: {exc}"
            self.mark_lost(reason, inferred=True)
            raise LeaseLost(self.task_id, self.generation, reason) from exc
        self.log.warning(f"{what} failed in transit (try {tries}), trying again: {exc}")
        return delay

    def _outcome(self, answer: dict[str, Any], default: Any, params: dict[str, Any]) -> Any:
        state = answer.get("state")
        model = params.get("model")
        asked = answer.get("signal") == ANSWER_SIGNAL
        if state == "resumed":
            return None
        if state == "received":
            payload = answer.get("payload")
            return payload if model is None else model.model_validate(payload)
        if state == "timed_out":
            if default is not _NO_DEFAULT:
                return default
            if asked:
                raise WaitTimedOut(ANSWER_SIGNAL, "no answer to the question came before its deadline")
            if answer.get("children") is not None:
                pending = ", ".join(str(c) for c in answer.get("pending") or answer["children"])
                raise WaitTimedOut("children", f"child tasks {pending} had not ended before the wait's timeout")
            raise WaitTimedOut(str(answer.get("signal")))
        if state == "done":  # every child it waits for completed: their results, in order
            results = list(answer["results"])
            return results[0] if params.get("one") else results
        if state == "failed":
            raise ChildFailed(int(answer["child"]), str(answer["status"]), answer.get("error"))
        # suspended: the guarded write ended the lease; the handler stops here
        self.suspended = answer
        if answer.get("children") is not None:
            waiting_for = "child tasks " + ", ".join(str(c) for c in answer.get("pending") or answer["children"])
        else:
            waiting_for = ("an answer to its question" if asked else f"signal {answer['signal']!r}"
                           if answer.get("signal") is not None else "its sleep")
        self.mark_lost(f"suspended: waits for {waiting_for}")
        until = answer.get("until")
        raise Suspended(self.task_id, self.generation, None if until is None else float(until), waiting_for)

    # -- the task's stream ----------------------------------------------------

    def emit(self, item: Any, *, durable: bool = False) -> Any:
        """Append ``item`` (JSON, at most 64 KiB) to the task's stream, under the lease; returns
        its cursor (``seq``). ``await ctx.emit(...)`` in an async handler.

        Readers follow the stream with ``q.stream(task_id)``, ``leaseq stream ID`` or ``GET
        /v1/tasks/{id}/stream`` (server-sent events). Each attempt's entries begin with a
        ``reset`` entry: a retried attempt runs the handler from the top and emits again,
        and the reset tells a reader to drop what the earlier attempt emitted. With
        ``durable=True`` the item is also recorded in the task's ledger (keyed ``<task
        key>:emit:<position>``, in the order of the handler's durable emits): a retried
        attempt that reaches it again gets it replayed and appends nothing, so it is in the
        stream once, and a reset leaves it standing. Raises :class:`leaseq.LeaseLost` once
        the lease is gone: a stale attempt cannot append.
        """
        self.check()
        if not isinstance(durable, bool):
            raise InvalidInput("durable", f"must be true or false (got {durable!r})")
        key = _ledger_key(self.task.idempotency_key, "emit", self.next_tool_position("leaseq:emit")) \
            if durable else None
        if not self.handler_is_async:
            return self._call_emit(item, key)
        return self._await_emit(item, key)

    def _call_emit(self, item: Any, key: str | None) -> int:
        answer = self._retried("emit", lambda: self.port_call("emit", self.worker, self.claim, item, key=key))
        return int(answer["seq"])

    async def _await_emit(self, item: Any, key: str | None) -> int:
        answer = await self._aretried("emit", lambda: self.aport_call("emit", self.worker, self.claim, item,
                                                                      key=key))
        return int(answer["seq"])

    # -- usage settled after the call -------------------------------------------

    def consume(self, limit_key: str, units: int, *, key: str | None = None) -> Any:
        """Charge what a call actually used, once it has returned: ``units`` of ``limit_key``.

        ``ctx.consume("openai-tokens", response.usage.total_tokens)`` in a sync handler,
        ``await ctx.consume(...)`` in an async one (or ``await ctx.aconsume(...)`` anywhere
        async). The charge is an entry of the task's ledger (keyed ``<task key>:consume:
        <limit key>:<position>``, or ``<task key>:consume:<key>`` with ``key=``), written
        under the lease: an attempt that replays the handler reaches the entry and charges
        nothing twice. For a limit the task names (``limits=``), the claim reserved its
        ``units`` in the limit's rate bucket and windows; consumption draws that reservation
        down first and only charges past it, and what it leaves unused comes back when the
        attempt ends. Any other key is charged as it comes (a key without a limit set only
        counts against the task's budget and the day's spend).

        Returns ``{"state": "charged" | "replayed", "units", "spent", "budget", ...}``
        (``spent`` and ``budget``: the task's, of this key). When ``spent`` goes past the
        task's ``budget`` (``enqueue(..., budget={...})``), the attempt stops here, cleanly:
        the task waits in ``awaiting_approval`` with the figures, and an approval (with
        ``raise_budget=``) resumes it; the next attempt replays the handler from its ledger.
        Raises :class:`leaseq.LeaseLost` once the lease is gone (a stale attempt charges
        nothing); :class:`leaseq.InvalidInput` for a bad key or a negative ``units``.
        """
        limit_key, units, ledger = self._consume_args(limit_key, units, key)
        if not self.handler_is_async:
            return self._consumed(self._call_consume(ledger, limit_key, units))
        return self._await_consume(ledger, limit_key, units)

    async def aconsume(self, limit_key: str, units: int, *, key: str | None = None) -> dict[str, Any]:
        """:meth:`consume`, awaited (from any async code of the handler)."""
        limit_key, units, ledger = self._consume_args(limit_key, units, key)
        return await self._await_consume(ledger, limit_key, units)

    def consume_blocking(self, limit_key: str, units: int, *, key: str | None = None) -> dict[str, Any]:
        """:meth:`consume`, blocking the calling thread even in an async handler's code (a sync
        framework's node or callback); never on the event loop of an async handler."""
        limit_key, units, ledger = self._consume_args(limit_key, units, key)
        return self._consumed(self._call_consume(ledger, limit_key, units))

    def _consume_args(self, limit_key: Any, units: Any, key: str | None) -> tuple[str, int, str]:
        from ..engine.budgets import check_consume
        from .tools import tool_key
        self.check()
        limit_key, units = check_consume(limit_key, units)
        if key is None:
            return limit_key, units, _ledger_key(self.task.idempotency_key, f"consume:{limit_key}",
                                                 self.next_tool_position(f"leaseq:consume:{limit_key}"))
        if not isinstance(key, str) or not key:
            raise InvalidInput("key", f"must be a non-empty string naming the entry (got {key!r})")
        return limit_key, units, tool_key(self.task.idempotency_key, "consume", key)

    async def _await_consume(self, ledger: str, limit_key: str, units: int) -> dict[str, Any]:
        return self._consumed(await self._aretried("consume", lambda: self.aport_call(
            "consume", self.worker, self.claim, ledger, limit_key, units)))

    def _call_consume(self, ledger: str, limit_key: str, units: int) -> dict[str, Any]:
        return self._retried("consume", lambda: self.port_call("consume", self.worker, self.claim, ledger,
                                                               limit_key, units))

    def _consumed(self, answer: dict[str, Any]) -> dict[str, Any]:
        if answer.get("state") != "paused":
            return answer
        # the guarded write that charged the units ended the lease: the task waits for a person
        figures = answer.get("figures") or {"key": answer.get("limit_key"), "spent": answer.get("spent"),
                                            "budget": answer.get("budget")}
        ended = self._budget_spent(figures)
        self.suspended = answer
        raise ended

    @property
    def loss_told(self) -> bool:
        """True once the lease is known to be gone: the queue refused it (heartbeat
        refused, cancelled, revoked, reclaimed) or the worker gave it up; False
        while it is held or only presumed lost on the worker's clock."""
        return self._lost and not self.loss_inferred

    def may_last_until(self) -> float:
        """The latest monotonic time the lease may still be live in the database:
        the last renewal sent (answered or not) plus the lease length."""
        return max(self.renewed_at, self.renewal_sent_at) + self.claim.lease_seconds

    def mark_lost(self, reason: str, *, inferred: bool = False) -> bool:
        """Record the loss (runtime use). Returns False if nothing changed: it was
        already lost (a presumed loss is only turned into a known one).

        ``inferred``: judged on the worker's clock only. The handler is stopped
        the same way (``check()`` and new effects refuse), but a success it still
        returns is sent once to the queue, whose guard decides.
        """
        with _LOSS_LOCK:  # one caller wins, whichever threads race here
            if self._lost and (inferred or not self.loss_inferred):
                return False
            self.lost_reason = reason
            self.loss_inferred = inferred
            self._lost = True
            event = self._lost_event
        if event is not None:
            event.set()
        return True

    def _refused(self, exc: LeaseLost) -> None:
        """A guarded call of this context was refused: the lease is gone."""
        if self.mark_lost(exc.reason) and self.on_lost is not None:
            self.on_lost(self, exc.reason)

    # -- the tasks this one waited for ----------------------------------------

    def results(self, after_ids: Iterable[int] | None = None) -> dict[int, Any]:
        """The results of the tasks this one waited for (``enqueue(..., after=[...])``).

        Returns ``{task id: result}``: every task it waited for, in id order,
        or those of ``after_ids`` in that order (an id it did not wait for is
        an :class:`~leaseq.InvalidInput`). The fan-in step of a fan-out::

            parts = [summarize.enqueue(doc=d).id for d in docs]
            merge.options(after=parts).enqueue()
            ...
            def merge(ctx):
                return combine(ctx.results().values())
        """
        return self._picked(self.port_call("dependency_results", self.task_id), after_ids)

    def _picked(self, found: dict[int, Any], after_ids: Iterable[int] | None) -> dict[int, Any]:
        if after_ids is None:
            return found
        if isinstance(after_ids, (str, bytes)) or not isinstance(after_ids, Iterable):
            raise InvalidInput("after_ids", f"must be a list of task ids (got {after_ids!r})")
        picked: dict[int, Any] = {}
        for task_id in after_ids:
            if task_id not in found:
                raise InvalidInput("after_ids", f"task {self.task_id} did not wait for task {task_id!r}")
            picked[task_id] = found[task_id]
        return picked

    async def aresults(self, after_ids: Iterable[int] | None = None) -> dict[int, Any]:
        """:meth:`results` for async handlers."""
        return self._picked(await self.aport_call("dependency_results", self.task_id), after_ids)

    # -- effects --------------------------------------------------------------

    def effect(self, action: str, key: str | None = None, *, resource: str | None = None) -> EffectScope:
        """Record the intent of a tool call, guarded by the lease, before making it.

        Use as ``with ctx.effect("email.send") as fx:`` (or ``async with``)::

            with ctx.effect("orders.pay", key=f"pay:{order}", resource=f"order:{order}") as fx:
                if not fx.replayed:
                    fx.record(shop.pay(order, headers={"Leaseq-Action-Token": fx.token,
                                                       "Idempotency-Key": fx.idempotency_key}))
            response = fx.response

        If an earlier attempt already recorded a response under the same key,
        ``fx.replayed`` is true and ``fx.response`` holds it: do not call again.
        Leaving the block normally without :meth:`EffectScope.record` records
        an empty response; leaving it with an exception leaves the intent open,
        which is the ambiguous case the recovery policy sends to reconciliation.
        ``resource`` binds the signed action token (``fx.token``) to that
        resource key: a fenced service refuses it for any other. The queue
        refuses an action the task did not declare (``actions=``), and every
        action of a read_only task.
        """
        return EffectScope(self, action, key, resource)

    def tool(self, fn: Callable[..., Any], *, action: str, effect: str = "side_effect",
             encode: Callable[[Any], Any] | None = None, decode: Callable[[Any], Any] | None = None) -> Tool:
        """Wrap ``fn`` so that each call of it in this handler is an entry of the action ledger.

        ``search = ctx.tool(web_search, action="web.search", effect="read_only")``,
        then ``search("leases")`` (``await`` it when ``fn`` is a coroutine
        function). Each call is keyed by the task's attempt-stable key, the
        action and the call's position among this action's calls (or a
        framework's tool-call id: :meth:`Tool.keyed`); a digest of its
        arguments is stored with it. On a retry a call whose response was
        recorded is not made again: its recorded response is returned (a
        ``tool_replayed`` event says so). A call with other arguments at a
        recorded position raises :class:`leaseq.ToolCallDiverged`: the attempt ends
        there and the task goes to ``needs_reconciliation`` naming the call. A
        ``side_effect`` call that began and never recorded its response sends
        the task to reconciliation instead of being repeated; an open
        ``read_only`` or ``idempotent`` call is simply made again.

        The response is recorded as JSON and every call returns the recorded
        form, first run and replay alike; ``encode`` turns ``fn``'s result into
        JSON and ``decode`` turns the recorded JSON back (both default to the
        value itself). See :func:`leaseq.tool` for the decorator form.
        """
        from .tools import Tool
        return Tool(self, fn, action=action, effect=effect, encode=encode, decode=decode)

    def next_tool_position(self, action: str) -> int:
        """The position of the next call of ``action`` in this attempt (0, 1, ...): its ledger key."""
        with _LOSS_LOCK:
            n = self._tool_positions.get(action, 0)
            self._tool_positions[action] = n + 1
        return n

    def call_effect(self, action: str, fn: Callable[[EffectScope], Any], *, key: str | None = None,
                    resource: str | None = None) -> Any:
        """Run ``fn(fx)`` as the effect ``action`` unless an earlier attempt already
        did; return its recorded response either way."""
        with self.effect(action, key, resource=resource) as fx:
            if not fx.replayed:
                fx.record(fn(fx))
        return fx.response

    # -- intents --------------------------------------------------------------

    def intend(self, kind: str, payload: Any = None, *, key: str, queue: str = "default",
               effect: str = "side_effect", approval: str | None = None, approval_deadline: float | None = None,
               **options: Any) -> int:
        """Record an intent for an executor: a child task of ``kind`` on ``queue``; returns its id.

        ``key`` names the intent within this task: the child's idempotency key
        is derived from this task's (attempt-stable) key and ``key``, and the
        call is an effect of this task (action ``intend:<kind>``) recorded in
        one transaction with the child, under the lease. A retried attempt that
        intends the same ``key`` is answered from the ledger with the same
        child id; no second intent is written. The same ``key`` with another
        kind, payload, queue or option is refused with
        :class:`leaseq.IdempotencyKeyConflict`. ``approval="required"`` gates
        the child on an operator's decision (``approval_deadline`` seconds at
        most). Other ``options``: ``priority``, ``max_attempts``,
        ``lease_seconds``, ``actions`` of the child. Async handlers:
        ``await ctx.aintend(...)``.
        """
        self.check()
        try:
            child = self.port_call("intend", self.worker, self.claim, kind, payload, key=key, queue=queue,
                                   effect=effect, approval=approval, approval_deadline=approval_deadline, **options)
        except LeaseLost as exc:
            self._refused(exc)
            raise
        return int(child.id)

    async def aintend(self, kind: str, payload: Any = None, *, key: str, queue: str = "default",
                      effect: str = "side_effect", approval: str | None = None,
                      approval_deadline: float | None = None, **options: Any) -> int:
        """:meth:`intend` for async handlers."""
        self.check()
        try:
            child = await self.aport_call("intend", self.worker, self.claim, kind, payload, key=key, queue=queue,
                                          effect=effect, approval=approval, approval_deadline=approval_deadline,
                                          **options)
        except LeaseLost as exc:
            self._refused(exc)
            raise
        return int(child.id)

    # -- child tasks ----------------------------------------------------------

    def spawn(self, kind: str, payload: Any = None, *, key: str | None = None, **options: Any) -> ChildHandle:
        """Enqueue a child task of ``kind`` with ``payload``, under this task's lease; returns
        its :class:`leaseq.ChildHandle`, for :meth:`wait_for`.

        ``key`` names the child within this task (default: its kind and its position among
        this attempt's spawns of that kind, ``<kind>:<n>``): the spawn is recorded in the
        task's ledger (``spawn:<key>``) in one transaction with the child, so a retried
        attempt that spawns the same ``key`` gets the same child back and never enqueues a
        second one. The child records its parent (``parent_id``). Options (``queue``,
        ``effect``, ``priority``, ``max_attempts``, ``lease_seconds``, ``actions``,
        ``timeout``, ``limits``, ``units``, ``resources``) default to those the kind is
        declared with in this worker's app (``@app.task``), else to the task's own queue and
        a read_only task. In an async handler ``await ctx.spawn(...)`` works too (the handle
        awaits to itself); :meth:`aspawn` does not block the event loop.
        """
        self.check()
        checks.check_kind(kind)
        if key is None:
            key = f"{kind}:{self.next_tool_position(f'leaseq:spawn:{kind}')}"
        try:
            child = self.port_call("spawn", self.worker, self.claim, kind, payload, key=key,
                                   **{**self._declared(kind), **options})
        except LeaseLost as exc:
            self._refused(exc)
            raise
        return ChildHandle(id=child.id, kind=child.kind, queue=child.queue, key=key)

    async def aspawn(self, kind: str, payload: Any = None, *, key: str | None = None,
                     **options: Any) -> ChildHandle:
        """:meth:`spawn`, awaited on the worker's event loop (no thread, no blocking)."""
        self.check()
        checks.check_kind(kind)
        if key is None:
            key = f"{kind}:{self.next_tool_position(f'leaseq:spawn:{kind}')}"
        try:
            child = await self.aport_call("spawn", self.worker, self.claim, kind, payload, key=key,
                                          **{**self._declared(kind), **options})
        except LeaseLost as exc:
            self._refused(exc)
            raise
        return ChildHandle(id=child.id, kind=child.kind, queue=child.queue, key=key)

    def _declared(self, kind: str) -> dict[str, Any]:
        """The enqueue options ``kind`` is declared with in this worker's app (none: not declared)."""
        definition = None if self.registry is None else self.registry.get(kind)
        if definition is None:
            return {}
        names = ("effect", "queue", "priority", "max_attempts", "lease_seconds", "actions", "timeout", "limits",
                 "units")
        return {name: getattr(definition, name) for name in names if getattr(definition, name, None) is not None}

    def wait_for(self, handle: ChildHandle | Task | int, timeout: float | None = None,
                 default: Any = _NO_DEFAULT) -> Any:
        """Wait durably for a child task (``ctx.spawn``) to end, and return its result.

        ``result = await ctx.wait_for(handle)`` in an async handler, without ``await`` in a
        sync one. A child that has ended answers at once. Else the attempt ends as in
        :meth:`sleep`: no lease, no slot, the task ``waiting`` until the child ends, when it
        is claimable again; the next attempt replays the handler up to here from the ledger
        (the spawn included: no second child) and gets the child's result, recorded in the
        ledger (``<task key>:children:<position>``). A child that ended without success
        (dead, cancelled, denied, expired) raises :class:`leaseq.ChildFailed` here, which the
        handler may catch. With ``timeout`` (seconds from the first attempt that waited) a
        child that has not ended by then ends the wait: the next attempt raises
        :class:`leaseq.WaitTimedOut` here, or returns ``default`` if one is given; the
        timeout is recorded in the ledger, so a retried attempt raises it (or returns the
        default) again at the same place instead of waiting anew. The child itself runs on.
        """
        return self._children([handle], timeout, default, one=True)

    def wait_for_all(self, handles: Iterable[ChildHandle | Task | int], timeout: float | None = None,
                     default: Any = _NO_DEFAULT) -> Any:
        """:meth:`wait_for` for several children (a fan-in): their results, in the order given,
        once every one has ended (``results = await ctx.wait_for_all([h1, h2, h3])``). If any
        ended without success, :class:`leaseq.ChildFailed` names the first of them in that
        order. With ``timeout``, as :meth:`wait_for`: :class:`leaseq.WaitTimedOut` (or
        ``default``, in place of the list) when some had not ended in time."""
        if isinstance(handles, (str, bytes, dict)) or not isinstance(handles, Iterable):
            raise InvalidInput("handles", f"must be a list of handles ctx.spawn returned (got {handles!r})")
        return self._children(list(handles), timeout, default, one=False)

    def _children(self, handles: list[Any], timeout: float | None, default: Any, *, one: bool) -> Any:
        ids = [_child_id(h) for h in handles]
        if timeout is not None:
            checks.check_seconds("timeout", timeout, allow_zero=True, maximum=MAX_WAIT_SECONDS)
        return self._wait("children", lambda: {"children": ids, "timeout": timeout, "one": one}, default)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
