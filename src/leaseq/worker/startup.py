"""Starting a worker through infrastructure trouble.

A worker that starts while the database or ``leaseq serve`` is restarting,
a pooler drops its connections, or the service answers "too many requests"
must wait for the queue, not die: opening its transport (for an
:class:`~leaseq.App`, connecting and migrating) and registering its identity
are retried with backoff for as long as the trouble lasts. A refusal (a
refused token, invalid input, a bad configuration) is final and raised at
once; a stop request ends the wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..auth import RateLimited
from ..core.errors import BackendUnavailable
from ..core.timers import wait_event
from .completer import INITIAL_BACKOFF, next_backoff

logger = logging.getLogger("leaseq.worker")

#: The longest pause between two tries.
MAX_START_BACKOFF = 5.0


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is the queue being out of reach for now (worth another try):
    unreachable or restarting (:class:`BackendUnavailable`, an OS-level network
    error) or rate limited. Anything else is an answer, and final."""
    return isinstance(exc, (BackendUnavailable, RateLimited, OSError))


async def until_done(what: str, attempt: Callable[[], Awaitable[Any]], *, name: str, wake: asyncio.Event,
                     stopping: Callable[[], bool], on_retry: Callable[[], None]) -> tuple[bool, Any]:
    """Await ``attempt()`` until it succeeds: ``(True, value)``; or until ``stopping()``
    (checked before each try and after each pause; ``wake`` cuts a pause short):
    ``(False, None)``. Transient errors are retried with jittered backoff (or the
    service's Retry-After); any other error is raised."""
    backoff, tries = INITIAL_BACKOFF, 0
    while not stopping():
        try:
            return True, await attempt()
        except Exception as exc:
            if not is_transient(exc):
                raise
            tries += 1
            on_retry()
            pause, backoff = next_backoff(backoff, exc)
            backoff = min(backoff, MAX_START_BACKOFF)
            (logger.warning if tries == 1 else logger.info)(
                "worker %s: %s failed (%r); retrying in %.2fs", name, what, exc, pause)
            wake.clear()
            if stopping():
                break
            await wait_event(wake, pause)
    return False, None
