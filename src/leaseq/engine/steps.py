"""What an operation asks of the database: the steps an engine generator yields.

Every queue operation (:mod:`leaseq.engine`) is a generator that validates its
input, then yields these steps and reads their answers: it opens a
transaction, runs named queries (``sql/<dialect>/queries.sql``), decides
between them, and commits. It does no I/O itself; a driver
(:mod:`leaseq.engine.drive`) runs the steps, synchronously for
:class:`leaseq.Queue` or on the event loop for :class:`leaseq.AsyncQueue`.

A statement that fails ends its transaction (rolled back) and its error is
raised inside the operation, at the ``yield`` that ran it; an operation that
raises while a transaction is open has it rolled back.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Begin:
    """Open a transaction. ``one_statement``: a promise that it runs one
    statement, atomic by itself (a backend may then skip BEGIN and COMMIT)."""

    one_statement: bool = False


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit the open transaction."""


@dataclass(frozen=True, slots=True)
class Rows:
    """Run a named query in the open transaction; the answer is its rows (dicts)."""

    query: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class One:
    """Run a named query in the open transaction; the answer is its first row, or None."""

    query: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Together:
    """Run several named queries in the open transaction, one after another, sent together
    where the backend can (one round trip: PostgreSQL's pipeline mode), else one by one; the
    answer is each one's rows, in order. For statements none of which needs another's answer."""

    steps: tuple[Rows, ...]


@dataclass(frozen=True, slots=True)
class Script:
    """Run a migration script (several statements, no parameters); no answer."""

    sql: str


Step = Begin | Commit | Rows | One | Together | Script
#: An operation: yields steps, receives their answers, returns its result.
Op = Generator[Step, Any, T]

BEGIN = Begin()
BEGIN_ONE = Begin(one_statement=True)
COMMIT = Commit()


def rows(query: str, **params: Any) -> Rows:
    """The step that runs ``query`` and answers with every row."""
    return Rows(query, params)


def together(steps: list[Rows]) -> Together:
    """The step that runs ``steps`` together and answers with the rows of each."""
    return Together(tuple(steps))


def one(query: str, **params: Any) -> One:
    """The step that runs ``query`` and answers with its first row, or None."""
    return One(query, params)
