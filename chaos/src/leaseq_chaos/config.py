"""The knobs of a chaos run, checked before anything starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from leaseq.core.errors import InvalidInput

from .faults import FAULTS, HTTP_ONLY, PG_ONLY

BACKENDS = ("postgres", "sqlite")
#: What stands between the workers and the PostgreSQL server: ``none``, or ``pgbouncer`` (a
#: PgBouncer of the run's own in transaction mode, the workers' DSNs saying ``?pooler=transaction``).
POOLERS = ("none", "pgbouncer")
#: How workers reach the queue: ``direct`` (a database connection each),
#: ``http`` (every worker through ``leaseq serve``), ``mixed`` (every other one).
TRANSPORTS = ("direct", "http", "mixed")


def default_faults(backend: str, transport: str = "direct") -> tuple[str, ...]:
    """Every fault the backend and the transport support."""
    return tuple(f for f in FAULTS if (backend == "postgres" or f not in PG_ONLY)
                 and (transport != "direct" or f not in HTTP_ONLY))


def parse_faults(text: str, backend: str, transport: str = "direct") -> tuple[str, ...]:
    """``kill,stop,...`` (or ``all`` / ``none``) as a tuple; unknown or unsupported names are refused."""
    text = text.strip()
    if text == "all":
        return default_faults(backend, transport)
    if text in ("", "none"):
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise InvalidInput("faults", f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    if backend != "postgres":
        pg_only = [n for n in names if n in PG_ONLY]
        if pg_only:
            verb = "needs" if len(pg_only) == 1 else "need"
            raise InvalidInput("faults", f"{', '.join(pg_only)} {verb} --backend postgres (SQLite has no "
                                         "server or network connection to fault)")
    if transport == "direct" and any(n in HTTP_ONLY for n in names):
        raise InvalidInput("faults", "service needs remote workers (--transport http or mixed)")
    return names


@dataclass
class ChaosConfig:
    """One run. ``duration`` is the whole run: faults and new work stop at
    ``duration - settle_seconds``, then the queue gets the rest to settle."""

    duration: float = 60.0
    workers: int = 8
    tasks: int = 400
    seed: int = 1
    faults: tuple[str, ...] = field(default_factory=lambda: default_faults("postgres"))
    backend: str = "postgres"
    concurrency: int = 4
    #: tasks each worker leases ahead of its handler slots (the worker's ``prefetch``)
    prefetch: int = 0
    history_path: Path | None = None
    pg_bin: str | None = None
    transport: str = "direct"
    pooler: str = "none"
    #: the workers and the service in the portable mode (``?portable=true``)
    portable: bool = False

    def __post_init__(self) -> None:
        if self.pooler not in POOLERS:
            raise InvalidInput("pooler", f"must be one of {', '.join(POOLERS)} (got {self.pooler!r})")
        if self.pooler != "none" and self.backend != "postgres":
            raise InvalidInput("pooler", "a pooler stands in front of PostgreSQL: it needs --backend postgres")
        if self.portable and self.backend != "postgres":
            raise InvalidInput("portable", "the portable mode is PostgreSQL's: it needs --backend postgres")
        if self.backend not in BACKENDS:
            raise InvalidInput("backend", f"must be postgres or sqlite (got {self.backend!r})")
        if self.transport not in TRANSPORTS:
            raise InvalidInput("transport", f"must be one of {', '.join(TRANSPORTS)} (got {self.transport!r})")
        for name, low, high in (("workers", 1, 64), ("tasks", 1, 1_000_000), ("concurrency", 1, 64),
                                ("prefetch", 0, 64)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidInput(name, f"must be an integer from {low} to {high} (got {value!r})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InvalidInput("seed", f"must be an integer (got {self.seed!r})")
        if isinstance(self.duration, bool) or not isinstance(self.duration, (int, float)) \
                or not 20 <= self.duration <= 24 * 3600:
            raise InvalidInput("duration", f"must be from 20 to 86400 seconds (got {self.duration!r})")
        self.faults = parse_faults(",".join(self.faults), self.backend, self.transport)

    def remote(self, slot: int) -> bool:
        """Whether worker ``slot`` talks to the queue over HTTP."""
        return self.transport == "http" or (self.transport == "mixed" and slot % 2 == 1)

    @property
    def settle_seconds(self) -> float:
        """The quiet tail of the run: no faults, no new work; the queue must settle within it.
        At least 20 s, whatever the duration: a task failed for the fifth time just before the
        tail waits up to 16 s for its last retry (the backoff doubles from 1 s), and a short run
        must give it that. A tail longer than the duration's share runs past the duration."""
        return min(60.0, max(20.0, self.duration * 0.25))

    @property
    def chaos_seconds(self) -> float:
        """How long faults are injected and work enqueued."""
        return self.duration - min(60.0, max(15.0, self.duration * 0.25))
