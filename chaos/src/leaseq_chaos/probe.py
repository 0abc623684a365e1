"""The stale-writer probe: a worker that wakes up holding a superseded claim.

The worker runtime notices most lost leases itself and stops early, so the
worker processes rarely put the database's guards to the test. The probe
does, deliberately, and the same way every cycle: its worker claims a task
(generation *g*), lets the lease run out as if paused, claims the task again
(generation *g+1*, same worker identity, so only the generation tells the
two apart) and writes downstream with it. Then, in a seeded order, it tries
every lease-backed call with the superseded claim (renew, begin an effect,
fail, release, complete) and a downstream write with token *g*. Each must be
refused; an accepted one is a violation (``probe.<call> ok`` in the
history). Finally it completes the task with its live claim.

Probe tasks live on a queue of their own that the worker processes do not
serve, so the probe alone decides who holds them.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

from leaseq.core.errors import LeaseqError, LeaseLost, StaleToken

from .history import HistoryWriter, now
from .workload import LEDGER_TABLE, PROBE_QUEUE

PROBE_LEASE = 0.3


class StaleWriterProbe:
    """Runs probe cycles on a thread until :meth:`stop`."""

    def __init__(self, queue: Any, fence: Any, history: HistoryWriter, rng: random.Random, run_tag: str,
                 *, interval: tuple[float, float] = (1.0, 3.0)):
        self.q = queue
        self.fence = fence
        self.history = history
        self.rng = rng
        self.run_tag = run_tag
        self.interval = interval
        self.halt = threading.Event()
        self.cycles = 0
        self.worker = None
        self._thread = threading.Thread(target=self._main, name="chaos-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.halt.set()
        self._thread.join(30)

    def _main(self) -> None:
        while not self.halt.wait(self.rng.uniform(*self.interval)):
            try:
                self.cycle()
            except LeaseqError as exc:  # the database is restarting: try again next cycle
                self.history.record("probe", "error", error=f"{type(exc).__name__}: {exc}"[:300])
            except Exception as exc:  # pragma: no cover - reported, never fatal to the run
                self.history.record("probe", "error", error=f"{type(exc).__name__}: {exc}"[:300])

    def cycle(self) -> None:
        """One probe: claim, lose, reclaim, then try every stale write."""
        q, rec = self.q, self.history.record
        if self.worker is None:
            self.worker = q.register_worker("chaos-probe")
        w = self.worker
        self.cycles += 1
        n = self.cycles
        task = q.enqueue("chaos.probe", {"cycle": n}, effect="side_effect", queue=PROBE_QUEUE,
                         idempotency_key=f"{self.run_tag}-probe-{n}", lease_seconds=PROBE_LEASE, max_attempts=100)
        rec("enqueue", "ok", task=task.id, kind="chaos.probe", effect="side_effect")
        old = self._claim(w, task.id)
        if old is None:
            return
        # As if paused: wait, by the database's clock, until the lease has run out.
        while q.now() <= old.expires_at:
            time.sleep(0.05)
        new = self._claim(w, task.id)
        if new is None:
            return
        if new.generation <= old.generation:
            rec("probe.claim", "ok", task=task.id, gen=old.generation, note="reclaim did not advance the generation")
        resource = f"probe:{task.id}"
        self._write_downstream(resource, new.generation, task.id, f"{task.idempotency_key}:live")

        attempts: list[tuple[str, Callable[[], Any]]] = [
            ("renew", lambda: q.heartbeat(w, old)),
            ("begin_effect", lambda: q.begin_effect(w, old, "probe.write")),
            ("fail", lambda: q.fail(w, old, "stale failure", retry=False)),
            ("release", lambda: q.release(w, old, "stale release")),
            ("complete", lambda: q.complete(w, old, {"task": task.id, "generation": old.generation})),
            ("downstream", lambda: self._write_downstream(resource, old.generation, task.id,
                                                          f"{task.idempotency_key}:stale")),
        ]
        self.rng.shuffle(attempts)
        for name, attempt in attempts:
            fields = dict(task=task.id, gen=old.generation, newer=new.generation)
            try:
                attempt()
            except (LeaseLost, StaleToken) as exc:
                rec(f"probe.{name}", "refused", **fields, error=type(exc).__name__)
            except LeaseqError as exc:
                rec(f"probe.{name}", "unknown", **fields, error=f"{type(exc).__name__}: {exc}"[:200])
            else:
                rec(f"probe.{name}", "ok", **fields)
        self._finish(w, new)

    def _claim(self, w: Any, task_id: int, patience: float = 5.0) -> Any:
        """Claim the probe's task; tasks left over by a cycle the database broke are finished legitimately.

        A claim skips a row another transaction holds locked: the sweeper expiring the very lease
        the probe let run out, say. The probe asks again until ``patience`` runs out."""
        deadline = time.monotonic() + patience
        while True:
            for c in self.q.claim(w, queue=PROBE_QUEUE, limit=50):
                self.history.record("claim", "ok", worker=w.id, task=c.task_id, gen=c.generation,
                                    lease=c.lease_seconds)
                if c.task_id == task_id:
                    return c
                self._finish(w, c)
            if time.monotonic() > deadline or self.halt.is_set():
                self.history.record("probe", "error", task=task_id, error="the probe task was not claimable")
                return None
            time.sleep(0.05)

    def _finish(self, w: Any, claim: Any) -> None:
        t0 = now()
        try:
            self.q.complete(w, claim, {"task": claim.task_id, "generation": claim.generation})
        except LeaseLost:
            self.history.record("complete", "refused", task=claim.task_id, gen=claim.generation, worker=w.id, t0=t0)
        else:
            self.history.record("complete", "ok", task=claim.task_id, gen=claim.generation, worker=w.id, t0=t0)

    def drain(self, timeout: float = 10.0) -> None:
        """Finish every probe task a broken cycle left behind (run after :meth:`stop`)."""
        if self.worker is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.q.sweep()
                claims = self.q.claim(self.worker, queue=PROBE_QUEUE, limit=100)
                for c in claims:
                    self.history.record("claim", "ok", worker=self.worker.id, task=c.task_id, gen=c.generation,
                                        lease=c.lease_seconds)
                    self._finish(self.worker, c)
                if not claims and not any(r["status"] in ("queued", "running") for r in self.q.stats()
                                          if r["queue"] == PROBE_QUEUE):
                    return
            except LeaseqError:
                pass
            time.sleep(0.1)

    def _write_downstream(self, resource: str, token: int, task_id: int, key: str) -> None:
        mark = "%s" if self.fence.dialect == "postgres" else "?"

        def write(conn: Any) -> None:
            conn.execute(f"INSERT INTO {LEDGER_TABLE} (resource, idempotency_key, token, task_id, effect, proc) "
                         f"VALUES ({mark}, {mark}, {mark}, {mark}, {mark}, {mark})",
                         (resource, key, token, task_id, "side_effect", "probe"))

        self.fence.apply(resource, f"{task_id}.{token}", write)
