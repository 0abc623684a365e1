"""Schema and retention: migrations, the schema version, pruning finished tasks."""

from __future__ import annotations

from ..core import checks
from ..core.errors import ConfigError
from ..store.base import load_migrations
from ..store.functions import fingerprint, install_script
from .common import Settings, actor, audit
from .steps import BEGIN, COMMIT, Op, Script, one, rows


def migrate(s: Settings, dialect: str) -> Op[list[int]]:
    """:meth:`leaseq.Queue.migrate`: every migration not applied yet, in one transaction."""
    applied_now: list[int] = []
    latest = max((m.version for m in load_migrations(dialect)), default=0)
    schema = ""
    if dialect == "postgres":
        # current already (tables and functions): nothing to write, so no privilege needed
        yield BEGIN
        found = yield one("functions_installed")
        schema = "" if found is None else found["schema"] or ""
        current = found is not None and found["present"] and found["fingerprint"] == fingerprint() and \
            max((r["version"] for r in (yield rows("migrations_applied"))), default=0) >= latest
        yield COMMIT
        if current:
            return applied_now
        if not schema:
            raise ConfigError("dsn: no schema to create leaseq's tables in (no schema of the connection's "
                              "search_path exists): create it first (CREATE SCHEMA name), or point the DSN's "
                              "search_path at one that exists (?options=-csearch_path%3Dname)")
    yield BEGIN
    yield rows("migrations_lock")
    yield rows("migrations_create")
    done = {r["version"] for r in (yield rows("migrations_applied"))}
    for mig in load_migrations(dialect):
        if mig.version not in done:
            yield Script(mig.sql)
            yield rows("migrations_record", version=mig.version, name=mig.name)
            applied_now.append(mig.version)
    if dialect == "postgres":
        # not versioned: the functions, their owner and grants are made anew from the named queries
        yield Script(install_script(schema))
    yield COMMIT
    return applied_now


def schema_version(s: Settings) -> Op[int]:
    """:meth:`leaseq.Queue.schema_version`."""
    yield BEGIN
    if not (yield one("migrations_table_exists"))["present"]:
        yield COMMIT
        return 0  # a read: never create anything in a database that is not ours
    versions = [r["version"] for r in (yield rows("migrations_applied"))]
    yield COMMIT
    return max(versions, default=0)


_CENTURY = 100 * 365 * 86400.0


def prune(s: Settings, older_than_seconds: float, *, payloads_older_than_seconds: float | None = None,
          batch: int = 1000, by: str | None = None, via: str | None = None,
          record_empty: bool = True) -> Op[dict[str, int]]:
    """:meth:`leaseq.Queue.prune`: one transaction per batch, each audited."""
    older = checks.check_seconds("older_than_seconds", older_than_seconds, allow_zero=True, maximum=_CENTURY)
    if payloads_older_than_seconds is not None:
        payloads_older_than_seconds = checks.check_seconds(
            "payloads_older_than_seconds", payloads_older_than_seconds, allow_zero=True, maximum=_CENTURY)
    batch = checks.check_int("batch", batch, minimum=1, maximum=100_000)
    by, via = actor(by, via)
    settings = dict(older_than_seconds=older, payloads_older_than_seconds=payloads_older_than_seconds)
    counts = {"tasks": 0, "events": 0, "effects": 0, "payloads": 0}
    while True:
        yield BEGIN
        ids = [r["id"] for r in (yield rows("prune_finished_ids", older_than=older, limit=batch))]
        if ids:
            done = {"tasks": 0, "events": len((yield rows("prune_events", task_ids=ids))),
                    "effects": len((yield rows("prune_effects", task_ids=ids))), "payloads": 0}
            done["tasks"] = len((yield rows("prune_tasks", task_ids=ids)))
            yield from audit(by, via, "prune", "retention", **settings, **done)
            for key, n in done.items():
                counts[key] += n
        yield COMMIT
        if len(ids) < batch:
            break
    while payloads_older_than_seconds is not None:
        yield BEGIN
        n = len((yield rows("prune_payloads", older_than=payloads_older_than_seconds, limit=batch)))
        if n:
            yield from audit(by, via, "prune", "retention", **settings, tasks=0, events=0, effects=0, payloads=n)
        yield COMMIT
        counts["payloads"] += n
        if n < batch:
            break
    if record_empty and not any(counts.values()):
        yield BEGIN
        yield from audit(by, via, "prune", "retention", **settings, **counts)
        yield COMMIT
    return counts
