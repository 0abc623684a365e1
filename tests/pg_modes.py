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
"""

from __future__ import annotations

import os

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
