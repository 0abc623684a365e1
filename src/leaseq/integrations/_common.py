"""What the framework adapters share: the handler context, tool classes, and request views."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.errors import InvalidInput
from ..worker.tools import check_effect, context_for

if TYPE_CHECKING:  # pragma: no cover
    from ..worker.context import TaskContext

#: Keys of a serialized request that differ between runs of the same request
#: (clocks, run ids, and the usage a replayed response reports as zero): left out
#: of the argument digest, so a replay is not a divergence.
VOLATILE_KEYS = frozenset({"timestamp", "run_id", "conversation_id", "created_at", "usage", "usage_metadata"})


def stable_view(value: Any, volatile: frozenset[str] = VOLATILE_KEYS) -> Any:
    """``value`` (JSON) without the keys that change between runs of the same request."""
    if isinstance(value, dict):
        return {k: stable_view(v, volatile) for k, v in value.items() if k not in volatile}
    if isinstance(value, list):
        return [stable_view(v, volatile) for v in value]
    return value


def running_context(ctx: TaskContext | None) -> TaskContext | None:
    """The handler context an adapter records into: the one given, else the running handler's."""
    return context_for(ctx)


class ToolClasses:
    """The class of each tool by name (``effects=``), ``default`` for the rest."""

    def __init__(self, effects: Mapping[str, str] | None = None, default: str = "side_effect"):
        if effects is not None and not isinstance(effects, Mapping):
            raise InvalidInput("effects", f"must map tool names to effect classes (got {effects!r})")
        self.default = check_effect(default)
        self.by_name = {name: check_effect(e) for name, e in (effects or {}).items()}

    def __call__(self, name: str) -> str:
        return self.by_name.get(name, self.default)


R = TypeVar("R")


class UsageSeen:
    """The token usage of the model response a ledgered request returned, read from the
    recorded response: the same whether it was made now or replayed (a replay reports
    zero usage to the framework, but the adapter's ``ctx.consume`` entry must still be
    reached, and charges what was recorded if an earlier attempt died before it did)."""

    def __init__(self, tokens: Callable[[Any], Any]):
        self._tokens = tokens
        self.units = 0

    def of(self, decode: Callable[[Any], R], then: Callable[[R], R] | None = None) -> Callable[[Any], R]:
        """``decode``, noting the decoded response's usage (``then``: what is returned instead)."""
        def seen(recorded: Any) -> R:
            response = decode(recorded)
            self.units = max(0, int(self._tokens(response) or 0))
            return response if then is None else then(response)
        return seen


# -- a person's decision, waited for durably ------------------------------------------

#: The signal a LangGraph ``interrupt`` waits for: its payload is the value ``interrupt()`` returns.
INTERRUPT_SIGNAL = "interrupt"
#: The prefix of the signal a tool call needing approval waits for: ``approval:<tool call id>``.
APPROVAL_PREFIX = "approval:"


def approval_signal(call_id: str) -> str:
    """The signal the approval of the tool call ``call_id`` waits for: ``approval:<call id>``."""
    return APPROVAL_PREFIX + call_id


class Decision:
    """A person's decision on a tool call, from a signal's payload: ``true`` or ``false``, or
    ``{"approved": true | false, "message": "why"}`` (``message``: what the model is told of a
    denial). A wait that timed out is a denial."""

    def __init__(self, approved: bool, message: str | None = None):
        self.approved = approved
        self.message = message

    @classmethod
    def of(cls, signal: str, payload: Any) -> Decision:
        """The decision the payload of ``signal`` carries; anything else is refused, naming the signal."""
        if payload is None:  # the wait's deadline passed: deny unless approved
            return cls(False, "No decision on this tool call came before its deadline.")
        if isinstance(payload, bool):
            return cls(payload)
        if isinstance(payload, dict) and isinstance(payload.get("approved"), bool) \
                and set(payload) <= {"approved", "message"} \
                and isinstance(payload.get("message"), (str, type(None))):
            return cls(payload["approved"], payload.get("message"))
        raise InvalidInput("payload", f"the signal {signal!r} must carry true, false or "
                                      f'{{"approved": true|false, "message": "..."}} (got {payload!r})')


async def await_decision(ctx: TaskContext, call_id: str, timeout: float | None) -> Decision:
    """Wait durably for the decision on the tool call ``call_id`` (the signal ``approval:<call id>``)."""
    name = approval_signal(call_id)
    return Decision.of(name, await ctx.await_for_signal(name, timeout=timeout, default=None))
