"""How the PostgreSQL tests reach their schema: ``LEASEQ_TEST_PG_MODE``.

``direct`` (the default); ``pgbouncer``: through a PgBouncer in transaction
mode of each test's own (``?pooler=transaction``, no LISTEN: waits poll);
``portable``: in the portable mode (``?portable=true``); ``pgbouncer-portable``:
both at once, the portable mode through a PgBouncer of each test's own (what CI
runs the whole conformance suite in: the portable mode's statements and the
pooler's shared server connections in one run). ``conftest.py``'s
``pg_schema_dsn`` fixture builds the DSN accordingly. A test about the direct
topology itself (the worker's own server connections, LISTEN) is marked
:func:`direct_only` and skips, with its reason, in the other modes.

A test's own connection to its schema (to read rows, to write what no leaseq
call writes) is :func:`own_connection` (or :func:`aown_connection`), never
``psycopg.connect(dsn)``: the DSN carries leaseq's options, which libpq
refuses, and through PgBouncer nothing may be prepared. :func:`libpq_dsn` is
the DSN itself without them, for what takes a DSN (a ``listen_dsn``, ``psql``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

PG_MODES = ("direct", "pgbouncer", "portable", "pgbouncer-portable")
PG_MODE = os.environ.get("LEASEQ_TEST_PG_MODE") or "direct"
if PG_MODE not in PG_MODES:
    raise RuntimeError(f"LEASEQ_TEST_PG_MODE={PG_MODE!r}: must be one of {', '.join(PG_MODES)}")


#: Whether the tests reach PostgreSQL through a PgBouncer, and whether in the portable mode.
POOLED = PG_MODE in ("pgbouncer", "pgbouncer-portable")
PORTABLE = PG_MODE in ("portable", "pgbouncer-portable")


def direct_only(reason: str, *, modes: tuple[str, ...] = ("pgbouncer", "portable")) -> pytest.MarkDecorator:
    """Skip the test in ``modes`` (by default every mode but direct), saying why; a mode named
    covers ``pgbouncer-portable`` too, which is both."""
    skipped = PG_MODE in modes or (PG_MODE == "pgbouncer-portable" and bool({"pgbouncer", "portable"} & set(modes)))
    return pytest.mark.skipif(skipped, reason=f"LEASEQ_TEST_PG_MODE={PG_MODE}: {reason}")


def libpq_dsn(dsn: str) -> str:
    """``dsn`` as libpq (raw psycopg, ``psql``) takes it: without leaseq's own query options
    (``?pooler=``, ``?portable=``), which libpq refuses; the one rule is
    :func:`leaseq.db.dsn.split_leaseq_options`."""
    from leaseq.db.dsn import split_leaseq_options

    return split_leaseq_options(dsn)[0]


def own_connection(dsn: str, **kwargs: Any) -> Any:
    """A test's own ``psycopg.Connection`` to a PostgreSQL ``dsn`` that may carry leaseq's options
    (removed: :func:`libpq_dsn`; with either, nothing is prepared, as a transaction-mode pooler
    of PgBouncer 1.18 keeps no prepared statement between transactions)."""
    import psycopg

    return psycopg.connect(**_own(dsn, kwargs))


async def aown_connection(dsn: str, **kwargs: Any) -> Any:
    """:func:`own_connection` for asyncio code."""
    import psycopg

    return await psycopg.AsyncConnection.connect(**_own(dsn, kwargs))


def _own(dsn: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    from leaseq.db.dsn import postgres_mode

    mode = postgres_mode(dsn)[1]
    return {"conninfo": libpq_dsn(dsn), **({} if mode.session_state else {"prepare_threshold": None}), **kwargs}
