"""The claim's database CPU, replayed: ``claim_plain`` (the lean claim) against ``claim_batch``
(the full one) on the same queue without keys, as the schema's owner and as a worker role.

Each call claims ten tasks (and, with ``--complete``, completes them) and rolls back, so every
call finds the same rows; the variants alternate, round after round, each on a connection of
its own; the backend's CPU is read from ``/proc/<pid>/schedstat`` (nanoseconds on the CPU, so
the load of the rest of the machine counts only as far as it slows the caches). Also the CPU
of each variant's first call on a fresh connection, less a steady call: the building of its
generic plan. Run against a PostgreSQL on this machine (the backends' /proc must be readable)::

    python -m bench.claim_replay --dsn postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import json
import statistics
import uuid
from typing import Any
from urllib.parse import quote

import psycopg

import leaseq
from leaseq import roles

CLAIM = "SELECT * FROM {fn}(%s, false, 'default', NULL::text[], 10, NULL::float8, true)"
COMPLETE = "SELECT * FROM leaseq_q_complete_batch(false, %s, %s::bigint[], %s::jsonb, false, true)"


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` with its search_path set to ``schema``."""
    return f"{dsn}{'&' if '?' in dsn else '?'}options={quote(f'-csearch_path={schema}')}"


def _cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


class Session:
    """One variant's connection: ``claim_<statement>`` called as ``who``."""

    def __init__(self, dsn: str, worker: str, statement: str, complete: bool):
        self.conn = psycopg.connect(dsn)
        self.conn.execute("SET plan_cache_mode = force_generic_plan")  # as leaseq's pool sets it
        self.conn.commit()
        self.pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        self.conn.rollback()
        self.worker, self.complete = worker, complete
        self.sql = CLAIM.format(fn=f"leaseq_q_claim_{statement}")

    def call(self) -> None:
        cur = self.conn.execute(self.sql, (self.worker,), prepare=True)
        rows = cur.fetchall()
        ids = [r[0] for r in rows if r[0] is not None]
        assert len(ids) == 10, rows[:1]
        if self.complete:
            gen = [c.name for c in cur.description].index("claim_generation")  # type: ignore[union-attr]
            items = [{"task_id": r[0], "generation": r[gen], "result": None} for r in rows]
            self.conn.execute(COMPLETE, (self.worker, ids, json.dumps(items)), prepare=True).fetchall()
        self.conn.rollback()

    def timed(self, n: int) -> float:
        """Backend CPU per call, in ms, over ``n`` calls."""
        before = _cpu_ns(self.pid)
        for _ in range(n):
            self.call()
        return (_cpu_ns(self.pid) - before) / n / 1e6

    def close(self) -> None:
        self.conn.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=150)
    p.add_argument("--complete", action="store_true", help="complete the claimed tasks in each call")
    args = p.parse_args(argv)
    schema = f"claim_replay_{uuid.uuid4().hex[:8]}"
    role = f"{schema}_worker"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    dsn = with_search_path(args.dsn, schema)
    try:
        q = leaseq.connect(dsn)
        q.migrate()
        role_dsn = roles.create_role(q, "worker", role)
        owner_worker = q.register_worker("owner").id
        q.enqueue_many("job", [{"i": i} for i in range(1000)])
        q.close()
        rq = leaseq.connect(with_search_path(role_dsn, schema))
        role_worker = rq.register_worker("role").id
        rq.close()
        logins = {"owner": (dsn, owner_worker), "role": (with_search_path(role_dsn, schema), role_worker)}
        variants = [(who, st) for who in logins for st in ("plain", "batch")]
        first: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
        for _ in range(3):  # the first call on a fresh connection: its plan built
            for who, st in variants:
                s = Session(*logins[who], st, args.complete)
                one = s.timed(1)
                steady = s.timed(20)
                first[(who, st)].append(one - steady)
                s.close()
        sessions = {v: Session(*logins[v[0]], v[1], args.complete) for v in variants}
        for s in sessions.values():
            s.timed(20)  # warm
        per: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
        for _ in range(args.rounds):
            for v, s in sessions.items():
                # the rolled-back rows' dead versions cleared first: each variant finds what the others found
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("VACUUM leaseq_tasks, leaseq_events")
                per[v].append(s.timed(args.calls))
        for s in sessions.values():
            s.close()
        out: dict[str, Any] = {}
        for v in variants:
            out[f"{v[0]} claim_{v[1]}"] = {"ms_per_call_median": round(statistics.median(per[v]), 3),
                                          "rounds": [round(x, 3) for x in per[v]],
                                          "first_call_extra_ms": round(statistics.median(first[v]), 2)}
        print(json.dumps(out, indent=1))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


if __name__ == "__main__":
    main()
