"""Table snapshots for "changes nothing" checks, shared by the test folders.

A snapshot is every row of every leaseq table (whatever migrations created),
read on a connection of the test's own, so two snapshots compare equal exactly
when nothing was written in between. The one exception is the maintenance
leader's lease renewal (``leaseq_leader.renewed_at`` and ``expires_at``),
which a running service writes on its own clock, not because of a request.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from leaseq.store import parse_dsn
from pg_modes import own_connection

#: Columns read per table, where not all of them: the leader's renewals are left out.
_COLUMNS = {"leaseq_leader": "name, holder, term, elected_at"}


def snapshot(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every leaseq table, read on a connection of the test's own."""
    dialect, target = parse_dsn(dsn)
    out: dict[str, list[tuple[Any, ...]]] = {}
    if dialect == "sqlite":
        conn = sqlite3.connect(target)
        try:
            names = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'leaseq%' ORDER BY name")]
            for name in names:
                out[name] = sorted(conn.execute(f"SELECT {_COLUMNS.get(name, '*')} FROM {name}").fetchall(),
                                   key=repr)
        finally:
            conn.close()
        return out
    with own_connection(target) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
            "AND table_name LIKE 'leaseq%' ORDER BY table_name")]
        for name in names:
            out[name] = sorted(conn.execute(f"SELECT {_COLUMNS.get(name, '*')} FROM {name}").fetchall(), key=repr)
    return out
