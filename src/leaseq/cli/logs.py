"""Logging for ``leaseq worker`` and ``leaseq serve``: text or JSON lines, quiet dependencies, a
readable progress line.

The runtime logs through ``logging`` with ``LoggerAdapter`` extras
(``task_id``, ``generation``, ``worker_id``); this module only decides how
those records look. ``--log-format json`` prints one JSON object per line
with ``time``, ``level``, ``logger``, ``message`` and, where the record
carries them, ``task_id``, ``kind``, ``generation``, ``attempt``, ``worker``,
``duration`` (the handler's run time in seconds) and ``outcome`` (completed,
retried, failed, blocked, needs_reconciliation, released, lost, unconfirmed).
Text lines name the task's kind and attempt in their prefix and end with
the handler's duration once it is known.

``leaseq serve --log-format json`` uses the same lines (:func:`service_logging`):
the service's per-task records carry ``task_id``, ``kind``, ``generation``,
``worker`` and ``duration`` (the request's time in seconds) where it knows
them, and uvicorn's own records go through the same handler.

With ``--progress``, per-task lines at INFO are left out (``--log-level
debug`` shows them): the progress line counts them. On a terminal the progress
line is redrawn below each log line, so neither overwrites the other.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, TextIO

from ..worker.runtime import WorkerStats

#: Libraries whose INFO lines would drown the worker's (httpx logs every request; urllib3
#: the connections it opens).
QUIET_LOGGERS = ("httpx", "httpcore", "urllib3")

#: Record attributes copied into a JSON line, and the key each gets.
EXTRA_FIELDS = (("task_id", "task_id"), ("kind", "kind"), ("generation", "generation"), ("attempt", "attempt"),
                ("worker_id", "worker"), ("duration", "duration"), ("outcome", "outcome"), ("stats", "stats"))

#: The ``task=… gen=… worker=…: `` prefix of the runtime's per-task messages,
#: redundant in a JSON line that has those fields.
_TASK_PREFIX = re.compile(r"^task=\S+ (?:kind=\S+ )?gen=\S+ (?:attempt=\S+ )?worker=\S+: ")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def summary(stats: WorkerStats) -> str:
    """A worker's counters for people: ``completed 12, failed 1, lost 0, released 0 (…)``."""
    text = (f"completed {stats.completed}, failed {stats.failed}, lost {stats.lost}, released {stats.released} "
            f"(claimed {stats.claimed} in {_elapsed(stats):.1f}s, {stats.rate:.1f}/s)")
    if stats.lost_reasons:
        text += "; leases lost: " + ", ".join(f"{reason} ×{n}" for reason, n in sorted(stats.lost_reasons.items()))
    return text


def progress_line(stats: WorkerStats) -> str:
    """The progress line's text."""
    return (f"claimed {stats.claimed}  completed {stats.completed}  failed {stats.failed}  "
            f"lost {stats.lost}  released {stats.released}  {stats.rate:.1f}/s")


def stats_fields(stats: WorkerStats) -> dict[str, Any]:
    """A worker's counters as JSON fields."""
    return {"claimed": stats.claimed, "completed": stats.completed, "failed": stats.failed, "lost": stats.lost,
            "released": stats.released, "seconds": round(_elapsed(stats), 3), "rate": round(stats.rate, 2),
            "lost_reasons": dict(stats.lost_reasons)}


def _elapsed(stats: WorkerStats) -> float:
    return max(0.0, time.monotonic() - stats.started_at)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds")
                    .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _TASK_PREFIX.sub("", message) if hasattr(record, "task_id") else message,
        }
        for attribute, key in EXTRA_FIELDS:
            value = getattr(record, attribute, None)
            if value is not None:
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``, and the handler's duration at the end of a task's lines once it is known."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        duration = getattr(record, "duration", None)
        return text if duration is None else f"{text} (duration {duration:.3f}s)"


class StatusLine:
    """The progress line on a terminal: written in place, cleared and redrawn around log lines."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.lock = threading.RLock()
        self.text = ""

    def show(self, text: str) -> None:
        with self.lock:
            self.text = text
            self.stream.write("\r\x1b[2K" + text)
            self.stream.flush()

    def clear(self) -> None:
        with self.lock:
            if self.text:
                self.stream.write("\r\x1b[2K")

    def redraw(self) -> None:
        with self.lock:
            if self.text:
                self.stream.write(self.text)
                self.stream.flush()

    def finish(self) -> None:
        """Leave the last progress line on screen and move below it."""
        with self.lock:
            if self.text:
                self.stream.write("\n")
                self.stream.flush()
                self.text = ""


class WorkerLogHandler(logging.StreamHandler[TextIO]):
    """A stderr handler that keeps a terminal's progress line below the log lines."""

    def __init__(self, stream: TextIO, status: StatusLine | None):
        super().__init__(stream)
        self.status = status

    def emit(self, record: logging.LogRecord) -> None:
        if self.status is None:
            super().emit(record)
            return
        with self.status.lock:
            self.status.clear()
            super().emit(record)
            self.status.redraw()


class WorkerLogFilter(logging.Filter):
    """Drops what the command line prints itself or what a progress line replaces.

    * the runtime's final record carrying its :class:`WorkerStats` (the command
      prints a summary of its own, in the chosen format);
    * with a progress line, per-task records at INFO (shown at DEBUG).
    """

    def __init__(self, *, hide_task_info: bool):
        super().__init__()
        self.hide_task_info = hide_task_info

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if any(isinstance(a, WorkerStats) for a in args):
            return False
        if self.hide_task_info and record.levelno == logging.INFO and hasattr(record, "task_id"):
            return False
        return True


class WorkerLogging:
    """The logging set-up of one ``leaseq worker`` run."""

    def __init__(self, *, level: str, fmt: str, progress: bool, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.fmt = fmt
        self.tty = self.stream.isatty()
        self.status = StatusLine(self.stream) if progress and self.tty and fmt == "text" else None
        handler = WorkerLogHandler(self.stream, self.status)
        handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
        handler.addFilter(WorkerLogFilter(hide_task_info=progress and level != "debug"))
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(level.upper())
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        self.log = logging.getLogger("leaseq.cli")
        self._ticks = 0

    def progress(self, stats: WorkerStats) -> None:
        """The runtime's progress callback (about once a second)."""
        self._ticks += 1
        line = progress_line(stats)
        if self.status is not None:
            self.status.show(line)
        elif self._ticks % 10 == 0:  # not a terminal: a log line every ten seconds
            self.log.info("progress: %s", line, extra={"stats": stats_fields(stats)})

    def stopped(self, stats: WorkerStats) -> None:
        """The last line: a summary for people, or a JSON object."""
        if self.status is not None:
            self.status.show(progress_line(stats))  # the final counts, left on screen
            self.status.finish()
        if self.fmt == "json":
            record = self.log.makeRecord(self.log.name, logging.INFO, __file__, 0, "worker stopped: %s",
                                         (summary(stats),), None, extra={"stats": stats_fields(stats)})
            self.stream.write(JsonFormatter().format(record) + "\n")
        else:
            self.stream.write(f"worker stopped: {summary(stats)}\n")
        self.stream.flush()


def service_logging(*, level: str, fmt: str, stream: TextIO | None = None) -> logging.Logger:
    """Logging for ``leaseq serve``: one handler on the root logger, text or JSON lines.

    uvicorn is then started without a logging configuration of its own
    (``log_config=None``), so its records reach this handler too. Returns the
    service's logger, for the lines the command writes itself."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    return logging.getLogger("leaseq.service")
