"""Tool calls as entries of the action ledger: ``ctx.tool(...)`` and ``@leaseq.tool(...)``.

A handler that calls tools (an agent's model requests, lookups, writes,
payments) wraps each tool once; every call then goes through the ledger of
:mod:`leaseq.engine.effects`, guarded by the lease:

- the call is keyed ``<task key>:<action>:<position>`` (the task's
  idempotency key is the same on every attempt; the position counts this
  action's calls within the attempt), or ``<task key>:<action>:<call id>``
  when a framework names its tool calls;
- a digest of its arguments is stored with it, and a retry that reaches the
  same key with other arguments raises :class:`leaseq.ToolCallDiverged`, its
  attempt ended and the task sent to reconciliation (the code changed under
  the recorded run);
- on a retry, a call whose response was recorded returns that response
  without running (``tool_replayed`` in the trail);
- a ``side_effect`` call left without a response (the worker died in it, or
  it raised) sends the task to reconciliation; a ``read_only`` or
  ``idempotent`` one is simply made again on the retry.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import hashlib
import inspect
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core import checks
from ..core.context import current_context as current_context
from ..core.errors import InvalidInput, Permanent
from ..engine.effects import EFFECT_CLASSES
from .effect_scope import EffectScope

if TYPE_CHECKING:  # pragma: no cover
    from .context import TaskContext

#: Ledger keys are at most this long; a longer one is replaced by its digest.
_KEY_MAX = 255
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _plain(value: Any) -> Any:
    """A JSON stand-in for a value json cannot write, the same on every run."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__type__": type(value).__qualname__, **dataclasses.asdict(value)}
    dump = getattr(value, "model_dump", None)  # pydantic models
    if callable(dump):
        return {"__type__": type(value).__qualname__, **dump(mode="json")}
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value))
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": bytes(value).hex()}
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    # Last resort: the type and repr, without the memory addresses that change per run.
    return {"__type__": f"{type(value).__module__}.{type(value).__qualname__}",
            "repr": _ADDRESS.sub("", repr(value))}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain)


def args_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The SHA-256 (hex) of a call's arguments in a canonical JSON form: equal arguments,
    equal digest, on every run and in every process."""
    return hashlib.sha256(_canonical({"args": list(args), "kwargs": kwargs}).encode()).hexdigest()


def tool_key(task_key: str, action: str, call: int | str) -> str:
    """The ledger key of one tool call of a task (``<task key>:<action>:<position or call id>``)."""
    key = f"{task_key}:{action}:{call}"
    if len(key) > _KEY_MAX:
        key = "tool:" + hashlib.sha256(key.encode()).hexdigest()
    return key


def check_effect(effect: Any) -> str:
    """A tool's ``effect=``: one of read_only, idempotent, side_effect."""
    value = getattr(effect, "value", effect)
    if not isinstance(value, str) or value not in EFFECT_CLASSES:
        raise InvalidInput("effect", f"must be one of {', '.join(EFFECT_CLASSES)} (got {effect!r})")
    return value


def context_for(ctx: TaskContext | None) -> TaskContext | None:
    """``ctx``, else the running handler's context (None outside a handler): adapters' default."""
    return ctx if ctx is not None else current_context.get()


def _is_async(fn: Callable[..., Any]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _same(value: Any) -> Any:
    return value


class Tool:
    """A callable wrapped by :meth:`leaseq.TaskContext.tool`: each call is a ledger entry.

    Call it as the wrapped function (``await`` it when that is a coroutine
    function). :meth:`keyed` makes a call keyed by a framework's tool-call id
    instead of its position.
    """

    def __init__(self, ctx: TaskContext, fn: Callable[..., Any], *, action: str, effect: str = "side_effect",
                 encode: Callable[[Any], Any] | None = None, decode: Callable[[Any], Any] | None = None,
                 decode_replayed: Callable[[Any], Any] | None = None):
        if not callable(fn):
            raise InvalidInput("fn", f"must be callable (got {fn!r})")
        self.ctx = ctx
        self.fn = fn
        self.action = checks.check_kind(action, "action")
        self.effect = check_effect(effect)
        self.encode = encode or _same
        self.decode = decode or _same
        #: how a replayed response is returned (default: as ``decode``); adapters use it
        #: to report a replayed model call's token usage as zero, not twice
        self.decode_replayed = decode_replayed or self.decode
        self.is_async = _is_async(fn)
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(None, args, kwargs)

    def keyed(self, call_id: str) -> Callable[..., Any]:
        """The tool, its next call keyed by ``call_id`` (a framework's tool-call id, stable
        across attempts because the model response that named it is replayed)."""
        checks.check_key("call_id", call_id)
        return lambda *args, **kwargs: self.call(call_id, args, kwargs)

    def call(self, call_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Make (or replay) one call; a coroutine when the tool is async."""
        if not self.is_async and self.ctx.on_worker_loop():
            # A blocking call on the worker's event loop (an async handler calling a sync tool)
            # stops every other handler and the lease renewals while it runs, and its guarded
            # writes wait on that loop: refused before anything is recorded or called.
            name = getattr(self.fn, "__name__", repr(self.fn))
            raise Permanent(f"tool {self.action!r} wraps a blocking function ({name}) and was called on the "
                            "worker's event loop from an async handler: the call would stall the loop (its other "
                            "handlers, its lease renewals) and can deadlock it. Wrap a coroutine function and "
                            "await the tool, or call it off the loop: await asyncio.to_thread(tool, ...)")
        scope = self._scope(call_id, args, kwargs)
        return self._acall(scope, args, kwargs) if self.is_async else self._call(scope, args, kwargs)

    def _scope(self, call_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> EffectScope:
        ctx = self.ctx
        ctx.check()
        call = call_id if call_id is not None else ctx.next_tool_position(self.action)
        key = tool_key(ctx.task.idempotency_key, self.action, call)
        return EffectScope(ctx, self.action, key, effect=self.effect, args_digest=args_digest(args, kwargs))

    def _call(self, scope: EffectScope, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with scope as fx:
            if not fx.replayed:
                fx.record(self.encode(self.fn(*args, **kwargs)))
        return (self.decode_replayed if fx.replayed else self.decode)(fx.response)

    async def _acall(self, scope: EffectScope, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        async with scope as fx:
            if not fx.replayed:
                await fx.arecord(self.encode(await self.fn(*args, **kwargs)))
        return (self.decode_replayed if fx.replayed else self.decode)(fx.response)


def tool(*, action: str, effect: str = "side_effect", encode: Callable[[Any], Any] | None = None,
         decode: Callable[[Any], Any] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a function a tool: inside a task handler each call of it is a ledger entry.

    ::

        @leaseq.tool(action="crm.lookup", effect="read_only")
        def lookup(customer: str) -> dict: ...

    Called from a handler the worker runs (directly or from code it calls,
    threads and tasks started with the context included), it behaves as
    ``ctx.tool(lookup, action=..., effect=...)``: recorded, replayed on a
    retry, routed to reconciliation when a side effect was left open.
    Called anywhere else (a test, a script) it is the plain function.
    """
    checks.check_kind(action, "action")
    effect = check_effect(effect)

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if _is_async(fn):
            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                ctx = current_context.get()
                if ctx is None:
                    return await fn(*args, **kwargs)
                return await Tool(ctx, fn, action=action, effect=effect, encode=encode, decode=decode)(
                    *args, **kwargs)
            wrapped: Callable[..., Any] = run_async
        else:
            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                ctx = current_context.get()
                if ctx is None:
                    return fn(*args, **kwargs)
                return Tool(ctx, fn, action=action, effect=effect, encode=encode, decode=decode)(*args, **kwargs)
            wrapped = run
        wrapped.leaseq_tool = {"action": action, "effect": effect}  # type: ignore[attr-defined]
        return wrapped

    return wrap
