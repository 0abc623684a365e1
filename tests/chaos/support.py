"""Running `leaseq chaos` in a subprocess, as a user would, and reading its verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from system_tools import require_tool

ROOT = Path(__file__).resolve().parents[2]


def need_pg_binaries() -> None:
    """Skip (or fail, with LEASEQ_REQUIRE_PG=1 or LEASEQ_REQUIRE_TOOLS=1) when no PostgreSQL server
    binaries (initdb, pg_ctl) are installed for the private chaos server."""
    require_tool("pg_ctl")


class ChaosRun:
    """``leaseq chaos ARGS --history …`` started in a subprocess; :meth:`result` waits for it.

    Its output goes to files in its folder, not pipes: runs started side by side are read one
    after another, and a pipe nobody reads would stall a run that printed more than it holds."""

    def __init__(self, tmp_path: Path, *args: str, pythonpath: Path | None = None, timeout: float = 240):
        self.folder, self.history = tmp_path, tmp_path / "history.json"
        self.deadline = time.monotonic() + timeout
        env = {k: v for k, v in os.environ.items() if k != "LEASEQ_DSN"}
        if pythonpath is not None:  # first; leaseq_chaos still comes from where it was found
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH")) if p)
        self.args = [sys.executable, "-m", "leaseq.cli.main", "chaos", *args, "--history", str(self.history)]
        with open(tmp_path / "stdout", "wb") as out, open(tmp_path / "stderr", "wb") as err:
            self.proc = subprocess.Popen(self.args, cwd=tmp_path, env=env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL)

    def result(self) -> tuple[subprocess.CompletedProcess, dict]:
        """The finished process (its output read back) and the parsed history file; a run still
        going at its deadline is killed and raises ``subprocess.TimeoutExpired``, as
        ``subprocess.run`` would."""
        try:
            self.proc.wait(max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        read = lambda name: (self.folder / name).read_text(errors="replace")  # noqa: E731
        proc = subprocess.CompletedProcess(self.args, self.proc.returncode, read("stdout"), read("stderr"))
        document = json.loads(self.history.read_text()) if self.history.exists() else {}
        return proc, document

    def stop(self) -> None:
        """Kill the run if it is still going (a test that ended before reading it)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_chaos_cli(tmp_path: Path, *args: str, pythonpath: Path | None = None,
                  timeout: float = 240) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``leaseq chaos ARGS --history …`` and return the process and the parsed history file."""
    return ChaosRun(tmp_path, *args, pythonpath=pythonpath, timeout=timeout).result()


def recheck_cli(history: Path) -> subprocess.CompletedProcess:
    """``leaseq chaos --recheck HISTORY`` with the package under test."""
    return subprocess.run([sys.executable, "-m", "leaseq.cli.main", "chaos", "--recheck", str(history)],
                          cwd=history.parent, capture_output=True, text=True, timeout=120)


def describe(proc: subprocess.CompletedProcess) -> str:
    """The end of a run's output, for assertion messages."""
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-3000:]}"


def violation_timelines(doc: dict, limit: int = 3) -> str:
    """What the history says about the first ``limit`` violating tasks: every call made on
    them (seconds from the run's start, with its outcome and its process's clock) and their
    lease events (with the heartbeats the queue counted), for a failure to explain itself."""
    history = doc.get("history") or []
    if not history:
        return ""
    start = history[0]["t"]
    clocks = {r["proc_name"]: r.get("clock_rate") for r in history if r["op"] == "spawn"}
    lines = []
    for violation in doc["verdict"]["violations"][:limit]:
        task = violation.get("task")
        lines.append(f"task {task} ({violation['invariant']}):")
        for r in history:
            pairs = r.get("tasks") if isinstance(r.get("tasks"), list) else []
            if r.get("task") != task and not any(p and p[0] == task for p in pairs):
                continue
            sent = f" sent {r['t0'] - start:.3f}" if "t0" in r else ""
            clock = f" clock x{clocks[r['proc']]}" if clocks.get(r["proc"]) not in (None, 1.0) else ""
            lines.append(f"  {r['t'] - start:8.3f}{sent} {r['proc']}{clock} {r['op']} {r['outcome']}"
                         f" gen={r.get('gen', '')} {r.get('lease', '')}".rstrip())
        for e in (doc.get("events") or {}).get(str(task), []):
            detail = {k: v for k, v in (e.get("detail") or {}).items()
                      if k in ("lease_seconds", "lease_expires_at", "heartbeats", "last_heartbeat_at",
                               "longest_heartbeat_gap", "routed_to")}
            lines.append(f"  event {e['type']} gen={e.get('generation')} at {e['at']} {detail}")
    return "\n".join(lines)[:6000]
