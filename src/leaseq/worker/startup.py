"""Starting a worker through infrastructure trouble.

A worker that starts while the database or ``leaseq serve`` is restarting,
a pooler drops its connections, or the service answers "too many requests"
must wait for the queue, not die: opening its transport (for an
:class:`~leaseq.App`, connecting and migrating) and registering its identity
are retried with backoff for as long as the trouble lasts. A refusal (a
refused token, invalid input, a bad configuration) is final and raised at
once; a stop request ends the wait. A PostgreSQL server that answers but
refuses the login (a wrong password or role, an unknown database) is a
refusal too (:class:`~leaseq.ConfigError`), not a wait.

The first failed try is logged once, at WARNING, saying that the worker
waits; the tries after it at DEBUG; success after a wait at INFO.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..core import errors
from ..core.timers import wait_event
from .completer import INITIAL_BACKOFF, next_backoff

logger = logging.getLogger("leaseq.worker")

#: The longest pause between two tries.
MAX_START_BACKOFF = 5.0


async def until_done(what: str, attempt: Callable[[], Awaitable[Any]], *, name: str, wake: asyncio.Event,
                     stopping: Callable[[], bool], on_retry: Callable[[], None]) -> tuple[bool, Any]:
    """Await ``attempt()`` until it succeeds: ``(True, value)``; or until ``stopping()``
    (checked before each try and after each pause; ``wake`` cuts a pause short):
    ``(False, None)``. Transient errors are retried with jittered backoff (or the
    service's Retry-After); any other error is raised."""
    backoff, tries, began = INITIAL_BACKOFF, 0, time.monotonic()
    while not stopping():
        try:
            value = await attempt()
        except Exception as exc:
            if not errors.is_transient(exc):
                raise
            tries += 1
            on_retry()
            pause, backoff = next_backoff(backoff, exc)
            backoff = min(backoff, MAX_START_BACKOFF)
            if tries == 1:  # one line says the worker waits; each further try is a debug line
                logger.warning("worker %s: %s failed (%s); waiting for the queue, trying again until it "
                               "answers", name, what, _one_line(exc))
            else:
                logger.debug("worker %s: %s failed again (%s); retrying in %.2fs", name, what, _one_line(exc),
                             pause)
            wake.clear()
            if stopping():
                break
            await wait_event(wake, pause)
        else:
            if tries:
                logger.info("worker %s: %s succeeded after %d failed tries (%.1fs)", name, what, tries,
                            time.monotonic() - began)
            return True, value
    return False, None


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (drivers put newlines and tabs in theirs)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
