"""Task progress streams: a handler's ``ctx.emit(item)``, and reading a task's stream after a cursor.

An emit appends one entry to the task's stream under the lease
(``append_stream``, with the lease guard, after ``lock_lease`` locked the
task row): the appends of one task are written one after the other, so an
entry's ``seq`` (1, 2, ...) orders the stream as it was committed and a
reader that resumes after a seq misses nothing. The first entry an attempt
writes is preceded by a ``reset`` entry of its generation, in the same
transaction: a reader that saw the items of generation 1 sees ``reset``
(generation 2) before any item of generation 2.

A durable emit (``ctx.emit(item, durable=True)``) is also an entry of the
action ledger, keyed by the handler's attempt-stable key
(``<task key>:emit:<position>``) and written in the same transaction. A
retried attempt that reaches the same emit finds it there: it is replayed
(the cursor it was given comes back), nothing is appended, so a durable
item is in the stream once, in the attempt that first emitted it. The
reset of a later attempt voids the earlier attempts' items that are not
durable (its handler runs from the top and emits them again); the durable
ones stand.

Readers (:class:`Cursor`) read a page at a time, after a cursor. Following
(``follow=True``, the default) waits between pages for the next entry, as
``tail -f`` does, until the task has ended or is parked for a person
(:data:`leaseq.engine.waits.SETTLED`): then what is left is read, and the
stream is over. The drivers wait on the task's own notification (PostgreSQL
LISTEN on ``leaseq_task_<id>``, where an emit of a watched task notifies
with the payload ``stream``) or, on SQLite, a short sleep.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..core import checks
from ..core.errors import InvalidInput, LeaseLost
from ..core.model import Held, StreamItem, Worker
from .common import Settings, check_claim, event, require_task, worker_id
from .durable import _entry, _lease, _record
from .steps import BEGIN, COMMIT, Op, one, rows
from .waits import LONGEST_SLEEP, SETTLED, check_timeout

#: The ledger action of a durable emit.
EMIT_ACTION = "leaseq.emit"
#: The largest item one emit may append (bytes of its JSON).
MAX_ITEM_BYTES = 64 * 1024
#: Entries one read of a stream returns at most.
PAGE = 100


def check_item(item: Any) -> Any:
    """A stream item: JSON, at most :data:`MAX_ITEM_BYTES` of it (field ``item``)."""
    if item is None or item is True or item is False or type(item) is int:
        return checks.check_json("item", item)
    if len(checks.encode_json("item", item)) > MAX_ITEM_BYTES:
        raise InvalidInput("item", f"is larger than the {MAX_ITEM_BYTES} byte limit of one stream item "
                                   "(emit a reference to where the bulk is kept)")
    return item


def check_cursor(after: Any, field: str = "after") -> int:
    """A stream cursor: the seq of the last entry read (0: from the start)."""
    if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= 2**63 - 1:
        raise InvalidInput(field, f"must be a stream cursor, an integer 0 or more (got {after!r})")
    return after


def check_follow(follow: Any) -> bool:
    """``follow``: True or False."""
    if not isinstance(follow, bool):
        raise InvalidInput("follow", f"must be true or false (got {follow!r})")
    return follow


def emit(s: Settings, worker: Worker | str, claim: Held, item: Any, *, key: str | None = None) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.emit`: append ``item`` to the task's stream under the lease.

    Answers ``{"seq": ..., "generation": ..., "replayed": False}``; with ``key`` (a
    durable emit) an entry an earlier attempt recorded under it is replayed instead:
    ``{"seq": <its seq>, "generation": <its generation>, "replayed": True}``, nothing appended.
    """
    wid = worker_id(worker)
    claim = check_claim(wid, claim)
    check_item(item)
    if key is not None:
        checks.check_key("key", key)
    yield BEGIN
    yield from _lease(claim, wid, "emit")  # the task row is locked: this task's appends go one at a time
    if key is not None:
        found = yield from _entry(s, claim, wid, key, EMIT_ACTION)
        if found is not None:
            yield COMMIT
            recorded = found["response"] or {}
            return {"seq": recorded.get("seq"), "generation": recorded.get("generation"), "replayed": True}
    written: list[dict[str, Any]] = yield rows("append_stream", task_id=claim.task_id, worker_id=wid,
                                               generation=claim.generation, item=item, ledger_key=key)
    if not written:  # lock_lease held it in this transaction: never
        raise LeaseLost(claim.task_id, claim.generation, "emit refused: lease no longer held")
    appended = next(r for r in written if r["type"] == "item")
    reset = next((r for r in written if r["type"] == "reset"), None)
    if reset is not None:
        yield from event(s, claim.task_id, "stream_started", claim.generation, wid, seq=reset["seq"])
    if key is not None:
        yield from _record(claim, wid, key, EMIT_ACTION, {"seq": appended["seq"], "generation": claim.generation,
                                                          "item": item})
    if appended["watched"]:
        yield rows("notify_stream", task_id=claim.task_id)
    yield COMMIT
    return {"seq": appended["seq"], "generation": claim.generation, "replayed": False}


def to_item(row: dict[str, Any]) -> StreamItem:
    """A stream row as a :class:`StreamItem`."""
    return StreamItem(task_id=row["task_id"], seq=row["seq"], generation=row["generation"], type=row["type"],
                      item=row["item"], durable=bool(row["durable"]), at=row["at"])


@dataclass(frozen=True)
class Page:
    """One read of a stream: the task's status when it was read, then the entries after the cursor."""

    status: str
    items: list[StreamItem]


def read(s: Settings, task_id: int, *, after: int = 0, limit: int = PAGE, watch: bool = False) -> Op[Page]:
    """Up to ``limit`` entries of the stream after ``after``, and the task's status read *before*
    them: a task already settled then wrote every entry the read returns. ``watch``: mark
    the task watched first (its end, and every emit, is notified from then on). NotFound if
    there is no such task."""
    task_id = checks.check_task_id(task_id)
    yield BEGIN
    if watch:
        yield rows("watch_task", task_id=task_id)
    task = yield from require_task(task_id)
    found: list[dict[str, Any]] = yield rows("list_stream", task_id=task_id, after=after, limit=limit)
    yield COMMIT
    return Page(status=str(task["status"]), items=[to_item(r) for r in found])


def stats(s: Settings, task_id: int) -> Op[dict[str, Any]]:
    """:meth:`leaseq.Queue.stream_stats`."""
    task_id = checks.check_task_id(task_id)
    yield BEGIN
    yield from require_task(task_id)
    found: list[dict[str, Any]] = yield rows("stream_stats", task_id=task_id)
    yield COMMIT
    attempts = [{"generation": r["generation"], "items": int(r["items"]), "durable": int(r["durable"]),
                 "first_seq": r["first_seq"], "last_seq": r["last_seq"], "first_at": r["first_at"],
                 "last_at": r["last_at"]} for r in found]
    return {"task_id": task_id, "items": sum(a["items"] for a in attempts),
            "durable": sum(a["durable"] for a in attempts), "attempts": attempts,
            "last_seq": max((a["last_seq"] for a in attempts), default=0)}


class Cursor:
    """One reader's place in a task's stream, and when its reading is over.

    Every driver (Queue, AsyncQueue, the service's server-sent events) runs the
    same loop: :meth:`read` (the first with ``first=True``, which also marks the
    task watched when following), hand the page to :meth:`take`, stop once
    :attr:`done` or :attr:`capped`, else wait :meth:`pause` seconds for a
    notification (0: look at once; None: the time is up) and read again.
    """

    def __init__(self, task_id: int, *, after: Any = 0, follow: Any = True, timeout: Any = None,
                 limit: int | None = None, page: int = PAGE):
        self.task_id = checks.check_task_id(task_id)
        #: the seq of the last entry taken: where the next read begins
        self.after = check_cursor(after)
        self.follow = check_follow(follow)
        timeout = check_timeout(timeout)
        self._deadline = None if timeout is None else time.monotonic() + timeout
        #: the most entries this reader takes (None: no cap)
        self.limit = limit
        self.page = page
        self.taken = 0
        #: the task's status at the last read
        self.status: str | None = None
        #: the stream is over: the task settled and every entry was read (or, not following,
        #: every entry there was)
        self.done = False
        self._asked = page
        self._full = False

    @property
    def capped(self) -> bool:
        """Whether this reader took the most entries it may (``limit``)."""
        return self.limit is not None and self.taken >= self.limit

    @property
    def deadline(self) -> float | None:
        """When this reader stops following (monotonic seconds; None: never)."""
        return self._deadline

    @property
    def settled(self) -> bool:
        """Whether the task had ended (or was parked for a person) at the last read."""
        return self.status in SETTLED

    def read(self, s: Settings, *, first: bool = False) -> Op[Page]:
        """The next page's read."""
        size = self.page if self.limit is None else max(1, min(self.page, self.limit - self.taken))
        self._asked = size
        return read(s, self.task_id, after=self.after, limit=size, watch=first and self.follow)

    def take(self, page: Page) -> list[StreamItem]:
        """The entries of ``page``, noting where the next read begins and whether the stream is over."""
        items = page.items
        self.status = page.status
        if items:
            self.after = items[-1].seq
            self.taken += len(items)
        self._full = len(items) >= self._asked
        if not self._full and (not self.follow or self.settled):
            self.done = True
        return items

    def pause(self) -> float | None:
        """Seconds to wait for a notification before the next read (0: read at once, a page came
        back full), or None: the reader's time is up."""
        if self._full:
            return 0.0
        left = LONGEST_SLEEP if self._deadline is None else self._deadline - time.monotonic()
        return None if left <= 0 else min(left, LONGEST_SLEEP)
