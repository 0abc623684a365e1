"""Shared commits: concurrent calls on one event loop share a transaction and its commit.

Every enqueue on PostgreSQL wakes the workers with NOTIFY, and PostgreSQL lets one
transaction that has notified commit at a time (each holds a lock of the whole server
from its notification until its commit is on disk). Fifty coroutines each awaiting an
enqueue of its own (a web server under load) therefore commit one after another, each
waiting out the one before it: as fast as one caller, whatever the pool. Here the calls
that arrive while earlier ones are being written go together in the next transaction, so
they pay for one commit, and one NOTIFY, between them. Their statements of one statement
each (an enqueue's insert) are sent together and answered in one round trip (psycopg's
pipeline mode), so a transaction of fifty enqueues costs about what one enqueue's does.

Each call keeps what it had alone:

* its result only once its transaction has committed, and the error it would have had;
* its own transaction's effects all or none (a shared transaction holds several calls'
  effects whole; a call is never split);
* the order of the calls it shares with: each sees the effects of those before it, as it
  would had they committed first (the same idempotency key twice: the second call finds
  the first's task).

A call alone, which is every call of a caller that waits for each, runs exactly as
:func:`~leaseq.engine.drive.adrive` runs it. A call whose operation fails before it sends a
statement (its arguments refused) fails alone. When a statement of the shared transaction
fails, the transaction is rolled back and its calls run again one by one, each in its own
transaction, so each gets its own outcome; except when the database could not be reached,
which every call of the transaction is told, as it would have been alone. A failed commit
is never run again (it may have committed): its calls get its error.

A call cancelled while it waits for its turn is dropped; one cancelled after its
transaction started may still commit, as a call cancelled during its own commit may.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..core.errors import is_transient
from ..store.base import Store
from .drive import _aanswer, adrive
from .steps import Begin, Commit, One, Op, Rows, Script, T, Together

#: the most calls one transaction holds
MOST = 100
#: transactions of shared calls in flight at once, per event loop; each takes this share of the
#: calls waiting when it starts (their statements run in it while the others' run beside it: the
#: commits are what must take turns)
FLUSHERS = 4


class _Broken(Exception):
    """The shared transaction can no longer commit: ``cause`` failed inside it."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class SharedCommits:
    """The calls of one event loop waiting to be written, and the transactions writing them."""

    def __init__(self, store: Store):
        self._store = store
        self._waiting: list[tuple[Callable[[], Op[Any]], asyncio.Future[Any]]] = []
        self._writing = 0
        self._writers: set[asyncio.Task[None]] = set()

    async def run(self, make: Callable[[], Op[T]]) -> T:
        """Run the operation ``make()`` returns, in a transaction shared with the calls that
        arrive while others are being written; its result once that transaction committed."""
        if not self._writing and not self._waiting:  # nothing being written: alone, as adrive runs it
            self._writing += 1
            try:
                return await adrive(self._store, make())
            finally:
                self._writing -= 1
                self._start()
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiting.append((make, done))
        self._start()
        return await done

    def _start(self) -> None:
        if self._waiting and self._writing < FLUSHERS:
            self._writing += 1
            writer = asyncio.get_running_loop().create_task(self._write())
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)

    async def _write(self) -> None:
        try:
            while self._waiting:
                # a share of those waiting, so the writers' transactions run side by side
                take = min(MOST, -(-len(self._waiting) // FLUSHERS))
                batch = [(m, f) for m, f in self._waiting[:take] if not f.done()]
                del self._waiting[:take]
                if len(batch) == 1:
                    await _alone(self._store, *batch[0])
                elif batch:
                    await self._together(batch)
        finally:
            self._writing -= 1

    async def _together(self, batch: list[tuple[Callable[[], Op[Any]], asyncio.Future[Any]]]) -> None:
        written: list[tuple[asyncio.Future[Any], Any]] = []
        refused: list[tuple[asyncio.Future[Any], BaseException]] = []
        try:
            await self._shared(batch, written, refused)
        except _Broken:
            await _one_by_one(self._store, batch)
            return
        except Exception as exc:  # the commit failed (it may have committed), or no connection came
            for _, done in batch:
                if not done.done():
                    done.set_exception(exc)
            return
        except BaseException:  # the writer itself was cancelled (its loop is ending)
            for _, done in batch:
                done.cancel()
            raise
        for done, value in written:
            if not done.done():
                done.set_result(value)
        for done, error in refused:
            if not done.done():
                done.set_exception(error)

    async def _shared(self, batch: list[tuple[Callable[[], Op[Any]], asyncio.Future[Any]]],
                      written: list[tuple[asyncio.Future[Any], Any]],
                      refused: list[tuple[asyncio.Future[Any], BaseException]]) -> None:
        """The calls of ``batch`` in one transaction, committed.

        Its calls' own transactions run in rounds: in each, every call's next one, in the
        calls' order. The one-statement transactions of a round (an enqueue's insert) are
        sent together and answered in one round trip where the backend's transaction can
        (``rows_together``); a call's transaction of several statements runs alone, its
        statements one after another, each answered before the next is made. So each call's
        transactions run in its own order and whole, each seeing those before it, as
        concurrent calls' transactions committed one after another would."""
        calls = [_Call(make(), done) for make, done in batch]
        try:
            async with self._store.atransaction() as tx:
                together = getattr(tx, "rows_together", None)
                ready = [call for call in calls if _advance(call, None, written, refused)]
                while ready:
                    ready = await _round(tx, together, ready, written, refused)
        finally:
            for call in calls:
                call.op.close()


class _Call:
    """A call of a shared transaction: its operation, its future, the statement it waits on."""

    __slots__ = ("op", "done", "step", "sent", "inside", "ended")

    def __init__(self, op: Op[Any], done: asyncio.Future[Any]):
        self.op = op
        self.done = done
        self.step: Any = None
        #: it ran a statement: a failure now breaks the shared transaction
        self.sent = False
        #: it is in a transaction of its own of several statements (Begin, not one_statement)
        self.inside = False
        #: how many of its own transactions it ended
        self.ended = 0


def _advance(call: _Call, answer: Any, written: list[tuple[asyncio.Future[Any], Any]],
             refused: list[tuple[asyncio.Future[Any], BaseException]]) -> bool:
    """Give ``call`` the answer to its statement; True when it waits on a statement again
    (``call.step``), False when it ended (its result in ``written``, or its refusal in
    ``refused``). Raises :class:`_Broken` when it failed after a statement of its ran."""
    op = call.op
    while True:
        try:
            step = op.send(answer)
        except StopIteration as stop:
            written.append((call.done, stop.value))
            return False
        except Exception as exc:
            if call.sent:
                raise _Broken(exc) from None
            refused.append((call.done, exc))  # before its first statement: it alone fails
            return False
        answer = None
        if type(step) is Rows or type(step) is One or type(step) is Together or type(step) is Script:
            call.step = step
            return True
        if type(step) is Begin:
            call.inside = not step.one_statement
        elif type(step) is Commit:
            call.inside = False
            call.ended += 1
        else:  # pragma: no cover
            raise _Broken(TypeError(f"an operation yielded {step!r}, not a step"))


async def _round(tx: Any, together: Any, calls: list[_Call], written: list[tuple[asyncio.Future[Any], Any]],
                 refused: list[tuple[asyncio.Future[Any], BaseException]]) -> list[_Call]:
    """Each of ``calls``' next transaction, in order (see :meth:`SharedCommits._shared`);
    the calls that wait on a statement of a later one, in order."""
    later: list[_Call] = []
    queued: list[_Call] = []  # one-statement transactions, to be sent together

    async def send_queued() -> None:
        if not queued:
            return
        steps = [call.step for call in queued]
        try:
            if together is not None and len(steps) > 1:
                found = await together([(step.query, step.params) for step in steps])
                answers = [(rows[0] if rows else None) if type(step) is One else rows
                           for step, rows in zip(steps, found)]
            else:
                answers = [await _aanswer(tx, step) for step in steps]
        except Exception as exc:
            raise _Broken(exc) from None
        for call, answer in zip(queued, answers):
            call.sent = True
            if _advance(call, answer, written, refused):
                later.append(call)
        queued.clear()

    for call in calls:
        if not call.inside and type(call.step) is not Script:
            queued.append(call)
            continue
        await send_queued()  # the transactions before this one first
        ended = call.ended
        while True:  # its own transaction, its statements in turn
            try:
                answer = await _aanswer(tx, call.step)
            except Exception as exc:
                raise _Broken(exc) from None
            call.sent = True
            if not _advance(call, answer, written, refused):
                break
            if call.ended != ended:  # its next transaction: in the next round
                later.append(call)
                break
    await send_queued()
    return later


async def _one_by_one(store: Store, batch: list[tuple[Callable[[], Op[Any]], asyncio.Future[Any]]]) -> None:
    """Each call again in its own transaction, in order, after their shared one failed; once a
    call finds the database out of reach, the calls after it are told so without trying."""
    unreachable: BaseException | None = None
    for make, done in batch:
        if done.done():
            continue
        if unreachable is not None:
            done.set_exception(unreachable)
            continue
        await _alone(store, make, done)
        if not done.cancelled() and (error := done.exception()) is not None and is_transient(error):
            unreachable = error


async def _alone(store: Store, make: Callable[[], Op[Any]], done: asyncio.Future[Any]) -> None:
    try:
        value = await adrive(store, make())
    except Exception as exc:
        if not done.done():
            done.set_exception(exc)
    except BaseException:  # the writer itself was cancelled (its loop is ending)
        done.cancel()
        raise
    else:
        if not done.done():
            done.set_result(value)
