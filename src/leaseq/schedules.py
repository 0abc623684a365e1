"""Schedules: one task per slot, however many workers run the app.

    app.schedule("digest", cron="*/5 * * * *", payload={"team": 7})
    app.schedule("poll_inbox", every=30)

A slot is a start time on a fixed grid: the cron expression's times, or
multiples of ``every`` seconds since the Unix epoch (UTC). Its task is
enqueued with the idempotency key ``schedule:<name>:<slot, UTC ISO>``, so
every worker (and every service replica behind them) that fires the same slot
writes the same key and the database keeps one task: uniqueness is the
queue's, not a coordinator's.

Every worker runtime whose app declares schedules runs :func:`run_schedules`
next to its claim loop. Each tick it reads the clock (the database's when the
worker's port is the direct one, :class:`leaseq.AsyncQueue`), enqueues the slots that started since
its previous tick, and sleeps until the next slot. After a pause (nothing
ran, or this worker was stopped) at most ``catch_up`` of the missed slots are
enqueued, the most recent ones; older ones are skipped.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from .core import checks
from .core.errors import IdempotencyKeyConflict, InvalidInput, install_line

logger = logging.getLogger("leaseq.worker.schedules")

#: The longest a scheduler sleeps before reading the clock again.
MAX_SLEEP = 5.0
#: Fired this long after a slot starts, so the clock read is past the boundary.
SLOT_MARGIN = 0.005
#: Shortest ``every``: slots are keyed to the microsecond, and a tick costs a query.
MIN_EVERY = 0.05
#: Longest ``every``: ten years, as for a task's ``delay``.
MAX_EVERY = 10 * 365 * 86400.0
#: Most missed slots a schedule may back-fill.
MAX_CATCH_UP = 1000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _cron(expr: Any) -> str:
    """A cron expression cronsim accepts (checked once, at declaration)."""
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidInput("cron", f"must be a cron expression such as '*/5 * * * *' (got {expr!r})")
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:  # pragma: no cover - the extra is not installed
        raise InvalidInput("cron", f"cron schedules need the cronsim package: {install_line('schedules')}") from None
    try:
        CronSim(expr, _EPOCH)
    except CronSimError as exc:
        raise InvalidInput("cron", f"{expr!r} is not a valid cron expression: {exc}") from None
    return expr.strip()


def _every_slot(n: int, every: float) -> datetime:
    # whole microseconds, so each worker derives the very same key
    return _EPOCH + timedelta(microseconds=round(n * every * 1_000_000))


@dataclass(frozen=True)
class Schedule:
    """A declared schedule: the task ``kind`` with ``payload`` at every slot.

    Exactly one of ``cron`` and ``every`` is set. ``options`` are the
    enqueue options its tasks get (the task declaration's, when the kind was
    declared with ``@app.task`` before the schedule).
    """

    name: str
    kind: str
    cron: str | None = None
    every: float | None = None
    payload: Any = None
    #: how many missed slots a tick may enqueue after a pause (the most recent)
    catch_up: int = 1
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def declare(cls, kind: Any, *, cron: Any = None, every: Any = None, payload: Any = None, name: Any = None,
                catch_up: Any = 1, options: dict[str, Any] | None = None) -> Schedule:
        """Check every field (:class:`InvalidInput` naming the first bad one) and build the schedule."""
        kind = checks.check_kind(kind)
        if (cron is None) == (every is None):
            raise InvalidInput("cron" if cron is None else "every",
                               "give exactly one of cron= (a cron expression) or every= (seconds)")
        if cron is not None:
            cron = _cron(cron)
        else:
            if isinstance(every, bool) or not isinstance(every, (int, float)) or not math.isfinite(every) \
                    or not MIN_EVERY <= every <= MAX_EVERY:
                raise InvalidInput("every", f"must be a number of seconds from {MIN_EVERY} to {MAX_EVERY:.0f} "
                                            f"(got {every!r})")
            every = float(every)
        checks.check_json("payload", payload)
        name = checks.check_name("name", kind if name is None else name)
        catch_up = checks.check_int("catch_up", catch_up, minimum=0, maximum=MAX_CATCH_UP)
        return cls(name=name, kind=kind, cron=cron, every=every, payload=payload, catch_up=catch_up,
                   options=dict(options or {}))

    @property
    def spec(self) -> str:
        """The schedule as written: the cron expression, or ``every <n>s``."""
        return self.cron if self.cron is not None else f"every {self.every:g}s"

    def key(self, slot: datetime) -> str:
        """The idempotency key of ``slot``'s task: the same in every worker."""
        return f"schedule:{self.name}:{slot.astimezone(timezone.utc).isoformat()}"

    def slots_before(self, now: datetime, count: int) -> list[datetime]:
        """The last ``count`` slots starting at or before ``now``, oldest first."""
        if count <= 0:
            return []
        now = now.astimezone(timezone.utc)
        if self.every is not None:
            last = math.floor(round((now - _EPOCH).total_seconds() / self.every, 9))
            return [_every_slot(n, self.every) for n in range(last - count + 1, last + 1)]
        from cronsim import CronSim

        # cronsim steps strictly before its start and to whole seconds: start
        # one second past now's second so a slot at exactly now is included.
        walk = CronSim(self._cron_expression(), now.replace(microsecond=0) + timedelta(seconds=1), reverse=True)
        found = []
        for slot in walk:
            found.append(slot.astimezone(timezone.utc))
            if len(found) == count:
                break
        return found[::-1]

    def next_slot(self, now: datetime) -> datetime:
        """The first slot starting after ``now``."""
        now = now.astimezone(timezone.utc)
        if self.every is not None:
            return _every_slot(math.floor(round((now - _EPOCH).total_seconds() / self.every, 9)) + 1, self.every)
        from cronsim import CronSim

        return next(iter(CronSim(self._cron_expression(), now.replace(microsecond=0)))).astimezone(timezone.utc)

    def _cron_expression(self) -> str:
        if self.cron is None:  # never: a schedule without every= has a cron expression
            raise RuntimeError(f"schedule {self.name!r} has neither cron nor every")
        return self.cron

    def due(self, previous: datetime | None, now: datetime) -> list[datetime]:
        """The slots a tick at ``now`` enqueues, oldest first, after a tick at ``previous``.

        The slots that started since ``previous``; of those (and, on the first
        tick, of the slots before ``now``) only the most recent ``catch_up``
        when the gap spans more than one (at least the newest, after the first
        tick): missed slots are not back-filled further.
        """
        if previous is None:
            return self.slots_before(now, self.catch_up)
        recent = self.slots_before(now, max(1, self.catch_up))
        return [slot for slot in recent if slot > previous]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (``leaseq schedules --json``)."""
        return {"name": self.name, "kind": self.kind, "cron": self.cron, "every": self.every,
                "payload": self.payload, "catch_up": self.catch_up, "queue": self.options.get("queue", "default")}


#: An awaited clock read.
Clock = Callable[[], Awaitable[datetime]]


async def _host_clock() -> datetime:
    return datetime.now(timezone.utc)


def transport_clock(transport: Any) -> Clock:
    """The clock slots are judged by: the database's for the direct port (:class:`leaseq.AsyncQueue`);
    elsewhere (the HTTP port) this host's, which decides only when a slot is fired,
    never how many tasks it gets."""
    from .aio import AsyncQueue  # late: the queue modules import the worker package

    if isinstance(transport, AsyncQueue):
        return transport.now
    return _host_clock


class Scheduler:
    """Fires ``schedules`` through ``transport.enqueue``: :meth:`tick` once, :meth:`run` until cancelled.

    ``transport`` is the worker's port (its ``enqueue`` is awaited) and ``clock``
    an awaited clock read (default: :func:`transport_clock`). A failed clock read or enqueue is logged and retried at
    the next tick; the slot's key makes a retry (or another worker's enqueue)
    harmless. A slot whose key already names a task enqueued with other
    options (another worker declares the schedule differently) was fired:
    it is logged and passed over. ``on_fire(schedule, slot, task)`` is told
    of each enqueue.
    """

    def __init__(self, schedules: Iterable[Schedule], transport: Any, clock: Clock | None = None,
                 on_fire: Callable[[Schedule, datetime, Any], None] | None = None):
        self.schedules = list(schedules)
        self.transport = transport
        self.clock = clock or transport_clock(transport)
        self.on_fire = on_fire
        #: per schedule, the clock at its last successful tick (None: not yet)
        self.previous: dict[str, datetime | None] = {s.name: None for s in self.schedules}

    async def tick(self) -> float:
        """Enqueue the due slots; returns the seconds until the next slot (never raises)."""
        pause = MAX_SLEEP
        try:
            now = await self.clock()
            started = time.monotonic()
            for schedule in self.schedules:
                for slot in schedule.due(self.previous[schedule.name], now):
                    try:
                        task = await self.transport.enqueue(schedule.kind, schedule.payload,
                                                            idempotency_key=schedule.key(slot), **schedule.options)
                    except IdempotencyKeyConflict as exc:
                        # The slot was fired already, by a worker whose declaration of the schedule
                        # differs (a deploy changed its payload or options): it has its task. Trying
                        # again would stall every schedule of this worker until the slot is past.
                        logger.warning("schedule %s: slot %s was fired already, as task %s with another %s; "
                                       "this worker's declaration differs", schedule.name, schedule.key(slot),
                                       exc.task_id, "/".join(exc.fields))
                        continue
                    # One line per slot and worker: the same key gives every worker the same task.
                    logger.info("schedule %s: slot %s -> task %s", schedule.name, schedule.key(slot), task.id)
                    if self.on_fire is not None:
                        self.on_fire(schedule, slot, task)
                self.previous[schedule.name] = now
                pause = min(pause, (schedule.next_slot(now) - now).total_seconds())
            return max(0.0, pause - (time.monotonic() - started)) + SLOT_MARGIN
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # unreachable, refused: the next tick tries again (same keys)
            logger.warning("schedules: firing failed (%r); retrying", exc)
            return 1.0

    async def run(self) -> None:
        """Tick at every slot until cancelled."""
        while True:
            await asyncio.sleep(await self.tick())


async def run_schedules(schedules: Iterable[Schedule], transport: Any, clock: Clock | None = None,
                        on_fire: Callable[[Schedule, datetime, Any], None] | None = None) -> None:
    """Fire ``schedules`` until cancelled (see :class:`Scheduler`)."""
    await Scheduler(schedules, transport, clock, on_fire).run()


def last_task(queue: Any, schedule: Schedule, now: datetime) -> tuple[datetime | None, Any]:
    """The latest slot at or before ``now`` and its task (None if it was not enqueued)."""
    slots = schedule.slots_before(now, 1)
    if not slots:
        return None, None
    with queue.store.transaction() as tx:
        row = tx.row("get_task_by_key", queue=schedule.options.get("queue", "default"),
                     idempotency_key=schedule.key(slots[0]))
    return slots[0], (None if row is None else {"id": row["id"], "status": row["status"]})
