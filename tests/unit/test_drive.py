"""The engine's drivers inside a transaction the caller holds: they run statements
there and refuse an operation that would begin or commit one of its own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import leaseq
from leaseq.engine.drive import adrive_in, drive_in
from leaseq.engine.steps import BEGIN, COMMIT, one, rows


class RecordingTx:
    """A transaction that answers every statement with one row naming it."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def rows(self, query: str, **params: Any) -> list[dict[str, Any]]:
        self.ran.append(query)
        return [{"query": query, **params}]

    def row(self, query: str, **params: Any) -> dict[str, Any]:
        return self.rows(query, **params)[0]


class AsyncRecordingTx(RecordingTx):
    async def rows(self, query: str, **params: Any) -> list[dict[str, Any]]:  # type: ignore[override]
        return RecordingTx.rows(self, query, **params)


def statements() -> Any:
    first = yield one("first", n=1)
    both = yield rows("second")
    return first["n"], len(both)


def committing(step: Any) -> Any:
    yield one("first")
    yield step
    return "never"


def test_both_drivers_answer_the_same_steps_in_the_callers_transaction() -> None:
    tx, atx = RecordingTx(), AsyncRecordingTx()
    assert drive_in(tx, statements()) == (1, 1)
    assert asyncio.run(adrive_in(atx, statements())) == (1, 1)
    assert tx.ran == atx.ran == ["first", "second"]


@pytest.mark.parametrize("step", [BEGIN, COMMIT], ids=["begin", "commit"])
def test_both_drivers_refuse_an_operation_that_begins_or_commits(step: Any) -> None:
    tx, atx = RecordingTx(), AsyncRecordingTx()
    with pytest.raises(TypeError, match="caller's transaction"):
        drive_in(tx, committing(step))
    with pytest.raises(TypeError, match="caller's transaction"):
        asyncio.run(adrive_in(atx, committing(step)))
    assert tx.ran == atx.ran == ["first"]


def test_ajoined_needs_a_backend_with_an_asyncio_driver(tmp_path) -> None:
    q = leaseq.connect(f"sqlite:///{tmp_path / 'q.db'}")
    q.migrate()

    async def enter() -> None:
        async with q.ajoined():
            pass

    with pytest.raises(TypeError, match="use joined"):
        asyncio.run(enter())
    q.close()
