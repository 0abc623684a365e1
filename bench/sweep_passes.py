"""The sweep of every queue, timed: 100 queues with one expired lease each, then 10,000.

``PYTHONPATH=<tree>/src python -m bench.sweep_passes <postgres|sqlite> <rounds> [no10k]``
(``LEASEQ_BENCH_PG_DSN``: the PostgreSQL database, a schema of its own per round). Prints
the median time to route the 100 (every pass until the last queue), one ``Queue.sweep()``
call over the 10,000, and all passes until the 10,000 are routed. A tree without bounded
passes sweeps every queue in its one call. Alternate trees on a loaded machine.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from urllib.parse import quote

import psycopg

import leaseq

PG = os.environ.get("LEASEQ_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
PG_EXPIRED = """
INSERT INTO leaseq_tasks (queue, kind, payload, effect, status, idempotency_key, max_attempts, lease_seconds,
                          claim_generation, attempts, lease_owner, lease_expires_at, claimed_at)
SELECT 'q' || lpad(g::text, 5, '0'), 'job', '{}', 'read_only', 'running', 'k' || g, 5, 30, 1, 1,
       %(worker)s, now() - interval '1 minute', now() - interval '2 minutes'
FROM generate_series(0, %(n)s - 1) AS g
"""
SQLITE_EXPIRED = """
WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < :n - 1)
INSERT INTO leaseq_tasks (queue, kind, payload, effect, status, idempotency_key, max_attempts, lease_seconds,
                          claim_generation, attempts, lease_owner, lease_expires_at, claimed_at)
SELECT 'q' || printf('%05d', n), 'job', '{}', 'read_only', 'running', 'k' || n, 5, 30, 1, 1,
       :worker, (julianday('now') - 2440587.5) * 86400.0 - 60, (julianday('now') - 2440587.5) * 86400.0 - 120
FROM g
"""

def setup(backend, n):
    if backend == "postgres":
        schema = "b_" + uuid.uuid4().hex[:10]
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f"CREATE SCHEMA {schema}")
        dsn = f"{PG}?options={quote('-csearch_path=' + schema)}"
        q = leaseq.connect(dsn); q.migrate()
        w = q.register_worker("gone").id
        with psycopg.connect(dsn, autocommit=True) as c:
            with c.transaction():
                c.execute("SET LOCAL ROLE leaseq_owner")
                c.execute(PG_EXPIRED, {"n": n, "worker": w})
            c.execute("ANALYZE leaseq_tasks")
        def drop():
            q.close()
            with psycopg.connect(PG, autocommit=True) as c:
                c.execute(f"DROP SCHEMA {schema} CASCADE")
        return q, drop
    path = tempfile.mktemp(suffix=".db")
    q = leaseq.connect(f"sqlite:///{path}"); q.migrate()
    w = q.register_worker("gone").id
    with sqlite3.connect(path) as c:
        c.execute(SQLITE_EXPIRED, {"n": n, "worker": w})
    def drop():
        q.close(); os.remove(path)
    return q, drop

def full(q):
    """Sweep until every queue was reached: one call on the old tree, passes on the new."""
    routed = q.sweep(); passes = 1
    while getattr(q, "sweep_resumes_after", None) is not None:
        routed += q.sweep(); passes += 1
    return routed, passes

backend, rounds = sys.argv[1], int(sys.argv[2])
tree = os.path.dirname(os.path.dirname(leaseq.__file__))
out = {"r100": [], "pass10k": [], "all10k": []}
for _ in range(rounds):
    q, drop = setup(backend, 100)
    q.sweep  # warm the pool
    t = time.perf_counter(); r, p = full(q); out["r100"].append(time.perf_counter() - t)
    assert r == 100, r
    drop()
    if len(sys.argv) > 3 and sys.argv[3] == "no10k":
        continue
    q, drop = setup(backend, 10_000)
    t = time.perf_counter(); r1 = q.sweep(); out["pass10k"].append(time.perf_counter() - t)
    t = time.perf_counter(); r2, p = full(q) if getattr(q, "sweep_resumes_after", None) else (0, 0)
    out["all10k"].append(out["pass10k"][-1] + time.perf_counter() - t)
    assert r1 + r2 == 10_000, (r1, r2)
    drop()
for k, v in out.items():
    if not v:
        continue
    print(f"{tree} {backend} {k}: median {statistics.median(v)*1000:.0f} ms  (min {min(v)*1000:.0f}, max {max(v)*1000:.0f}, n={len(v)})")
