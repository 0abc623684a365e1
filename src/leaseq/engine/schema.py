"""Schema and retention: migrations, the schema version, clearing and pruning ended tasks, the evidence record."""

from __future__ import annotations

from typing import Any

from ..core import checks
from ..core.errors import ConfigError, InvalidInput
from ..store.base import load_migrations
from ..store.functions import fingerprint, install_script
from .common import Settings, acting, actor, audit
from .steps import BEGIN, BEGIN_ONE, COMMIT, Op, Script, one, rows


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
    if s.backend.advisory_locks:
        yield rows("migrations_lock")
        yield rows("migrations_create")
    else:  # the portable mode: the bookkeeping table is the lock
        yield rows("migrations_create")
        yield rows("migrations_lock_table")
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

#: The statuses a task ends in: retention clears and then deletes these, and
#: only these (blocked and needs_reconciliation wait for a person; the others
#: are live).
ENDED_STATUSES = ("completed", "cancelled", "dead", "denied", "expired")

#: How long the evidence record of a pruned task is kept by default, counted
#: from when the task ended: a year, or the task retention if that is longer.
DEFAULT_EVIDENCE_SECONDS = 365 * 86400.0

#: The keys of an event's (or a task's audit entry's) ``detail`` that retention
#: keeps: who held which generation, who decided what and why each lease ended,
#: as identifiers, counts, times and statuses. Every other key goes: error
#: texts, reasons, notes, approval digests (unsalted: a payload can be guessed
#: from its digest), idempotency keys, resources, and whatever a future event
#: adds until it is named here. Never add a key that can carry user data.
EVIDENCE_KEYS: tuple[str, ...] = (
    # the lease: its attempt, its term and its heartbeats
    "attempt", "lease_seconds", "lease_expires_at", "heartbeats", "last_heartbeat_at", "longest_heartbeat_gap",
    "started",
    # where the attempt sent the task, and why in the words of the state machine
    "next_status", "routed_to", "previous_status", "status", "open_intents", "error_streak", "retry_at", "after",
    "snoozes", "revoked_lease_of", "previous_attempts", "outcome", "deadline_at",
    # dependencies and intents, by task id
    "dependency", "dependency_status", "on_dependency_failure", "parent_task_id", "child_task_id", "kind", "queue",
    "priority",
    # actions, by name and ledger id
    "action", "effect", "effect_id", "recorded_generation", "previous_generation",
    # streams: where an attempt's entries begin (a cursor)
    "seq",
    # child tasks and cancel trees, by task id, with each one's disposition (no keys, no reasons)
    "children", "ended", "intents", "effects", "waits", "disposition", "waiting_for", "waited_seconds",
    # approvals: who asked and who decided (not the digest: unsalted, a payload can be guessed from it)
    "requested_by", "by", "via", "deadline_seconds", "approval",
)


#: The retention settings' names, as :func:`retention_periods` reports them by default.
RETENTION_FIELDS = ("older_than_seconds", "payloads_older_than_seconds", "evidence_older_than_seconds")


def retention_periods(older_than_seconds: float, payloads_older_than_seconds: float | None,
                      evidence_older_than_seconds: float | None,
                      names: tuple[str, str, str] = RETENTION_FIELDS) -> tuple[float, float | None, float]:
    """The three retention periods, checked (:class:`InvalidInput` names the field as ``names``
    spells it): tasks, their payloads (None: kept until the task goes), and the evidence record,
    which outlives its task (by default :data:`DEFAULT_EVIDENCE_SECONDS`, or the task's own)."""
    older_name, payloads_name, evidence_name = names
    older = checks.check_seconds(older_name, older_than_seconds, allow_zero=True, maximum=_CENTURY)
    payloads = payloads_older_than_seconds
    if payloads is not None:
        payloads = checks.check_seconds(payloads_name, payloads, allow_zero=True, maximum=_CENTURY)
    if evidence_older_than_seconds is None:
        return older, payloads, max(DEFAULT_EVIDENCE_SECONDS, older)
    evidence = checks.check_seconds(evidence_name, evidence_older_than_seconds, allow_zero=True, maximum=_CENTURY)
    if evidence < older:
        raise InvalidInput(evidence_name, f"must be at least {older_name} ({older:g} s): the evidence record "
                                          f"outlives its task (got {evidence:g} s)")
    return older, payloads, evidence


def check_streams_retention(value: float | None, name: str = "streams_older_than_seconds") -> float | None:
    """The streams' own retention (seconds since the task ended; None: kept with the task's other user data)."""
    if value is None:
        return None
    return checks.check_seconds(name, value, allow_zero=True, maximum=_CENTURY)


def prune(s: Settings, older_than_seconds: float, *, payloads_older_than_seconds: float | None = None,
          evidence_older_than_seconds: float | None = None, batch: int = 1000, by: str | None = None,
          via: str | None = None, record_empty: bool = True,
          streams_older_than_seconds: float | None = None) -> Op[dict[str, int]]:
    """:meth:`leaseq.Queue.prune`: one transaction per batch, each audited."""
    older, payloads, evidence = retention_periods(older_than_seconds, payloads_older_than_seconds,
                                           evidence_older_than_seconds)
    streams = check_streams_retention(streams_older_than_seconds)
    batch = checks.check_int("batch", batch, minimum=1, maximum=100_000)
    actor(by, via)  # checked before anything runs
    yield BEGIN
    by, via = yield from acting(by, via)  # a database role acts under its own name
    yield COMMIT
    settings = dict(older_than_seconds=older, payloads_older_than_seconds=payloads,
                    evidence_older_than_seconds=evidence)
    if streams is not None:
        settings["streams_older_than_seconds"] = streams
    keys = list(EVIDENCE_KEYS)
    counts = dict.fromkeys(("tasks", "events", "effects", "payloads", "evidence", "evidence_pruned",
                            "audit_pruned", "streams", "flow_keys_pruned", "spend_pruned", "fairness_pruned"), 0)

    def passes(step: str, cut: float) -> Op[None]:
        while True:
            yield BEGIN
            done = dict.fromkeys(counts, 0)
            if step in ("evidence", "audit", "flow_keys", "spend", "fairness"):
                # the evidence record, the audit log and the spend per day (one clock), the
                # lock rows of singleton and debounce keys no enqueue named within the retention,
                # and the fair-share rows of keys idle for it
                n = len((yield rows(f"prune_{step}", older_than=cut, limit=batch)))
                done[f"{step}_pruned"] = n
            elif step == "streams":  # the streams of ended tasks, on a retention of their own
                ids = [r["id"] for r in (yield rows("streams_finished_ids", older_than=cut, limit=batch))]
                n = done["streams"] = len(ids)
                if ids:
                    yield rows("prune_streams", task_ids=ids)
            else:
                ids = [r["id"] for r in (yield rows(f"{step}_finished_ids", older_than=cut, limit=batch))]
                n = len(ids)
                if ids:
                    yield from _scrub(ids, keys, done, deleting=step == "prune")
            if any(done.values()):
                yield from audit(by, via, "prune", "retention", **settings, **done)
                for key, value in done.items():
                    counts[key] += value
            yield COMMIT
            if n < batch:
                return

    # deleting first: what is deleted now need not be cleared first
    yield from passes("prune", older)
    if streams is not None:
        yield from passes("streams", streams)
    if payloads is not None:
        yield from passes("scrub", payloads)
    yield from passes("evidence", evidence)
    yield from passes("audit", evidence)
    yield from passes("spend", evidence)
    yield from passes("flow_keys", older)
    yield from passes("fairness", older)
    if record_empty and not any(counts.values()):
        yield BEGIN
        yield from audit(by, via, "prune", "retention", **settings, **counts)
        yield COMMIT
    return counts


def _scrub(ids: list[int], keys: list[str], done: dict[str, int], *, deleting: bool) -> Op[None]:
    """Clear the user data of the ended tasks ``ids`` in the open transaction (payload,
    result, last error, streams, effect responses, approval notes, event details and the tasks'
    audit entries beyond :data:`EVIDENCE_KEYS`); with ``deleting``, then copy each
    trail to the evidence record and delete the tasks with everything that hangs off them."""
    yield rows("scrub_audit", task_ids=ids, kept_keys=keys)
    if deleting:
        done["evidence"] = len((yield rows("keep_evidence", task_ids=ids, kept_keys=keys)))
        done["events"] = len((yield rows("prune_events", task_ids=ids)))
        done["effects"] = len((yield rows("prune_effects", task_ids=ids)))
        done["tasks"] = len((yield rows("prune_tasks", task_ids=ids)))
        return
    done["payloads"] = len((yield rows("scrub_tasks", task_ids=ids)))
    yield rows("prune_streams", task_ids=ids)  # what the handler emitted: user data
    yield rows("scrub_effects", task_ids=ids)
    yield rows("scrub_signals", task_ids=ids)
    yield rows("scrub_approvals", task_ids=ids)
    yield rows("scrub_events", task_ids=ids, kept_keys=keys)


def evidence_record(s: Settings, task_id: int) -> Op[list[dict[str, Any]]]:
    """:meth:`leaseq.Queue.evidence_record`: the evidence record a pruned task left, in order."""
    task_id = checks.check_task_id(task_id)
    yield BEGIN_ONE
    found: list[dict[str, Any]] = yield rows("list_evidence", task_id=task_id)
    yield COMMIT
    return found
