"""The history: every operation every process of a chaos run tried, and what came of it.

Each process appends one JSON object per line to a file of its own in the
run's history folder (``O_APPEND`` writes; a process killed mid-line leaves
at most one broken last line, which the reader skips). Every record carries
the time on the machine's monotonic clock, shared by all processes, read
through a reference taken at import, before any test clock is installed, so
a skewed worker still records true times.

A record is ``{"t", "wall", "proc", "op", "outcome", ...}`` where ``outcome``
is ``ok``, ``refused`` (a guard said no: nothing changed), ``error`` (the call
failed before reaching a verdict) or ``unknown`` (the call may or may not have
taken effect, e.g. the connection broke during commit), as in Jepsen's
ok / fail / info.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

# Taken at import: the chaos worker installs its skewed clock afterwards.
_monotonic = time.monotonic
_wall = time.time


def now() -> float:
    """The true monotonic time (shared by every process on the machine)."""
    return _monotonic()


def wall() -> float:
    """The true wall-clock time, whatever clock the process was given (a downstream service's clock)."""
    return _wall()


class HistoryWriter:
    """Appends records for one process to ``<folder>/<proc>.jsonl``."""

    def __init__(self, folder: str | os.PathLike, proc: str):
        self.proc = proc
        self.path = Path(folder) / f"{proc}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def record(self, op: str, outcome: str, **fields: Any) -> None:
        """Append one record."""
        entry = {"t": round(_monotonic(), 6), "wall": round(_wall(), 6), "proc": self.proc, "op": op,
                 "outcome": outcome, **fields}
        line = (json.dumps(entry, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read_history(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of every process, ordered by time (broken lines skipped)."""
    records = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a process killed while writing
            if isinstance(entry, dict) and "t" in entry:
                records.append(entry)
    records.sort(key=lambda r: r["t"])
    return records
