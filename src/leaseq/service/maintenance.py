"""Maintenance that must run once per database, whatever the number of replicas.

Every ``leaseq serve`` replica runs a :class:`Maintenance`, but only the
replica that holds the *maintenance leader lease* does the work: the sweep
that routes expired leases (so ``needs_reconciliation`` and retries show up
without waiting for a claim), the denial of approval requests whose deadline
passed, and retention. The others stand by and take
over when the leader's lease runs out (it died, froze or lost the database)
or when it resigns at a clean shutdown.

Why a lease row (migration 6, ``leaseq_leader``) and not a PostgreSQL session
advisory lock: the row works on SQLite too; it needs no session that outlives
a transaction, so it survives a transaction-mode pooler (PgBouncer) and a
dropped connection; and it is judged by the database's clock like every task
lease, so a replica that is frozen rather than dead loses leadership as
surely as a dead one. Its cost is one short statement per replica every
``leader_lease_seconds / 3``.

Leadership is a best effort against duplicated work, not a fence: each job
is safe to run twice at once (the sweep routes through the claim's own
guarded, SKIP LOCKED routing; retention deletes in idempotent batches), so
the short overlap possible when a leader that stalled past its lease wakes
up costs only work. A leader steps down on its own once it has gone a lease
length without a renewal it could confirm.

Shaped like River's maintenance services: defaults at the top, a config
with validation, start/stop, and :class:`Signals` that tests wait on
instead of sleeping.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core import checks
from ..core.errors import InvalidInput, LeaseqError
from ..engine.expiry import SWEEP_MAX_QUEUES, check_max_queues
from ..engine.schema import check_streams_retention, retention_periods
from ..queue import Queue

logger = logging.getLogger("leaseq.service.maintenance")

#: The name of the leadership in ``leaseq_leader``.
LEADERSHIP = "maintenance"
#: How long a leader's lease lasts without renewal; a dead leader is replaced
#: within about this long.
DEFAULT_LEADER_LEASE_SECONDS = 15.0
#: How often the leader routes expired leases.
DEFAULT_SWEEP_EVERY = 10.0
#: How often the leader denies approval requests whose deadline passed.
DEFAULT_APPROVALS_EVERY = 10.0
#: How often the leader applies retention (when retention is configured).
DEFAULT_PRUNE_EVERY = 3600.0
#: Bounds of the leader lease: long enough for one renewal round trip, short
#: enough that a dead leader is noticed within a working day.
MIN_LEADER_LEASE_SECONDS = 0.2
MAX_LEADER_LEASE_SECONDS = 3600.0
_MAX_AGE = 100 * 365 * 86400.0
#: A leader counts its lease from before the renewal was sent (the database's
#: lease began no earlier) and gives up a tenth early: room for the host's
#: monotonic clock and the database's clock to run at slightly different rates.
_SAFETY = 0.9


def new_replica_id() -> str:
    """A replica id unique across hosts and restarts: host, pid and a random part."""
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:40] or "host"
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class MaintenanceConfig:
    """What the maintenance leader does, and how leadership is held."""

    #: Lease of the maintenance leadership (seconds); renewed every third of it.
    leader_lease_seconds: float = DEFAULT_LEADER_LEASE_SECONDS
    #: Route expired leases this often (seconds); None: never (claims still do).
    sweep_every: float | None = DEFAULT_SWEEP_EVERY
    #: How many queues one sweep pass examines at most (the next pass, due at once, resumes
    #: after the last: a database with more queues is swept a bounded pass at a time).
    sweep_max_queues: int = SWEEP_MAX_QUEUES
    #: Deny approval requests whose deadline passed this often (seconds); None: never
    #: (``Queue.expire_approvals`` still does, when called).
    approvals_every: float | None = DEFAULT_APPROVALS_EVERY
    #: Retention: delete ended tasks older than this (seconds), each leaving its
    #: evidence record; None: no retention.
    prune_older_than: float | None = None
    #: ...clear the user data of ended tasks older than this (seconds), keeping the rows...
    prune_payloads_older_than: float | None = None
    #: ...delete evidence records of tasks that ended longer ago than this (seconds;
    #: None: a year, or ``prune_older_than`` if longer)...
    prune_evidence_older_than: float | None = None
    #: ...delete the streams of tasks that ended longer ago than this (seconds; None: with the
    #: task's other user data)...
    prune_streams_older_than: float | None = None
    #: ...applied this often (seconds).
    prune_every: float = DEFAULT_PRUNE_EVERY
    #: This replica's id in ``leaseq_leader`` (unique per process by default).
    replica_id: str = field(default_factory=new_replica_id)

    def validate(self) -> MaintenanceConfig:
        """This config, checked: :class:`~leaseq.InvalidInput` names the first bad field."""
        lease = checks.check_seconds("leader_lease_seconds", self.leader_lease_seconds, allow_zero=False,
                                     maximum=MAX_LEADER_LEASE_SECONDS)
        if lease < MIN_LEADER_LEASE_SECONDS:
            raise InvalidInput("leader_lease_seconds", f"must be at least {MIN_LEADER_LEASE_SECONDS} (got {lease})")
        sweep = self.sweep_every
        if sweep is not None:
            sweep = checks.check_seconds("sweep_every", sweep, allow_zero=False, maximum=_MAX_AGE)
        sweep_max_queues = check_max_queues(self.sweep_max_queues, "sweep_max_queues")
        approvals = self.approvals_every
        if approvals is not None:
            approvals = checks.check_seconds("approvals_every", approvals, allow_zero=False, maximum=_MAX_AGE)
        older, payloads, evidence = self.prune_older_than, self.prune_payloads_older_than, \
            self.prune_evidence_older_than
        if older is not None:
            given = evidence
            older, payloads, evidence = retention_periods(
                older, payloads, evidence,
                names=("prune_older_than", "prune_payloads_older_than", "prune_evidence_older_than"))
            evidence = evidence if given is not None else None  # None: the record's default, at each pass
        elif payloads is not None or evidence is not None or self.prune_streams_older_than is not None:
            raise InvalidInput("prune_payloads_older_than" if payloads is not None else "prune_evidence_older_than"
                               if evidence is not None else "prune_streams_older_than", "needs prune_older_than as well")
        streams = check_streams_retention(self.prune_streams_older_than, "prune_streams_older_than")
        every = checks.check_seconds("prune_every", self.prune_every, allow_zero=False, maximum=_MAX_AGE)
        checks.check_text("replica_id", self.replica_id, required=True)
        if len(self.replica_id) > 200:
            raise InvalidInput("replica_id", "must be at most 200 characters")
        return replace(self, leader_lease_seconds=lease, sweep_every=sweep, sweep_max_queues=sweep_max_queues,
                       approvals_every=approvals,
                       prune_older_than=older, prune_payloads_older_than=payloads,
                       prune_evidence_older_than=evidence, prune_streams_older_than=streams, prune_every=every)


class Signals:
    """Counts of what happened (``elected``, ``stepped_down``, ``passed_over`` for
    each election another replica won, one per job pass by job name,
    ``<job>_failed``), and a way to wait for them."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._counts: Counter[str] = Counter()

    def fire(self, name: str) -> None:
        """Record one ``name`` and wake its waiters."""
        with self._cond:
            self._counts[name] += 1
            self._cond.notify_all()

    def count(self, name: str) -> int:
        """How many ``name`` so far."""
        with self._cond:
            return self._counts[name]

    def wait(self, name: str, count: int = 1, timeout: float = 10.0) -> bool:
        """Wait until ``name`` has happened ``count`` times in all; False after ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self._counts[name] >= count, timeout)


@dataclass
class _Job:
    name: str
    every: float
    run: Callable[[], Any]
    due: float = 0.0  # monotonic; 0: at once
    #: whether the pass just run left work for another one, due at once (the sweep stopped at its
    #: bound); between two passes the runner checks its leadership and runs the other due jobs
    more: Callable[[], bool] | None = None


class Maintenance:
    """Elects one maintenance leader among the replicas of a database and runs
    the jobs there. Two daemon threads: the elector (renews or seeks the lease
    every third of it) and the runner (runs due jobs while leading)."""

    def __init__(self, queue: Queue, config: MaintenanceConfig | None = None):
        self.queue = queue
        self.config = (config or MaintenanceConfig()).validate()
        self.replica_id = self.config.replica_id
        self.signals = Signals()
        #: The term this replica leads in (0: not leading).
        self.term = 0
        #: Every term this replica was elected in, in order.
        self.terms: list[int] = []
        self._leading = threading.Event()
        #: Monotonic time before which the lease granted by the database surely holds.
        self._deadline = 0.0
        self._stopped = threading.Event()
        self._wake_runner = threading.Event()
        self._lock = threading.Lock()
        self._jobs = self._make_jobs()
        self._threads: list[threading.Thread] = []

    def _make_jobs(self) -> list[_Job]:
        jobs = []
        c = self.config
        if c.sweep_every is not None:
            jobs.append(_Job("sweep", c.sweep_every, lambda: self.queue.sweep(max_queues=c.sweep_max_queues),
                             more=lambda: self.queue.sweep_resumes_after is not None))
        if c.approvals_every is not None:
            jobs.append(_Job("approvals", c.approvals_every, self.queue.expire_approvals))
        if c.prune_older_than is not None:
            jobs.append(_Job("prune", c.prune_every, lambda: self.queue.prune(
                c.prune_older_than or 0.0, payloads_older_than_seconds=c.prune_payloads_older_than,
                evidence_older_than_seconds=c.prune_evidence_older_than,
                streams_older_than_seconds=c.prune_streams_older_than, by="service retention",
                record_empty=False)))
        return jobs

    @property
    def leading(self) -> bool:
        """Whether this replica is the maintenance leader now: elected, and not past
        the local deadline of its last confirmed renewal. The deadline is checked
        here, not only by the elector, so a renewal stuck in a blocked statement
        cannot stretch leadership past the lease the database granted."""
        return self.leading_at(time.monotonic())

    def leading_at(self, now: float) -> bool:
        """Whether this replica leads at ``now`` (a :func:`time.monotonic` reading)."""
        return self._leading.is_set() and now < self._deadline

    def add_job(self, name: str, every: float, run: Callable[[], Any]) -> None:
        """Run ``run()`` every ``every`` seconds on the leader only (before :meth:`start`).

        For work that must happen once per database, such as firing schedules.
        ``run`` must be safe to run twice at once: leadership can overlap briefly
        when a leader stalls past its lease. Its passes are counted like the built-in jobs'.
        """
        checks.check_name("name", name)
        if name in self.jobs:
            raise InvalidInput("name", f"a maintenance job named {name!r} already exists")
        every = checks.check_seconds("every", every, allow_zero=False, maximum=_MAX_AGE)
        if not callable(run):
            raise InvalidInput("run", "must be callable")
        if self._threads:
            raise RuntimeError("add jobs before start()")
        self._jobs.append(_Job(name, every, run))

    @property
    def jobs(self) -> list[str]:
        """The names of the jobs this replica runs while it leads."""
        return [job.name for job in self._jobs]

    def start(self) -> None:
        """Start seeking leadership (again, after :meth:`stop`: an app's lifespan may run twice)."""
        if any(thread.is_alive() for thread in self._threads):
            raise RuntimeError("maintenance is already running")
        self._stopped.clear()
        self._threads = [threading.Thread(target=self._elect_loop, name="leaseq-maintenance-elector", daemon=True),
                         threading.Thread(target=self._run_loop, name="leaseq-maintenance-runner", daemon=True)]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 10.0, *, resign: bool = True) -> None:
        """Stop, and resign leadership so another replica takes over at once.
        ``resign=False`` leaves the lease to run out, as a crash would."""
        self._stopped.set()
        self._wake_runner.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)
        if resign and self._leading.is_set():
            term = self.term
            self._step_down("stopped")
            try:
                with self.queue.store.transaction(one_statement=True) as tx:
                    tx.rows("leader_resign", name=LEADERSHIP, holder=self.replica_id, term=term)
            except Exception as exc:  # the database may be gone; the lease then runs out on its own
                logger.info("could not resign maintenance leadership: %s", exc)

    def leader(self) -> dict[str, Any] | None:
        """The leadership row as the database has it (holder, term, elected_at,
        renewed_at, expires_at, live), or None before the first election."""
        with self.queue.store.transaction(one_statement=True) as tx:
            row = tx.row("leader_get", name=LEADERSHIP)
        if row is not None:
            row["live"] = bool(row["live"])
        return row

    # -- the elector ------------------------------------------------------

    def _elect_loop(self) -> None:
        lease = self.config.leader_lease_seconds
        while not self._stopped.is_set():
            sent = time.monotonic()
            try:
                with self.queue.store.transaction(one_statement=True) as tx:
                    row = tx.row("leader_elect", name=LEADERSHIP, holder=self.replica_id, seconds=lease)
            except Exception as exc:  # the database is unreachable: lead on until the lease may have run out
                logger.warning("maintenance election failed: %s", exc, exc_info=not isinstance(exc, LeaseqError))
                if self._leading.is_set() and time.monotonic() >= self._deadline:
                    self._step_down("lease not renewed")
            else:
                if row is None:
                    if self._leading.is_set():
                        self._step_down("another replica leads")
                    self.signals.fire("passed_over")
                elif self._leading.is_set() and row["term"] == self.term:
                    self._deadline = sent + lease * _SAFETY
                else:
                    self._take_over(int(row["term"]), sent + lease * _SAFETY)
            # Renew at a third of the lease (two more tries before it runs out).
            wait = lease / 3
            if self._leading.is_set():
                wait = max(0.0, min(wait, self._deadline - time.monotonic()))
            self._stopped.wait(wait)

    def _take_over(self, term: int, deadline: float) -> None:
        with self._lock:
            self.term = term
            self.terms.append(term)
            self._deadline = deadline
            for job in self._jobs:
                job.due = 0.0  # a new leader catches up at once (the old one may have died mid-pass)
            self._leading.set()
        logger.info("replica %s leads maintenance (term %d)", self.replica_id, term)
        self.signals.fire("elected")
        self._wake_runner.set()

    def _step_down(self, why: str) -> None:
        with self._lock:
            self._leading.clear()
            self.term = 0
        logger.info("replica %s no longer leads maintenance: %s", self.replica_id, why)
        self.signals.fire("stepped_down")

    # -- the runner ------------------------------------------------------------

    def _run_loop(self) -> None:
        while not self._stopped.is_set():
            wait = self.config.leader_lease_seconds / 3  # also notices a lapsed lease that was renewed
            if self.leading:
                for job in self._jobs:
                    if self._stopped.is_set() or not self.leading:
                        break
                    now = time.monotonic()
                    if now >= job.due:
                        more = self._run(job)
                        job.due = time.monotonic() + (0.0 if more else job.every)
                    wait = min(wait, max(0.0, job.due - time.monotonic()))
            self._wake_runner.wait(wait)
            self._wake_runner.clear()

    def _run(self, job: _Job) -> bool:
        """Run one pass of ``job``; returns whether another is due at once."""
        started = time.perf_counter()
        try:
            done = job.run()
        except Exception as exc:  # one failed pass must not end maintenance
            logger.warning("maintenance %s pass failed: %s", job.name, exc, exc_info=not isinstance(exc, LeaseqError))
            self.signals.fire(f"{job.name}_failed")
            return False
        else:
            if done and (not isinstance(done, dict) or any(done.values())):  # say what was routed or pruned
                logger.info("maintenance %s pass: %s", job.name, done,
                            extra={"duration": round(time.perf_counter() - started, 6)})
            self.signals.fire(job.name)
            return job.more is not None and job.more()


class MaintenanceCollector(Collector):
    """This replica's maintenance series for /metrics: whether it leads, its term,
    and its passes per job (counted only while it led)."""

    def __init__(self, maintenance: Maintenance):
        self.maintenance = maintenance

    def collect(self) -> Iterator[Any]:
        m = self.maintenance
        leader = GaugeMetricFamily("leaseq_maintenance_leader",
                                   "1 while this replica is the maintenance leader", labels=["replica"])
        leader.add_metric([m.replica_id], 1 if m.leading else 0)
        term = GaugeMetricFamily("leaseq_maintenance_term", "The term this replica leads in (0: not leading)",
                                 labels=["replica"])
        term.add_metric([m.replica_id], m.term if m.leading else 0)
        passes = CounterMetricFamily("leaseq_maintenance_passes", "Maintenance passes run by this replica",
                                     labels=["job", "outcome"])
        for job in m.jobs:
            passes.add_metric([job, "ok"], m.signals.count(job))
            passes.add_metric([job, "failed"], m.signals.count(f"{job}_failed"))
        yield from (leader, term, passes)
