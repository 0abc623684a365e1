"""The fault injector: each fault on its own seeded schedule.

Every fault draws its timing and its targets from a random generator of its
own, seeded from the run's seed and the fault's name, so the schedule of a
run can be replayed, and turning one fault off does not move the others.
Targets are drawn by slot number; a fault whose target is down at that
moment is recorded as skipped.

===========  ==============================================================
kill         SIGKILL a worker; the harness respawns it
stop         SIGSTOP a worker for longer than its leases, then SIGCONT
terminate    ``pg_terminate_backend`` on every backend of one worker
restart      restart the PostgreSQL server once, mid-run (fast or immediate)
partition    drop, delay or black-hole one worker's connections (proxy)
skew         every worker runs with a wrong clock, re-drawn at each spawn;
             this schedule also stops workers gracefully (SIGTERM) so they
             come back with a new one
drop_queue   ``pg_terminate_backend`` on every connection to the queue
             database at once (the workers' and the service's): what a
             failover or a pooler restart does
drop_ledger  ``pg_terminate_backend`` on every connection the workers' fenced
             stores hold to the downstream ledger
revoke       revoke a running worker (``Queue.revoke_worker``) at a random
             moment, racing its claims; the process finds itself refused and
             exits, and the fleet starts a new one under a new identity
service      SIGKILL the ``leaseq serve`` process remote workers talk to, and
             start it again on the same port after a pause
===========  ==============================================================
"""

from __future__ import annotations

import random
import signal
import threading
from typing import Any, Callable

from .fleet import APP_PREFIX, Fleet

FAULTS = ("kill", "stop", "terminate", "restart", "partition", "skew", "drop_queue", "drop_ledger", "revoke",
          "service")
#: Faults that need the PostgreSQL backend (a server to restart, connections to cut).
PG_ONLY = frozenset({"terminate", "restart", "partition", "drop_queue", "drop_ledger"})
#: Faults that need remote workers (``--transport http`` or ``mixed``).
HTTP_ONLY = frozenset({"service"})
#: Faults that can keep a worker from the queue for longer than a lease, so a
#: handler that returned may lose its lease before its completion is recorded:
#: the one cost a fault may charge (see the checker's ``no_attempt_charged``).
OUTLASTS_LEASE = frozenset({"kill", "stop", "partition", "restart", "service"})


def fault_rng(seed: int, fault: str) -> random.Random:
    """The generator of one fault's schedule."""
    return random.Random(f"{seed}/{fault}")


class FaultInjector:
    """Runs one thread per enabled fault until :meth:`stop`, then heals everything."""

    def __init__(self, faults: tuple[str, ...], seed: int, fleet: Fleet, *, record: Callable[..., None],
                 chaos_seconds: float, proxy: Any = None, server: Any = None, queue: Any = None,
                 service: Any = None, databases: tuple[str, str] = ("", "")):
        self.faults = faults
        self.seed = seed
        self.fleet = fleet
        self.record = record
        self.chaos_seconds = chaos_seconds
        self.proxy = proxy
        self.server = server
        self.queue = queue          # the harness's own Queue (revocations)
        self.service = service      # the ServiceProcess remote workers use, if any
        self.queue_db, self.ledger_db = databases
        self.halt = threading.Event()
        self.threads: list[threading.Thread] = []
        self.server_lock = threading.Lock()  # a restart and a termination never overlap

    def start(self) -> None:
        """Start a thread for every enabled fault."""
        for fault in self.faults:
            target = getattr(self, f"_{fault}")
            thread = threading.Thread(target=self._guarded, args=(fault, target), name=f"chaos-{fault}",
                                      daemon=True)
            thread.start()
            self.threads.append(thread)

    def _guarded(self, fault: str, target: Callable[[random.Random], None]) -> None:
        try:
            target(fault_rng(self.seed, fault))
        except Exception as exc:  # a fault that cannot be injected is reported, not fatal
            self.record("fault", "error", fault=fault, error=f"{type(exc).__name__}: {exc}"[:300])

    def stop(self) -> None:
        """Stop injecting and undo every fault still in force."""
        self.halt.set()
        for thread in self.threads:
            thread.join(30)
        for slot in self.fleet.slots:
            if slot.stopped:
                self.fleet.signal(slot, signal.SIGCONT)
        for proxy in self.fleet.proxies(self.proxy):
            proxy.heal_all()
        if self.server is not None:
            self.server.wait_ready()
        if self.service is not None:
            self.service.ensure_running()

    # -- helpers --------------------------------------------------------------------

    def _every(self, rng: random.Random, low: float, high: float):
        """Yield at seeded intervals until halted."""
        while not self.halt.wait(rng.uniform(low, high)):
            yield

    def _target(self, rng: random.Random, fault: str):
        slot = self.fleet.slots[rng.randrange(len(self.fleet.slots))]
        if slot not in self.fleet.live():
            self.record("fault", "skipped", fault=fault, slot=slot.index)
            return None
        return slot

    # -- the faults ---------------------------------------------------------------------

    def _kill(self, rng: random.Random) -> None:
        for _ in self._every(rng, 2.0, 6.0):
            slot = self._target(rng, "kill")
            if slot is not None and self.fleet.signal(slot, signal.SIGKILL):
                self.record("fault", "ok", fault="kill", slot=slot.index)

    def _stop(self, rng: random.Random) -> None:
        for _ in self._every(rng, 3.0, 7.0):
            slot = self._target(rng, "stop")
            hold = rng.uniform(1.6, 4.0)  # every chaos lease is at most 1.5 s
            if slot is None or not self.fleet.signal(slot, signal.SIGSTOP):
                continue
            self.record("fault", "ok", fault="stop", slot=slot.index, seconds=round(hold, 3))
            self.halt.wait(hold)
            self.fleet.signal(slot, signal.SIGCONT)

    def _terminate(self, rng: random.Random) -> None:
        for _ in self._every(rng, 2.0, 5.0):
            slot = self._target(rng, "terminate")
            if slot is None or slot.server is not None:  # a remote worker holds no database connection
                if slot is not None:
                    self.record("fault", "skipped", fault="terminate", slot=slot.index, reason="remote worker")
                continue
            with self.server_lock:
                n = self.server.terminate_backends(f"{APP_PREFIX}{slot.index}.")
            self.record("fault", "ok", fault="terminate", slot=slot.index, backends=n)

    def _restart(self, rng: random.Random) -> None:
        at = rng.uniform(0.3, 0.6) * self.chaos_seconds
        mode = rng.choice(["fast", "immediate"])
        if self.halt.wait(at):
            return
        with self.server_lock:
            self.record("fault", "ok", fault="restart", mode=mode)
            self.server.restart(mode)
        self.record("fault_end", "ok", fault="restart")

    def _partition(self, rng: random.Random) -> None:
        for _ in self._every(rng, 2.0, 6.0):
            slot = self._target(rng, "partition")
            mode = rng.choice(["drop", "delay", "blackhole"])
            hold = rng.uniform(0.5, 3.0)
            lag = rng.uniform(0.05, 0.5)
            if slot is None:
                continue
            link, proxy = slot.name, self.fleet.proxy_of(slot, self.proxy)
            if mode == "drop":
                n = proxy.drop(link)
                self.record("fault", "ok", fault="partition", mode=mode, slot=slot.index, connections=n)
                continue
            self.record("fault", "ok", fault="partition", mode=mode, slot=slot.index, seconds=round(hold, 3),
                        **({"lag": round(lag, 3)} if mode == "delay" else {}))
            if mode == "delay":
                proxy.set_delay(link, lag)
            else:
                proxy.blackhole(link)
            self.halt.wait(hold)
            proxy.heal(link)

    def _skew(self, rng: random.Random) -> None:
        for _ in self._every(rng, 5.0, 12.0):
            slot = self._target(rng, "skew")
            if slot is not None and self.fleet.signal(slot, signal.SIGTERM):
                self.record("fault", "ok", fault="skew", slot=slot.index, note="SIGTERM; respawned with a new clock")

    def _drop_queue(self, rng: random.Random) -> None:
        for _ in self._every(rng, 3.0, 7.0):
            with self.server_lock:
                n = self.server.terminate_backends("leaseq-chaos-", database=self.queue_db,
                                                   sparing="leaseq-chaos-harness")
            self.record("fault", "ok", fault="drop_queue", backends=n)

    def _drop_ledger(self, rng: random.Random) -> None:
        for _ in self._every(rng, 3.0, 7.0):
            with self.server_lock:
                n = self.server.terminate_backends(APP_PREFIX, database=self.ledger_db)
            self.record("fault", "ok", fault="drop_ledger", backends=n)

    def _revoke(self, rng: random.Random) -> None:
        for _ in self._every(rng, 4.0, 9.0):
            slot = self._target(rng, "revoke")
            if slot is None:
                continue
            wid = self.fleet.worker_id(slot)
            if wid is None:
                self.record("fault", "skipped", fault="revoke", slot=slot.index, reason="not registered yet")
                continue
            try:
                self.queue.revoke_worker(wid)
            except Exception as exc:  # the database is restarting: this revocation did not happen
                self.record("fault", "error", fault="revoke", slot=slot.index, worker=wid,
                            error=type(exc).__name__)
                continue
            try:  # the database's time now: the revocation had committed by then (trace validation)
                committed_by: str | None = self.queue.now().isoformat()
            except Exception:
                committed_by = None
            self.record("fault", "ok", fault="revoke", slot=slot.index, worker=wid, committed_by=committed_by)

    def _service(self, rng: random.Random) -> None:
        for _ in self._every(rng, 6.0, 12.0):
            pause = rng.uniform(0.3, 2.0)
            if not self.service.kill():
                continue
            self.record("fault", "ok", fault="service", seconds=round(pause, 3))
            self.halt.wait(pause)
            try:
                self.service.start()
            except RuntimeError as exc:  # reported; the harness starts it again, and the schedule goes on
                self.record("fault_end", "error", fault="service", error=str(exc)[:300])
            else:
                self.record("fault_end", "ok", fault="service")
