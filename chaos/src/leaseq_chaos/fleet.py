"""The worker processes of a chaos run: spawn, signal, respawn, stop.

Each *slot* runs one worker process at a time (``python -m
leaseq_chaos.worker_process``). On PostgreSQL a slot reaches the database
through a proxy link of its own and names itself in ``application_name``,
so network faults and server-side terminations hit one worker only. A
remote slot reaches the queue over HTTP only, through ``leaseq serve`` (via
a proxy link of its own as well). A
process that dies (killed, or crashed because the database was down when it
started) is respawned by :meth:`Fleet.respawn_dead`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import skewed_clock

APP_PREFIX = "leaseq-chaos-w"


@dataclass
class Slot:
    """One worker position: its proxy port, its current process and its clock."""

    index: int
    dsn: str
    server: str | None = None       # remote: the `leaseq serve` URL (its link) this slot's workers use
    token_file: Path | None = None  # remote: the slot's worker token
    proc: subprocess.Popen | None = None
    spawns: int = 0
    stopped: bool = False   # SIGSTOPped by the fault injector right now
    clock_offset: float = 0.0
    clock_rate: float = 1.0

    @property
    def name(self) -> str:
        return f"w{self.index}"


class Fleet:
    """Starts and supervises the worker processes of one run."""

    def __init__(self, dsns: list[str], *, ledger_dsns: list[str], history_dir: Path, log_dir: Path,
                 concurrency: int, env: dict[str, str], record: Callable[..., None], skew_rng: random.Random | None,
                 seed: int = 0, remote: dict[int, tuple[str, Path]] | None = None):
        remote = remote or {}
        self.slots = [Slot(i, dsn, *remote.get(i, (None, None))) for i, dsn in enumerate(dsns)]
        self.ledger_dsns = ledger_dsns
        self.history_dir = history_dir
        self.log_dir = log_dir
        self.concurrency = concurrency
        self.env = env
        self.record = record
        self.skew_rng = skew_rng  # None: every clock is right
        self.seed = seed
        self.lock = threading.RLock()
        self.closing = False
        self.http_proxy: Any = None  # set by the runner when remote slots go through a proxy

    def _roll_clock(self, slot: Slot) -> None:
        if self.skew_rng is None:
            return
        rng = self.skew_rng
        slot.clock_offset = round(rng.choice([-1, 1]) * rng.uniform(1, 3600), 3)
        slot.clock_rate = round(rng.choice([rng.uniform(0.4, 0.9), rng.uniform(1.1, 2.0), 1.0]), 3)

    def spawn(self, slot: Slot) -> None:
        """Start a fresh process in ``slot`` (with a new skewed clock when skew is on)."""
        with self.lock:
            slot.spawns += 1
            self._roll_clock(slot)
            proc_name = f"{slot.name}.{slot.spawns}"
            env = dict(self.env, LEASEQ_DSN=slot.dsn, LEASEQ_CHAOS_LEDGER_DSN=self.ledger_dsns[slot.index],
                       LEASEQ_CHAOS_HISTORY=str(self.history_dir), LEASEQ_CHAOS_PROC=proc_name,
                       LEASEQ_CHAOS_CONCURRENCY=str(self.concurrency), LEASEQ_CHAOS_SEED=str(self.seed))
            if slot.server is not None:
                env.update(LEASEQ_CHAOS_SERVER=slot.server, LEASEQ_CHAOS_TOKEN_FILE=str(slot.token_file))
                env.pop("LEASEQ_DSN")  # the HTTP transport only
            env[skewed_clock.OFFSET_ENV] = str(slot.clock_offset)
            env[skewed_clock.RATE_ENV] = str(slot.clock_rate)
            log = open(self.log_dir / f"{proc_name}.log", "w")
            slot.proc = subprocess.Popen([sys.executable, "-m", "leaseq_chaos.worker_process"], env=env,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.close()
            slot.stopped = False
            self.record("spawn", "ok", slot=slot.index, proc_name=proc_name, pid=slot.proc.pid,
                        clock_offset=slot.clock_offset, clock_rate=slot.clock_rate,
                        transport="http" if slot.server is not None else "direct")

    def proxy_of(self, slot: Slot, queue_proxy: Any) -> Any:
        """The proxy carrying the slot's link: the HTTP one for a remote slot, else the database one."""
        return self.http_proxy if slot.server is not None else queue_proxy

    def proxies(self, queue_proxy: Any) -> list[Any]:
        """Every proxy in use (to heal them all)."""
        return [p for p in (queue_proxy, self.http_proxy) if p is not None]

    def worker_id(self, slot: Slot) -> str | None:
        """The worker identity the slot's current process registered (None before it has)."""
        path = self.history_dir / f"{slot.name}.{slot.spawns}.jsonl"
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return None
        for line in lines:
            if '"op":"register"' in line:
                try:
                    return json.loads(line)["worker"]
                except (ValueError, KeyError):
                    return None
        return None

    def start(self) -> None:
        """Start every slot."""
        for slot in self.slots:
            self.spawn(slot)

    def live(self) -> list[Slot]:
        """Slots whose process is running and not stopped."""
        with self.lock:
            return [s for s in self.slots if s.proc is not None and s.proc.poll() is None and not s.stopped]

    def signal(self, slot: Slot, sig: int) -> bool:
        """Send ``sig`` to the slot's process; False if it is gone."""
        with self.lock:
            if slot.proc is None or slot.proc.poll() is not None:
                return False
            try:
                os.kill(slot.proc.pid, sig)
            except ProcessLookupError:
                return False
            if sig == signal.SIGSTOP:
                slot.stopped = True
            elif sig == signal.SIGCONT:
                slot.stopped = False
            return True

    def respawn_dead(self) -> int:
        """Respawn every slot whose process has exited; returns how many."""
        if self.closing:
            return 0
        n = 0
        with self.lock:
            for slot in self.slots:
                if slot.proc is not None and slot.proc.poll() is not None:
                    self.record("exit", "ok", slot=slot.index, pid=slot.proc.pid, code=slot.proc.returncode)
                    self.spawn(slot)
                    n += 1
        return n

    def stop(self, grace: float = 10.0) -> None:
        """SIGCONT and SIGTERM every process, then SIGKILL what is left after ``grace``."""
        with self.lock:
            self.closing = True
            procs = [s.proc for s in self.slots if s.proc is not None and s.proc.poll() is None]
            for p in procs:
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    try:
                        os.kill(p.pid, sig)
                    except ProcessLookupError:
                        pass
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
