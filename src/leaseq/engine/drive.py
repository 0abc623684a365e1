"""The two drivers of engine operations: one blocking, one on the event loop.

Both run the same steps the same way (see :mod:`leaseq.engine.steps`):
:func:`drive` with the backend's transactions, :func:`adrive` with its
asyncio transactions where the backend declares ``native_async``
(PostgreSQL), else by running :func:`drive` in a thread (sqlite3 has no
asyncio form). :func:`drive_in` runs an operation inside a transaction the
caller already holds (:func:`adrive_in`, an asyncio one).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..store.base import Store, Tx
from .steps import Begin, Commit, One, Op, Rows, Script, T, Together


def _answer(tx: Any, step: Any) -> Any:
    if type(step) is Rows:
        return tx.rows(step.query, **step.params)
    if type(step) is One:
        return tx.row(step.query, **step.params)
    if type(step) is Together:
        run = getattr(tx, "rows_together", None)
        if run is None:  # a backend (or a caller's transaction) that sends one statement at a time
            return [tx.rows(s.query, **s.params) for s in step.steps]
        return run([(s.query, s.params) for s in step.steps])
    tx.script(step.sql)
    return None


def drive(store: Store, op: Op[T]) -> T:
    """Run ``op`` to its end on ``store``, blocking; returns its result."""
    cm: Any = None
    tx: Any = None
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = op.send(answer) if error is None else op.throw(error)
        except StopIteration as stop:
            if cm is not None:
                cm.__exit__(None, None, None)
            result: T = stop.value
            return result
        except BaseException as exc:
            if cm is not None and cm.__exit__(type(exc), exc, exc.__traceback__):
                return None  # type: ignore[return-value]  # never: the backends' transactions swallow nothing
            raise
        answer = error = None
        if type(step) is Rows or type(step) is One or type(step) is Together or type(step) is Script:
            try:
                answer = _answer(tx, step)
            except BaseException as exc:  # the statement failed: its transaction ends here, rolled back
                ending, cm, tx = cm, None, None
                try:
                    ending.__exit__(type(exc), exc, exc.__traceback__)
                    error = exc
                except BaseException as mapped:  # the backend's own error for it (e.g. KeyConflict)
                    error = mapped
        elif type(step) is Begin:
            cm = store.transaction(one_statement=step.one_statement)
            tx = cm.__enter__()
        elif type(step) is Commit:
            ending, cm, tx = cm, None, None
            try:
                ending.__exit__(None, None, None)
            except BaseException as exc:
                error = exc
        else:  # pragma: no cover - a programming error in an operation
            raise TypeError(f"an operation yielded {step!r}, not a step")


def drive_in(tx: Tx, op: Op[T]) -> T:
    """Run ``op``, which must not begin or commit, inside the caller's open transaction ``tx``."""
    answer: Any = None
    while True:
        try:
            step = op.send(answer)
        except StopIteration as stop:
            result: T = stop.value
            return result
        if type(step) is Begin or type(step) is Commit:
            raise TypeError("drive_in runs steps inside the caller's transaction: the operation may not "
                            "begin or commit one")
        answer = _answer(tx, step)


async def _aanswer(atx: Any, step: Any) -> Any:
    """:func:`_answer` for an asyncio transaction (whose ``rows`` and ``script`` are awaited)."""
    if type(step) is Script:
        await atx.script(step.sql)
        return None
    if type(step) is Together:
        run = getattr(atx, "rows_together", None)
        if run is None:
            return [await atx.rows(s.query, **s.params) for s in step.steps]
        return await run([(s.query, s.params) for s in step.steps])
    found = await atx.rows(step.query, **step.params)
    if type(step) is One:
        return found[0] if found else None
    return found


async def adrive_in(atx: Any, op: Op[T]) -> T:
    """:func:`drive_in` for asyncio code: ``op`` runs inside the caller's open asyncio transaction ``atx``."""
    answer: Any = None
    while True:
        try:
            step = op.send(answer)
        except StopIteration as stop:
            result: T = stop.value
            return result
        if type(step) is Begin or type(step) is Commit:
            op.close()
            raise TypeError("adrive_in runs steps inside the caller's transaction: the operation may not "
                            "begin or commit one")
        answer = await _aanswer(atx, step)


async def adrive(store: Store, op: Op[T]) -> T:
    """Run ``op`` to its end for asyncio code: on the event loop where the
    backend has an asyncio driver, else in a thread."""
    if not store.capabilities.native_async:
        return await asyncio.to_thread(drive, store, op)
    cm: Any = None
    tx: Any = None
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = op.send(answer) if error is None else op.throw(error)
        except StopIteration as stop:
            if cm is not None:
                await cm.__aexit__(None, None, None)
            result: T = stop.value
            return result
        except BaseException as exc:
            if cm is not None and await cm.__aexit__(type(exc), exc, exc.__traceback__):
                return None  # type: ignore[return-value]
            raise
        answer = error = None
        if type(step) is Rows or type(step) is One or type(step) is Together or type(step) is Script:
            try:
                answer = await _aanswer(tx, step)
            except BaseException as exc:  # includes cancellation: the transaction is rolled back
                ending, cm, tx = cm, None, None
                try:
                    await ending.__aexit__(type(exc), exc, exc.__traceback__)
                    error = exc
                except BaseException as mapped:
                    error = mapped
        elif type(step) is Begin:
            cm = store.atransaction(one_statement=step.one_statement)
            tx = await cm.__aenter__()
        elif type(step) is Commit:
            ending, cm, tx = cm, None, None
            try:
                await ending.__aexit__(None, None, None)
            except BaseException as exc:
                error = exc
        else:  # pragma: no cover
            raise TypeError(f"an operation yielded {step!r}, not a step")
