"""How the PostgreSQL tests reach their schema: ``LEASEQ_TEST_PG_MODE``.

``direct`` (the default); ``pgbouncer``: through a PgBouncer in transaction
mode of each test's own (``?pooler=transaction``, no LISTEN: waits poll);
``portable``: in the portable mode (``?portable=true``). ``conftest.py``'s
``pg_schema_dsn`` fixture builds the DSN accordingly. A test about the direct
topology itself (the worker's own server connections, LISTEN) is marked
:func:`direct_only` and skips, with its reason, in the other modes.
"""

from __future__ import annotations

import os

import pytest

PG_MODES = ("direct", "pgbouncer", "portable")
PG_MODE = os.environ.get("LEASEQ_TEST_PG_MODE") or "direct"
if PG_MODE not in PG_MODES:
    raise RuntimeError(f"LEASEQ_TEST_PG_MODE={PG_MODE!r}: must be one of {', '.join(PG_MODES)}")


def direct_only(reason: str, *, modes: tuple[str, ...] = ("pgbouncer", "portable")) -> pytest.MarkDecorator:
    """Skip the test in ``modes`` (by default every mode but direct), saying why."""
    return pytest.mark.skipif(PG_MODE in modes, reason=f"LEASEQ_TEST_PG_MODE={PG_MODE}: {reason}")
