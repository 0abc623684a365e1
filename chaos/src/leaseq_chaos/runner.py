"""One chaos run, start to verdict.

1. Set up: on PostgreSQL a private throwaway server (two databases: the
   queue, and the downstream ledger) with a proxy link per worker; on SQLite
   two files. Migrate both.
2. Chaos phase (``duration - settle``): the worker processes run the
   workload; the enqueuer adds the seeded task mix; the operator cancels
   some tasks; the stale-writer probe replays superseded claims; the fault
   injector runs every enabled fault on its own schedule.
3. Settle phase: faults undone, no new work. The run waits until no task is
   ``queued`` or ``running`` (or the duration is up), then stops the workers.
4. Verdict: read the final state through :class:`leaseq.Queue` and the
   fenced store, merge every process's history, run the checker and write
   everything to one JSON file.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import leaseq
from leaseq.core.errors import InvalidTransition, LeaseqError
from leaseq.fencing import FencedStore

from .checker import Observed, Report, check
from .config import ChaosConfig
from .faults import FaultInjector
from .fleet import APP_PREFIX, Fleet
from .history import HistoryWriter, now, read_history
from .probe import StaleWriterProbe
from .workload import LEDGER_TABLE, ledger_schema, task_spec

QUEUE_DB = "leaseq_chaos"
LEDGER_DB = "leaseq_chaos_ledger"


@dataclass
class ChaosResult:
    """What :func:`run_chaos` returns: the verdict and where the history went."""

    config: ChaosConfig
    report: Report
    history_path: Path
    elapsed: float
    settled: bool


def _retrying(halt: threading.Event, fn: Callable[[], Any]) -> Any:
    """``fn()``, retried while the database is unreachable (a restart), until ``halt``."""
    while True:
        try:
            return fn()
        except (leaseq.BackendUnavailable, OSError):
            if halt.wait(0.2):
                raise


class _Harness:
    """The harness-side actors of a run: enqueuer and operator."""

    def __init__(self, config: ChaosConfig, q: leaseq.Queue, history: HistoryWriter, run_tag: str):
        self.config, self.q, self.history, self.run_tag = config, q, history, run_tag
        self.halt = threading.Event()
        self.enqueued: list[int] = []
        self.started = now()
        self.threads = [threading.Thread(target=self._enqueue_loop, name="chaos-enqueue", daemon=True),
                        threading.Thread(target=self._operator_loop, name="chaos-operator", daemon=True)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.halt.set()
        for t in self.threads:
            t.join(30)

    def _enqueue_loop(self) -> None:
        rng = random.Random(f"{self.config.seed}/tasks")
        specs = [task_spec(rng, i, self.run_tag) for i in range(self.config.tasks)]
        spread = self.config.chaos_seconds * 0.8  # the last fifth of the chaos phase only faults old work
        for i, spec in enumerate(specs):
            while i >= math.ceil(len(specs) * min(1.0, (now() - self.started) / spread)):
                if self.halt.wait(0.05):
                    return
            try:
                task = _retrying(self.halt, lambda spec=spec: self.q.enqueue(**spec))
            except leaseq.BackendUnavailable:
                return
            self.enqueued.append(task.id)
            self.history.record("enqueue", "ok", task=task.id, kind=spec["kind"], effect=spec["effect"],
                                payload=spec["payload"])

    def _operator_loop(self) -> None:
        rng = random.Random(f"{self.config.seed}/operator")
        target = max(1, round(self.config.tasks * 0.04))
        done = 0
        while done < target and not self.halt.wait(rng.uniform(0.2, 1.2) * self.config.chaos_seconds / 45):
            if not self.enqueued:
                continue
            task_id = self.enqueued[rng.randrange(len(self.enqueued))]
            t0 = now()
            try:
                self.q.cancel(task_id, "chaos operator", by="chaos-operator")
            except InvalidTransition:
                self.history.record("cancel", "refused", task=task_id, t0=t0)
            except LeaseqError as exc:
                self.history.record("cancel", "unknown", task=task_id, t0=t0, error=type(exc).__name__)
            else:
                self.history.record("cancel", "ok", task=task_id, t0=t0)
                done += 1


def _action_keys(seed: int) -> str:
    secret = base64.b64encode(hashlib.sha256(f"leaseq-chaos-{seed}".encode()).digest()).decode()
    return f"chaos:{secret}"


def _remote_workers(config: ChaosConfig, q: leaseq.Queue, service_dsn: str, env: dict[str, str], workdir: Path,
                    log_dir: Path, record: Callable[..., None], stack: ExitStack) -> tuple[Any, dict, Any]:
    """For ``--transport http`` or ``mixed``: start ``leaseq serve`` and give each remote slot a
    worker token for every queue (as ``leaseq tokens create --role worker --all-queues`` does) and,
    on PostgreSQL, a proxy link.

    Returns ``(service, {slot: (url, token_file)}, http_proxy)``; ``(None, {}, None)`` when every
    worker is direct."""
    slots = [i for i in range(config.workers) if config.remote(i)]
    if not slots:
        return None, {}, None
    from leaseq import access

    from .service_process import ServiceProcess

    service = ServiceProcess(service_dsn, env=env, log_dir=log_dir, record=record)
    stack.callback(service.stop)
    service.start()
    http_proxy = None
    if config.backend == "postgres":
        from .proxy import FaultyProxy

        http_proxy = FaultyProxy(service.port)
        stack.callback(http_proxy.close)
    remote = {}
    for i in slots:
        token, _ = access.create_token(q, name=f"chaos-w{i}", role="worker", created_by="leaseq-chaos", all_queues=True)
        path = workdir / f"w{i}.token"
        path.write_text(token + "\n")
        path.chmod(0o600)
        url = f"http://127.0.0.1:{http_proxy.add_link(f'w{i}')}" if http_proxy is not None else service.url
        remote[i] = (url, path)
    return service, remote, http_proxy


def _keep_serving(service: Any, record: Callable[..., None]) -> None:
    """Start the service again if it died other than by the service fault (which restarts it itself)."""
    try:
        service.ensure_running(even_if_killed=False)
    except RuntimeError as exc:
        record("service_start", "error", error=str(exc)[:300])


def _unsettled(q: leaseq.Queue) -> int:
    rows = q.stats()
    return sum(r["count"] for r in rows if r["status"] in ("queued", "running"))


def run_chaos(config: ChaosConfig, *, progress: Callable[[str], None] | None = None,
              keep_logs: bool = False) -> ChaosResult:
    """Run ``config`` and check it. Raises :class:`leaseq.LeaseqError` only if the run cannot start.

    With ``keep_logs`` the run's folder (worker logs, per-process history)
    is kept and reported through ``progress``."""
    say = progress or (lambda line: None)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="leaseq-chaos-"))
    history_dir, log_dir = workdir / "history", workdir / "logs"
    log_dir.mkdir(parents=True)
    history_path = Path(config.history_path or f"chaos-history-{config.seed}.json")
    run_tag = f"s{config.seed}"
    history = HistoryWriter(history_dir, "harness")
    record = history.record
    pg = config.backend == "postgres"
    server = proxy = None
    settled = False
    with ExitStack() as stack:
        if keep_logs:
            stack.callback(say, f"worker logs and per-process history kept in {workdir}")
        else:
            stack.callback(shutil.rmtree, workdir, True)
        if pg:
            from .pgserver import ThrowawayPostgres
            from .proxy import FaultyProxy

            server = ThrowawayPostgres(bindir=config.pg_bin)
            stack.callback(server.stop)
            server.start()
            server.create_database(QUEUE_DB)
            server.create_database(LEDGER_DB)
            pooled = ""
            front = server.port
            if config.pooler == "pgbouncer":
                # the workers' queue connections: proxy link -> PgBouncer (4 server connections
                # shared by every worker, transaction mode) -> server
                from .pgbouncer import PgBouncer

                bouncer = PgBouncer({"*": f"host=127.0.0.1 port={server.port}"}, pool_size=4)
                stack.callback(bouncer.stop)
                bouncer.wait_ready(QUEUE_DB)
                front, pooled = bouncer.port, "&pooler=transaction"
            # the portable mode: nothing prepared, no advisory lock, no LISTEN (the harness, which
            # checks, reads the server directly as it always does)
            portable = "&portable=true" if config.portable else ""
            proxy = FaultyProxy(front)
            stack.callback(proxy.close)
            ports = [proxy.add_link(f"w{i}") for i in range(config.workers)]
            worker_dsns = [server.dsn(QUEUE_DB, port=p, application_name=f"{APP_PREFIX}{i}.queue") + pooled
                           + portable for i, p in enumerate(ports)]
            ledger_dsns = [server.dsn(LEDGER_DB, application_name=f"{APP_PREFIX}{i}.ledger")
                           for i in range(config.workers)]
            queue_dsn = server.dsn(QUEUE_DB, application_name="leaseq-chaos-harness")
            ledger_dsn = server.dsn(LEDGER_DB, application_name="leaseq-chaos-harness")
            service_dsn = server.dsn(QUEUE_DB, application_name="leaseq-chaos-service") + portable
        else:
            queue_dsn = f"sqlite:///{workdir / 'queue.db'}"
            ledger_dsn = f"sqlite:///{workdir / 'ledger.db'}"
            worker_dsns, ledger_dsns = [queue_dsn] * config.workers, [ledger_dsn] * config.workers
            service_dsn = queue_dsn
        say(f"chaos: {config.backend}{' through pgbouncer' if config.pooler != 'none' else ''}"
            f"{' in the portable mode' if config.portable else ''}, "
            f"{config.transport} transport, {config.workers} workers, "
            f"{config.tasks} tasks, seed {config.seed}, "
            f"faults {','.join(config.faults) or 'none'}, {config.duration:g}s "
            f"({config.chaos_seconds:g}s of faults, then up to {config.settle_seconds:g}s to settle)")

        q = leaseq.connect(queue_dsn)
        stack.callback(q.close)
        q.migrate()
        fence = FencedStore(ledger_dsn)
        stack.callback(fence.close)
        fence.migrate()
        with fence.transaction() as conn:
            conn.execute(ledger_schema(fence.dialect))
        record("run", "ok", config={k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
                                    for k, v in dataclasses.asdict(config).items()})

        env = {k: v for k, v in os.environ.items() if not k.startswith(("LEASEQ_DSN", "LEASEQ_CHAOS"))}
        env["LEASEQ_ACTION_KEYS"] = _action_keys(config.seed)
        env["LEASEQ_CHAOS_PREFETCH"] = str(config.prefetch)
        service, remote, http_proxy = _remote_workers(config, q, service_dsn, env, workdir, log_dir, record, stack)
        fleet = Fleet(worker_dsns, ledger_dsns=ledger_dsns, history_dir=history_dir, log_dir=log_dir,
                      concurrency=config.concurrency, env=env, record=record,
                      skew_rng=random.Random(f"{config.seed}/skew") if "skew" in config.faults else None,
                      seed=config.seed, remote=remote)
        fleet.http_proxy = http_proxy
        stack.callback(fleet.stop, 5.0)
        fleet.start()
        harness = _Harness(config, q, history, run_tag)
        probe = StaleWriterProbe(q, fence, history, random.Random(f"{config.seed}/probe"), run_tag)
        injector = FaultInjector(config.faults, config.seed, fleet, record=record,
                                 chaos_seconds=config.chaos_seconds, proxy=proxy, server=server, queue=q,
                                 service=service, databases=(QUEUE_DB, LEDGER_DB))
        # The phases are timed from here: setting up a private server can take seconds on a loaded
        # machine, and that must not eat the chaos phase of a short run.
        phases = time.monotonic()
        harness.start()
        probe.start()
        injector.start()

        chaos_end = phases + config.chaos_seconds
        last_say = time.monotonic()
        while time.monotonic() < chaos_end:
            time.sleep(0.2)
            fleet.respawn_dead()
            if service is not None:
                _keep_serving(service, record)
            if time.monotonic() - last_say >= 10:
                last_say = time.monotonic()
                say(f"  {time.monotonic() - started:5.0f}s  enqueued {len(harness.enqueued)}  "
                    f"probes {probe.cycles}")
        injector.stop()
        harness.stop()
        probe.stop()
        probe.drain()
        record("settle", "ok")
        say(f"  {time.monotonic() - started:5.0f}s  faults off; settling")

        deadline = chaos_end + config.settle_seconds
        halt = threading.Event()
        while time.monotonic() < deadline:
            fleet.respawn_dead()
            if service is not None:
                _keep_serving(service, record)
            try:
                if _unsettled(q) == 0:
                    settled = True
                    break
            except LeaseqError:
                pass
            time.sleep(0.25)
        fleet.stop(5.0)
        record("stopped", "ok", settled=settled)

        say(f"  {time.monotonic() - started:5.0f}s  {'settled' if settled else 'NOT settled'}; checking")
        obs = _observe(q, fence, history_dir, halt)
        report = check(obs)
        history.close()
        _write(history_path, config, obs, report, settled)
    return ChaosResult(config=config, report=report, history_path=history_path,
                       elapsed=time.monotonic() - started, settled=settled)


def _observe(q: leaseq.Queue, fence: FencedStore, history_dir: Path, halt: threading.Event) -> Observed:
    """The final state of both databases, read through their public APIs, and the merged history."""
    tasks = _retrying(halt, lambda: q.list_tasks(limit=100_000))
    events = {t.id: [dataclasses.asdict(e) for e in _retrying(halt, lambda t=t: q.events(t.id))] for t in tasks}
    effects = {t.id: [dataclasses.asdict(fx) for fx in _retrying(halt, lambda t=t: q.effects(t.id))]
               for t in tasks}
    with fence.transaction() as conn:
        cur = conn.execute(f"SELECT id, resource, idempotency_key, token, task_id, effect, proc "
                           f"FROM {LEDGER_TABLE} ORDER BY id")
        names = [d[0] for d in cur.description]
        ledger = [dict(zip(names, row)) for row in cur.fetchall()]
    # Each resource is written by one task (task:<id>, probe:<id>): its fence row is that task's.
    owners = {row["resource"]: row["task_id"] for row in ledger}
    fence_tokens = {res: fence.newest_generation(res, owners[res]) for res in sorted(owners)}
    return Observed(history=read_history(history_dir), tasks=[dataclasses.asdict(t) for t in tasks],
                    events=events, effects=effects, ledger=ledger, fence_tokens=fence_tokens)


def _write(path: Path, config: ChaosConfig, obs: Observed, report: Report, settled: bool) -> None:
    document = {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(config).items()
                   if k != "history_path"},
        "settled": settled,
        "verdict": {"ok": report.ok, "counts": report.counts, "statuses": report.statuses,
                    "violations": report.violations, "by_invariant": report.by_invariant()},
        "history": obs.history,
        "tasks": obs.tasks,
        "events": {str(k): v for k, v in obs.events.items()},
        "effects": {str(k): v for k, v in obs.effects.items()},
        "ledger": obs.ledger,
        "fence_tokens": obs.fence_tokens,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, default=str))
    tmp.replace(path)


def recheck(path: Path) -> tuple[dict[str, Any], Report]:
    """Run the checker again on a history file written by :func:`run_chaos`; returns ``(config, report)``."""
    document = json.loads(Path(path).read_text())
    obs = Observed(history=document["history"], tasks=document["tasks"],
                   events={int(k): v for k, v in document["events"].items()},
                   effects={int(k): v for k, v in document["effects"].items()},
                   ledger=document["ledger"], fence_tokens=document["fence_tokens"])
    return document["config"], check(obs)


__all__ = ["ChaosResult", "recheck", "run_chaos"]
