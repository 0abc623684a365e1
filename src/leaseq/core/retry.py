"""Retrying on request and by policy: :class:`Retry` and :class:`RetryPolicy`. No I/O.

A handler that is told to come back later (a provider's 429 with
``Retry-After``) raises :class:`Retry`: the attempt ends without counting as
a failure, and the task is claimable again ``after`` seconds later by the
database's clock. A kind's :class:`RetryPolicy` decides what a *failure*
does: which exceptions are retried, after how long, and which give up at once.
Neither changes what an *expired lease* may do: the recovery policy by effect
class (in SQL) still decides that.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInput

#: The longest wait a Retry may ask for (and the longest backoff cap): ten years.
MAX_RETRY_SECONDS = 10 * 365 * 86400.0
#: Retries on request a task may make before the next one counts as a failure.
DEFAULT_MAX_SNOOZES = 100


def _seconds(field: str, value: Any, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(field, f"must be a finite number of seconds (got {value!r})")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidInput(field, f"must be {'at least 0' if allow_zero else 'greater than 0'} (got {value})")
    if value > MAX_RETRY_SECONDS:
        raise InvalidInput(field, f"must be at most {MAX_RETRY_SECONDS:g} seconds (got {value})")
    return float(value)


class Retry(Exception):
    """Raise from a task handler to end the attempt and run it again ``after`` seconds later.

    ``raise leaseq.Retry(after=30, reason="rate limited (429)")``: the task
    goes back to ``queued``, claimable ``after`` seconds from now by the
    database's clock, with a ``retry_requested`` event carrying ``reason``.
    It is not a failure: the attempt is given back (``attempts`` does not
    grow), the error streak that quarantines a task is left alone, and the
    kind's retry policy is not consulted. Each request counts in the task's
    ``snoozes``; past the queue's ``max_snoozes`` a request is recorded as a
    failure instead, so a task cannot put itself off for ever. A side-effect
    task with an intent still open goes to ``needs_reconciliation``, as a
    failure would: running it again could repeat the call.
    """

    def __init__(self, after: float = 0.0, reason: str = "retry requested"):
        self.after = _seconds("after", after, allow_zero=True)
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInput("reason", f"must be a non-empty string (got {reason!r})")
        self.reason = reason
        super().__init__(f"retry in {self.after:g}s: {reason}")


def _exception_types(field: str, value: Any) -> tuple[type[BaseException], ...]:
    if isinstance(value, type):
        value = (value,)
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidInput(field, f"must be a tuple of exception classes (got {value!r})")
    types = tuple(value)
    for i, item in enumerate(types):
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise InvalidInput(f"{field}[{i}]", f"must be an exception class (got {item!r})")
    return types


@dataclass(frozen=True)
class RetryPolicy:
    """How a kind's failed attempts are retried: ``@app.task(..., retry=RetryPolicy(...))``.

    The delay before retry number ``n`` (the attempt that failed was the
    ``n``-th) is ``d = min(cap, base * 2**(n-1))``, less a random part of up
    to ``jitter * d``: it lies in ``[d * (1 - jitter), d]``. ``jitter=0``
    makes it exact, ``jitter=1`` spreads it over ``[0, d]``.

    ``give_up_on``: exceptions that send the task to ``dead`` at once (no
    retry). ``retry_on``: when given, only these exceptions are retried; any
    other failure is final as well. ``give_up_on`` wins when both match.
    Attempts (``max_attempts``) and the same-error quarantine still apply.
    """

    base: float = 1.0
    cap: float = 3600.0
    jitter: float = 0.5
    retry_on: tuple[type[BaseException], ...] = ()
    give_up_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        base = _seconds("base", self.base, allow_zero=False)
        cap = _seconds("cap", self.cap, allow_zero=False)
        if cap < base:
            raise InvalidInput("cap", f"must be at least base ({base:g}), got {cap:g}")
        jitter = self.jitter
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 1:
            raise InvalidInput("jitter", f"must be a fraction from 0 to 1 (got {jitter!r})")
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "cap", cap)
        object.__setattr__(self, "jitter", float(jitter))
        object.__setattr__(self, "retry_on", _exception_types("retry_on", self.retry_on))
        object.__setattr__(self, "give_up_on", _exception_types("give_up_on", self.give_up_on))

    def ceiling(self, attempt: int) -> float:
        """The un-jittered delay after failed attempt ``attempt`` (1-based): ``min(cap, base * 2**(attempt-1))``."""
        try:
            return min(self.cap, math.ldexp(self.base, max(1, int(attempt)) - 1))
        except OverflowError:  # far past the cap
            return self.cap

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt``: within ``[c * (1 - jitter), c]``,
        where ``c = ceiling(attempt)``."""
        c = self.ceiling(attempt)
        return c - self.jitter * c * (rng or random).random()

    def retries(self, exc: BaseException) -> bool:
        """Whether a failure raising ``exc`` may be retried (before attempts and quarantine are counted)."""
        if self.give_up_on and isinstance(exc, self.give_up_on):
            return False
        return not self.retry_on or isinstance(exc, self.retry_on)

    def describe(self) -> dict[str, Any]:
        """The policy as plain data (logs, evidence)."""
        return {"base": self.base, "cap": self.cap, "jitter": self.jitter,
                "retry_on": [t.__name__ for t in self.retry_on], "give_up_on": [t.__name__ for t in self.give_up_on]}


#: The policy of a kind declared without one: the queue's long-standing 1 s - 1 h backoff.
DEFAULT_POLICY = RetryPolicy()
