"""The database's CPU per lease operation (claim, renew, complete), source trees side by side.

Each variant (a source tree, logged in as the schema's owner or as a worker role) is a process
of its own, run with that tree's ``src`` first on ``PYTHONPATH``, so each sends exactly what
its own library sends, through the public API both trees have (``claim``, ``renew_leases``,
``complete_many``). Each has a schema of its own, a pool of one connection, and a queue of
tasks without keys. A cycle claims ``--batch`` tasks, renews their leases and completes them,
each operation in its own transaction, as a worker does; the backend's CPU around each call
is read from ``/proc/<pid>/schedstat`` (nanoseconds on a CPU: the rest of the machine's load
counts only as far as it slows the caches). The variants alternate, round after round, each
round after a ``VACUUM`` of its own tables; the answer is the median of the rounds. The
first cycle on the fresh connection (each statement's plan built) is reported apart.

``--explain`` adds the plans, with ``auto_explain`` (``log_analyze``, ``log_buffers``, nested
statements: the definer functions' bodies too) on an owner's connection, for one cycle.
``--sql NAME=SQL`` changes tree NAME's schema by hand after its migrate (an ablation: a trigger
dropped, an index dropped), to weigh one part. ``--perf DIR`` records ``perf record`` (DWARF call graphs) of each
variant's backend over one more round.
Run against a PostgreSQL on this machine (the backends' /proc must be readable)::

    python -m bench.op_cpu --dsn postgresql://postgres@127.0.0.1:5432/test \\
        --tree 1c13a9d=/path/to/old/worktree --tree now=.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

OPS = ("claim", "renew", "complete")
AUTO_EXPLAIN = ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0", "SET auto_explain.log_analyze = on",
                "SET auto_explain.log_buffers = on", "SET auto_explain.log_timing = off",
                "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_level = notice")


def with_params(dsn: str, **params: str) -> str:
    """``dsn`` (a URL) with query parameters added."""
    extra = "&".join(f"{k}={quote(v)}" for k, v in params.items())
    return f"{dsn}{'&' if '?' in dsn else '?'}{extra}"


def _cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


# -- the child: one variant, under its tree's PYTHONPATH ----------------------------------------

def child(args: argparse.Namespace) -> None:
    """Set up the variant's schema and worker, then answer the orchestrator's commands
    (``run N``, ``explain``, ``quit``), one JSON line each."""
    import psycopg

    import leaseq

    path = f"-csearch_path={args.schema}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {args.schema}")
    owner = leaseq.connect(with_params(args.dsn, options=path), max_size=1)
    owner.migrate()
    ablation = args.sql[0] if args.sql else ""
    if ablation:  # an ablation: the schema changed by hand before the run (as the server's superuser)
        with psycopg.connect(with_params(args.dsn, options=path), autocommit=True) as conn:
            conn.execute(ablation)
    owner.enqueue_many("job", [{"i": i} for i in range(args.tasks)])
    login = with_params(args.dsn, options=path, application_name=args.schema)
    if args.login == "role":
        from leaseq import roles  # only a tree with database roles has it

        login = with_params(roles.create_role(owner, "worker", f"{args.schema}_worker"), options=path,
                            application_name=args.schema)
    q = leaseq.connect(login, max_size=1)
    worker = q.register_worker("op-cpu")
    with q.store._pool.connection() as conn:
        pid = conn.info.backend_pid
    batch = args.batch

    def cycle(spent: dict[str, int]) -> None:
        t0 = _cpu_ns(pid)
        claims = list(q.claim(worker, limit=batch))
        t1 = _cpu_ns(pid)
        assert len(claims) == batch, f"claimed {len(claims)} of {batch}: the queue ran dry"
        q.renew_leases(worker, claims)
        t2 = _cpu_ns(pid)
        q.complete_many(worker, [(c, None) for c in claims])
        t3 = _cpu_ns(pid)
        spent["claim"] += t1 - t0
        spent["renew"] += t2 - t1
        spent["complete"] += t3 - t2

    first = dict.fromkeys(OPS, 0)
    cycle(first)  # on a fresh connection: each statement's plan built
    for _ in range(args.warm):
        cycle(dict.fromkeys(OPS, 0))
    print(json.dumps({"pid": pid, "first": {op: first[op] / 1000 for op in OPS}}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "run":
            with psycopg.connect(with_params(args.dsn, options=path), autocommit=True) as vac:
                vac.execute("VACUUM leaseq_tasks, leaseq_events, leaseq_workers")
            spent = dict.fromkeys(OPS, 0)
            n = int(cmd[1])
            for _ in range(n):
                cycle(spent)
            print(json.dumps({op: spent[op] / n / 1000 for op in OPS}), flush=True)
        elif cmd[0] == "explain":
            notes: list[str] = []
            with q.store._pool.connection() as conn:
                for sql in AUTO_EXPLAIN:
                    conn.execute(sql)
                conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
            cycle(dict.fromkeys(OPS, 0))
            with q.store._pool.connection() as conn:
                conn.execute("SET auto_explain.log_min_duration = -1")
            print(json.dumps({"plans": notes}), flush=True)
        else:
            break
    q.close()
    owner.close()


# -- the orchestrator ---------------------------------------------------------------------------

class Variant:
    """One tree and login, running in a child process."""

    def __init__(self, args: argparse.Namespace, tree: str, path: Path, login: str, sql: str = ""):
        self.name = f"{tree}, {login}"
        self.login = login
        self.schema = f"opcpu_{uuid.uuid4().hex[:8]}"
        env = dict(os.environ, PYTHONPATH=str(path / "src"))
        tasks = (1 + args.warm + args.cycles * (args.rounds + (1 if args.perf else 0)) + (1 if args.explain else 0)) \
            * args.batch + args.batch
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(Path(__file__).resolve()), "--child", "--dsn", args.dsn, "--schema", self.schema,
             "--login", login, "--tasks", str(tasks), "--batch", str(args.batch), "--warm", str(args.warm),
             "--sql", sql],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=path)
        self.pid: int | None = None
        self.first: dict[str, float] = {}

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if command:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: the child ended (exit {self.proc.wait()})")
        out: dict[str, Any] = json.loads(line)
        return out

    def start(self) -> None:
        got = self.ask("")
        self.pid, self.first = got["pid"], got["first"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def _drop_roles(dsn: str, variants: list[Variant]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for v in variants:
            conn.execute(f'DROP ROLE IF EXISTS "{v.schema}_worker"')


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--tree", action="append", default=[], help="NAME=PATH of a source tree (repeatable)")
    p.add_argument("--logins", default="owner,role", help="owner, role (a tree without roles runs owner only)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--cycles", type=int, default=40, help="claim-renew-complete cycles per round")
    p.add_argument("--batch", type=int, default=10, help="tasks per claim")
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--explain", action="store_true")
    p.add_argument("--perf", help="a folder for perf record -g of each variant's backend")
    p.add_argument("--sql", action="append", default=[],
                   help="NAME=SQL: run SQL in tree NAME's schema after its migrate (an ablation; repeatable)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--schema", help=argparse.SUPPRESS)
    p.add_argument("--login", help=argparse.SUPPRESS)
    p.add_argument("--tasks", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return
    from bench.database import BenchDatabase

    # A database of its own: a schema made or dropped anywhere in a database (a test suite
    # beside this run) makes every backend of that database plan its statements again.
    db = BenchDatabase(args.dsn)
    args.dsn = db.dsn
    ablations = dict(spec.split("=", 1) for spec in args.sql)
    variants: list[Variant] = []
    for spec in args.tree or [f"here={Path.cwd()}"]:
        tree, _, where = spec.partition("=")
        path = Path(where).resolve()
        for login in args.logins.split(","):
            if login == "role" and not (path / "src" / "leaseq" / "roles.py").exists():
                continue
            variants.append(Variant(args, tree, path, login, ablations.get(tree, "")))
    try:
        for v in variants:
            v.start()
        per: dict[str, dict[str, list[float]]] = {v.name: {op: [] for op in OPS} for v in variants}
        for _ in range(args.rounds):
            for v in variants:
                got = v.ask(f"run {args.cycles}")
                for op in OPS:
                    per[v.name][op].append(got[op])
        out: dict[str, Any] = {"batch": args.batch, "cycles": args.cycles, "rounds": args.rounds, "variants": {}}
        for v in variants:
            med = {op: statistics.median(per[v.name][op]) for op in OPS}
            out["variants"][v.name] = {
                **{f"{op}_us_per_call": round(med[op], 1) for op in OPS},
                "us_per_task": round(sum(med.values()) / args.batch, 1),
                **{f"{op}_us_min": round(min(per[v.name][op]), 1) for op in OPS},
                "first_call_us": {op: round(v.first[op]) for op in OPS},
                "rounds": {op: [round(x, 1) for x in per[v.name][op]] for op in OPS}}
        if args.perf:
            Path(args.perf).mkdir(parents=True, exist_ok=True)
            for v in variants:
                data = Path(args.perf) / f"{v.name.replace(', ', '-')}.data"
                rec = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "--call-graph", "dwarf", "-F", "2000",
                                        "-p", str(v.pid), "-o", str(data)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.5)
                v.ask(f"run {args.cycles}")
                rec.send_signal(signal.SIGINT)
                rec.wait(timeout=60)
        if args.explain:
            out["plans"] = {v.name: v.ask("explain")["plans"] for v in variants if v.login == "owner"}
        print(json.dumps(out, indent=1))
        print(_table(out), file=sys.stderr)
    finally:
        for v in variants:
            v.stop()
        db.drop()
        _drop_roles(db.server_dsn, variants)


def _table(out: dict[str, Any]) -> str:
    rows = ["| backend CPU, median of rounds | " + " | ".join(out["variants"]) + " |",
            "|---" * (len(out["variants"]) + 1) + "|"]
    for op in OPS:
        rows.append(f"| {op} of {out['batch']} | "
                    + " | ".join(f"{v[f'{op}_us_per_call']:.0f} µs" for v in out["variants"].values()) + " |")
    rows.append("| per task | " + " | ".join(f"{v['us_per_task']:.1f} µs" for v in out["variants"].values()) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
