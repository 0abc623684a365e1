"""The claim's database CPU, replayed: ``claim_plain`` (the lean claim) against ``claim_batch``
(the full one) on the same queue without keys, as the schema's owner and as a worker role.

Each call claims ten tasks (and, with ``--complete``, completes them) and rolls back, so every
call finds the same rows; the variants alternate, round after round, each on a connection of
its own; the backend's CPU is read from ``/proc/<pid>/schedstat`` (nanoseconds on the CPU, so
the load of the rest of the machine counts only as far as it slows the caches). Also the CPU
of each variant's first call on a fresh connection, less a steady call: the building of its
generic plan. Run against a PostgreSQL on this machine (the backends' /proc must be readable)::

    python -m bench.claim_replay --dsn postgresql://postgres@127.0.0.1:5432/test

With ``--one-key``, the claims of one tenant's backlog instead, as the schema's owner:
``claim_fair_one`` and ``claim_fair_one_plain`` on a queue of one fairness key's tasks,
beside ``claim_plain`` on a queue of the same tasks without a key (``--limit``: the claim's
size; the starvation benchmark's workers claim a slot or two at a time).
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
from leaseq.store.functions import call_sql, load_signatures
from leaseq.store.queries import load_named_queries

COMPLETE = "SELECT * FROM leaseq_q_complete_batch(false, %s, %s::bigint[], %s::jsonb, false, true)"


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` with its search_path set to ``schema``."""
    return f"{dsn}{'&' if '?' in dsn else '?'}options={quote(f'-csearch_path={schema}')}"


def _cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


class Session:
    """One variant's connection: ``claim_<statement>`` of ``queue`` called as ``who``."""

    def __init__(self, dsn: str, worker: str, statement: str, complete: bool, queue: str = "default",
                 limit: int = 10):
        self.conn = psycopg.connect(dsn)
        self.conn.execute("SET plan_cache_mode = force_generic_plan")  # as leaseq's pool sets it
        self.conn.commit()
        self.pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        self.conn.rollback()
        self.complete, self.limit = complete, limit
        name = f"claim_{statement}"
        self.sql = call_sql(load_named_queries("postgres")[name], load_signatures()[name])  # as the store sends it
        self.params = dict(worker_id=worker, route_first=False, queue=queue, kinds=None, limit=limit,
                           lease_seconds=None, compact=True)
        self.worker = worker

    def call(self) -> None:
        cur = self.conn.execute(self.sql, self.params, prepare=True)
        rows = cur.fetchall()
        ids = [r[0] for r in rows if r[0] is not None]
        assert len(ids) == self.limit, rows[:1]
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
    p.add_argument("--one-key", action="store_true",
                   help="claim_fair_one and claim_fair_one_plain of one key's backlog, beside claim_plain")
    p.add_argument("--limit", type=int, default=10, help="tasks per claim")
    args = p.parse_args(argv)
    if args.one_key:
        one_key(args)
        return
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
                s = Session(*logins[who], st, args.complete, limit=args.limit)
                one = s.timed(1)
                steady = s.timed(20)
                first[(who, st)].append(one - steady)
                s.close()
        sessions = {v: Session(*logins[v[0]], v[1], args.complete, limit=args.limit) for v in variants}
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


def one_key(args: argparse.Namespace) -> None:
    """The claims of one tenant's backlog against the lean claim of the same tasks without a key
    (``--one-key``), as the schema's owner; the variants alternate, round after round."""
    schema = f"claim_replay_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    dsn = with_search_path(args.dsn, schema)
    try:
        with leaseq.connect(dsn) as q:
            q.migrate()
            worker = q.register_worker("owner").id
            q.enqueue_many("job", [{"i": i} for i in range(1000)], queue="plain")
            q.enqueue_many("job", [{"i": i} for i in range(1000)], fairness_key="a")
            w = q.register_worker("first")
            q.claim(w, queue="default")  # the key's shares exist, as in a drain
        variants = {"claim_plain": ("plain", "plain"), "claim_fair_one": ("fair_one", "default"),
                    "claim_fair_one_plain": ("fair_one_plain", "default")}
        sessions = {v: Session(dsn, worker, st, args.complete, queue, args.limit) for v, (st, queue) in variants.items()}
        for s in sessions.values():
            s.timed(20)  # warm
        per: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.rounds):
            for v, s in sessions.items():
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("VACUUM leaseq_tasks, leaseq_events, leaseq_fairness_shares")
                per[v].append(s.timed(args.calls))
        for s in sessions.values():
            s.close()
        print(json.dumps({v: {"ms_per_call_median": round(statistics.median(per[v]), 3),
                              "rounds": [round(x, 3) for x in per[v]]} for v in variants}, indent=1))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    main()
