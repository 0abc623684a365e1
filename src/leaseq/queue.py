"""The lease logic: every queue operation, as transactions of named queries.

This is the one module where leaseq's rules are applied. The SQL decides
(lease guards, routing of expired leases, failure routing); this module
validates input, runs the queries in the right transaction, writes the
evidence trail and turns "no row changed" into :class:`LeaseLost`.
Backends, the async facade, the CLI and the worker all come through here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import getpass
import json
import os
import secrets
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .core import policy
from .core.errors import (InvalidInput, InvalidTransition, LeaseLost, NotFound, QueuePaused,
                          UnknownWorker)
from .core.model import Claim, Effect, Event, Status, Task, Worker
from .store import Store, Tx, open_store
from .store.base import WorkListener
from .store.base import JsonText, KeyConflict, load_migrations
from .observability.tracing import traced_enqueue
from .worker.transport import Capabilities

if TYPE_CHECKING:  # pragma: no cover
    from .fencing.tokens import ActionSigner

_TASK_FIELDS = frozenset(Task.__dataclass_fields__)
_EFFECT_FIELDS = frozenset(Effect.__dataclass_fields__)
#: How many expired leases one claim transaction routes at most.
ROUTE_BATCH = 500
#: Rows per statement in :meth:`Queue.enqueue_many` (all in one transaction).
ENQUEUE_CHUNK = 5000
#: Settings of the evidence trail (see :class:`Queue`).
EVIDENCE_LEVELS = ("full", "compact")
#: Events whose detail the compact setting drops: the row itself says it all.
ROUTINE_EVENTS = frozenset({"claimed", "completed"})


_TASK_ORDER = tuple(Task.__dataclass_fields__)


def _task(row: dict[str, Any]) -> Task:
    try:  # a whole row (the common case, a claim's hot path): fill the frozen record directly
        values = {k: row[k] for k in _TASK_ORDER}
    except KeyError:  # a partial row: the dataclass supplies the defaults
        return Task(**{k: v for k, v in row.items() if k in _TASK_FIELDS})
    task = object.__new__(Task)
    task.__dict__.update(values)
    return task


def _check_kinds(kinds: Iterable[str] | None) -> list[str] | None:
    """The kinds a claim may take, checked and sorted; None for any kind."""
    if kinds is None:
        return None
    if isinstance(kinds, (str, bytes)) or not isinstance(kinds, Iterable):
        raise InvalidInput("kinds", f"must be a list of task kinds, or None for any kind (got {kinds!r})")
    checked = sorted({policy.check_kind(k, f"kinds[{i}]") for i, k in enumerate(kinds)})
    if not checked:
        raise InvalidInput("kinds", "must name at least one task kind (None claims any kind)")
    if len(checked) > 1000:
        raise InvalidInput("kinds", f"names {len(checked)} kinds; at most 1000")
    return checked


def _claim_settled(found: list[dict[str, Any]]) -> bool:
    """Whether a fast-path claim_batch answer is final: no expired lease awaits
    routing and the worker may claim (SQLite answers nothing when it claimed nothing)."""
    return bool(found) and not found[0]["routing_due"] and found[0]["worker_ok"]


#: Most actions one task may declare.
MAX_ACTIONS = 100


def _check_actions(actions: Iterable[str] | None, effect: str) -> str | None:
    """The declared actions as JSON text for the task row (None: undeclared), or InvalidInput.

    A read_only task takes no actions: it may declare none (an empty list
    says the same and is stored as such).
    """
    if actions is None:
        return None
    if isinstance(actions, (str, bytes)) or not isinstance(actions, Iterable):
        raise InvalidInput("actions", f"must be a list of action names, or None (got {actions!r})")
    names = list(dict.fromkeys(policy.check_kind(a, f"actions[{i}]") for i, a in enumerate(actions)))
    if len(names) > MAX_ACTIONS:
        raise InvalidInput("actions", f"names {len(names)} actions; at most {MAX_ACTIONS}")
    if names and effect == "read_only":
        raise InvalidInput("actions", "a read_only task may take no actions; declare the task "
                                      "effect='idempotent' or effect='side_effect'")
    return json.dumps(names)


def _action_refusal(held: dict[str, Any], action: str) -> str | None:
    """Why the task of a lease (``lock_lease``'s row) may not begin ``action``, or None if it may.

    Declared actions bind; a task that declared none may take any action
    unless it is read_only, which may take none.
    """
    declared = held["actions"]
    if held["effect"] == "read_only":
        return (f"task {held['id']} is read_only and may begin no action ({action!r} refused); "
                "enqueue it as effect='idempotent' or 'side_effect'")
    if declared is not None and action not in declared:
        listed = ", ".join(repr(a) for a in declared) or "none"
        return f"{action!r} is not an action task {held['id']} declared (declared: {listed})"
    return None


def _effect(row: dict[str, Any], *, replayed: bool = False) -> Effect:
    return Effect(**{k: v for k, v in row.items() if k in _EFFECT_FIELDS}, replayed=replayed)


def _fresh_keys(n: int) -> list[str]:
    """``n`` new idempotency keys, 32 hex digits each, unique and increasing.

    A microsecond clock, 56 random bits and a counter: keys made later sort
    later, so the unique (queue, key) index grows at its right edge instead of
    taking random inserts (fewer pages touched, less WAL, per enqueue).
    """
    stem = f"{time.time_ns() // 1000:013x}{secrets.token_hex(7)}"
    return [f"{stem}{i:05x}" for i in range(n)]


def _worker_id(worker: Worker | str) -> str:
    wid = worker.id if isinstance(worker, Worker) else worker
    if not isinstance(wid, str) or not wid:
        raise InvalidInput("worker", f"must be a Worker from register_worker() (got {worker!r})")
    return wid


def _heartbeats(row: dict[str, Any]) -> dict[str, Any]:
    """The compact heartbeat history of one lease, for the event that ends it."""
    last = row.get("last_heartbeat_at")
    return {
        "heartbeats": row.get("heartbeat_count", 0),
        "last_heartbeat_at": last.isoformat() if isinstance(last, datetime) else last,
        "longest_heartbeat_gap": round(float(row.get("longest_heartbeat_gap") or 0.0), 3),
    }


def _default_actor() -> str:
    try:
        return getpass.getuser()
    except Exception:  # pragma: no cover - no user database in some containers
        return "operator"


class Queue:
    """A leaseq queue on one database. Thread-safe; share one per process.

    Create it with :func:`leaseq.connect`. Worker-side calls (``claim``,
    ``heartbeat``, ``complete``, ``fail``, ``begin_effect``...) are guarded
    by the lease; operator calls (``cancel``, ``reconcile``...) are not.
    """

    def __init__(self, store: Store, *, max_same_error: int = policy.DEFAULT_MAX_SAME_ERROR,
                 signer: ActionSigner | None = None, action_token_ttl: float = 300.0, evidence: str = "full"):
        self.store = store
        if evidence not in EVIDENCE_LEVELS:
            raise InvalidInput("evidence", f"must be one of {', '.join(EVIDENCE_LEVELS)} (got {evidence!r})")
        #: "full": every event carries its detail; "compact": the routine
        #: claimed/completed events keep only task, type, generation, worker
        #: and time (every transition still gets its event; the "enqueued"
        #: entry is the task row itself at either setting)
        self.evidence = evidence
        self.max_same_error = policy.check_int("max_same_error", max_same_error, minimum=1)
        #: signs an action token for every effect (None: effects carry no token)
        self.signer = signer
        self.action_token_ttl = policy.check_seconds("action_token_ttl", action_token_ttl, allow_zero=False)
        #: what the worker runtime may rely on (see :class:`leaseq.worker.Capabilities`)
        self.capabilities = Capabilities(
            native_async=store.dialect == "postgres", batched_completion=True,
            listen_notify=store.dialect == "postgres", loss_reports=True, serial_writes=store.dialect == "sqlite")

    # -- set-up -----------------------------------------------------------

    @property
    def dialect(self) -> str:
        """``"postgres"`` or ``"sqlite"``."""
        return self.store.dialect

    @property
    def native_async(self) -> bool:
        """Whether :meth:`aclaim` and :meth:`acomplete_many` run on the event loop
        itself (PostgreSQL) rather than in a thread (SQLite)."""
        return self.capabilities.native_async

    async def close_async(self) -> None:
        """Close the connections the async operations opened for the running event loop."""
        await self.store.close_async()

    def migrate(self) -> list[int]:
        """Create or upgrade the schema. Idempotent; returns the versions applied now."""
        applied_now = []
        with self.store.transaction() as tx:
            tx.rows("migrations_lock")
            tx.rows("migrations_create")
            done = {r["version"] for r in tx.rows("migrations_applied")}
            for mig in load_migrations(self.dialect):
                if mig.version not in done:
                    tx.script(mig.sql)
                    tx.rows("migrations_record", version=mig.version, name=mig.name)
                    applied_now.append(mig.version)
        return applied_now

    def schema_version(self) -> int:
        """The newest migration applied (0 for an empty database)."""
        with self.store.transaction() as tx:
            if not tx.row("migrations_table_exists")["present"]:
                return 0  # a read: never create anything in a database that is not ours
            versions = [r["version"] for r in tx.rows("migrations_applied")]
        return max(versions, default=0)

    def close(self) -> None:
        """Close every connection."""
        self.store.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- workers ----------------------------------------------------------

    def register_worker(self, name: str = "worker", *, token_id: str | None = None) -> Worker:
        """Issue a new worker identity. The queue picks the id; ``name`` is a label.

        ``token_id`` links the worker to the service credential that registered
        it, so revoking that credential revokes the worker too.
        """
        policy.check_name("name", name)
        with self.store.transaction() as tx:
            row = tx.row("register_worker", name=name)
            if token_id is not None:
                tx.rows("link_worker_token", worker_id=row["id"], token_id=policy.check_name("token_id", token_id))
        return Worker(id=row["id"], name=row["name"], registered_at=row["registered_at"])

    def revoke_worker(self, worker: Worker | str, *, by: str | None = None,
                      via: str | None = None) -> dict[str, Any]:
        """Revoke a worker: it claims nothing more, and the leases it holds end
        now: every guarded write it sends afterwards is refused, and its tasks
        are routed by the recovery policy at the next claim. Audited (``by``)
        in the same transaction. Returns ``{"worker_id": id, "revoked": True}``."""
        wid = _worker_id(worker)
        by, via = self._actor(by, via)
        with self.store.transaction() as tx:
            if tx.row("revoke_worker", worker_id=wid) is None:
                if tx.row("get_worker", worker_id=wid) is None:
                    raise UnknownWorker(f"worker {wid!r} was never registered")
                self._audit(tx, by, via, "revoke_worker", f"worker:{wid}", already_revoked=True)
                return {"worker_id": wid, "revoked": True}  # revoked before: its leases ended then
            ended = self.end_worker_leases(tx, wid, "worker revoked")
            self._audit(tx, by, via, "revoke_worker", f"worker:{wid}", ended_leases=ended)
        return {"worker_id": wid, "revoked": True}

    def end_worker_leases(self, tx: Tx, wid: str, reason: str) -> int:
        """End every lease of a just-revoked worker, with a ``lease_revoked`` event each (in ``tx``).
        Returns how many leases ended."""
        ended = tx.rows("end_worker_leases", worker_id=wid)
        if ended:
            tx.rows("insert_events", events=[self._event_params(r["id"], "lease_revoked", r["claim_generation"], wid,
                                                                reason=reason) for r in ended])
        return len(ended)

    def workers(self) -> list[dict[str, Any]]:
        """Every registered worker with the number of leases it holds."""
        with self.store.transaction() as tx:
            return tx.rows("list_workers")

    def _check_worker(self, tx: Tx, wid: str, *, lock: bool = False) -> None:
        row = tx.row("lock_worker" if lock else "get_worker", worker_id=wid)
        if row is None:
            raise UnknownWorker(f"worker {wid!r} was never registered with this queue")
        if row["revoked_at"] is not None:
            raise UnknownWorker(f"worker {wid!r} was revoked")

    # -- enqueue ----------------------------------------------------------

    @traced_enqueue
    def enqueue(self, kind: str, payload: Any = None, *, effect: str = "read_only", queue: str = "default",
                idempotency_key: str | None = None, priority: int = 0, delay: float = 0,
                max_attempts: int = 5, lease_seconds: float = policy.DEFAULT_LEASE_SECONDS,
                actions: Iterable[str] | None = None) -> Task:
        """Add a task. A second enqueue with the same ``idempotency_key`` in the
        same queue returns the existing task instead of a duplicate.

        ``actions`` lists the actions the task may begin (:meth:`begin_effect`
        refuses any other); None leaves them undeclared: any action for an
        idempotent or side_effect task, none for a read_only one."""
        effect = policy.check_effect(effect)
        params = dict(
            kind=policy.check_kind(kind),
            payload=policy.check_json("payload", payload),
            effect=effect,
            actions=_check_actions(actions, effect),
            queue=policy.check_name("queue", queue),
            idempotency_key=(_fresh_keys(1)[0] if idempotency_key is None
                             else policy.check_key("idempotency_key", idempotency_key)),
            priority=policy.check_int("priority", priority, minimum=-(2**31), maximum=2**31 - 1),
            delay=policy.check_seconds("delay", delay, allow_zero=True, maximum=10 * 365 * 86400.0),
            max_attempts=policy.check_int("max_attempts", max_attempts, minimum=1, maximum=10_000),
            lease_seconds=policy.check_seconds("lease_seconds", lease_seconds, allow_zero=False),
        )
        with self.store.transaction(one_statement=True) as tx:
            row = tx.row("insert_task", **params)  # the row is the enqueue's evidence (list_events)
            if row is not None and not row["notified"]:
                tx.rows("notify_work", queue=row["queue"])
        if row is None:  # the key was taken: the same logical task
            with self.store.transaction() as tx:
                return _task(tx.row("get_task_by_key", queue=params["queue"],
                                    idempotency_key=params["idempotency_key"]))
        return _task(row)

    def enqueue_many(self, kind: str, payloads: Iterable[Any], *, effect: str = "read_only",
                     queue: str = "default", idempotency_keys: Sequence[str | None] | None = None,
                     priority: int = 0, delay: float = 0, max_attempts: int = 5,
                     lease_seconds: float = policy.DEFAULT_LEASE_SECONDS,
                     actions: Iterable[str] | None = None) -> list[int]:
        """Add many tasks of one ``kind`` at once; returns their ids, in order.

        The options are those of :meth:`enqueue`, shared by every task.
        ``idempotency_keys`` (one per payload, None for a fresh key) dedupe as
        in :meth:`enqueue`: a key already present gives the existing task's id.
        Rows are written by multi-row statements in one transaction, so
        either every task is added or none is.
        """
        payloads = list(payloads)
        if idempotency_keys is not None:
            idempotency_keys = list(idempotency_keys)
            if len(idempotency_keys) != len(payloads):
                raise InvalidInput("idempotency_keys", f"needs one key per payload ({len(payloads)}), "
                                                       f"got {len(idempotency_keys)}")
        effect = policy.check_effect(effect)
        common = dict(
            kind=policy.check_kind(kind),
            effect=effect,
            actions=_check_actions(actions, effect),
            queue=policy.check_name("queue", queue),
            priority=policy.check_int("priority", priority, minimum=-(2**31), maximum=2**31 - 1),
            delay=policy.check_seconds("delay", delay, allow_zero=True, maximum=10 * 365 * 86400.0),
            max_attempts=policy.check_int("max_attempts", max_attempts, minimum=1, maximum=10_000),
            lease_seconds=policy.check_seconds("lease_seconds", lease_seconds, allow_zero=False),
        )
        given = [None] * len(payloads) if idempotency_keys is None else [
            None if key is None else policy.check_key(f"idempotency_keys[{i}]", key)
            for i, key in enumerate(idempotency_keys)]
        # Each payload is encoded once, while it is checked; the documents sent are built from those texts.
        encoded = [policy.encode_json(f"payloads[{i}]", payload) for i, payload in enumerate(payloads)]
        if any(key is not None for key in given):
            fresh = _fresh_keys(len(payloads))
            return self._insert_tasks([fresh[i] if key is None else key for i, key in enumerate(given)], encoded,
                                      common, generated=False)
        for _ in range(3):
            try:  # every key is generated here: no ON CONFLICT needed
                return self._insert_tasks(_fresh_keys(len(payloads)), encoded, common, generated=True)
            except KeyConflict:  # a generated key met a stored one (never seen); nothing was written
                continue
        raise KeyConflict("generated idempotency keys met stored ones three times")

    def _insert_tasks(self, keys: list[str], encoded: list[str], common: dict[str, Any], *,
                      generated: bool) -> list[int]:
        """Write the tasks in chunks; ``generated``: every key was made by :func:`_fresh_keys`."""
        query = "insert_fresh_tasks" if generated else "insert_tasks"
        quote = '"{}"'.format if generated else json.dumps  # generated keys are plain hex
        entries = [f'{{"payload":{text},"idempotency_key":{quote(key)}}}' for text, key in zip(encoded, keys)]
        ids: dict[str, int] = {}
        with self.store.transaction() as tx:
            for start in range(0, len(keys), ENQUEUE_CHUNK):
                added = tx.rows(query, tasks=JsonText("[" + ",".join(entries[start:start + ENQUEUE_CHUNK]) + "]"),
                                **common)
                ids.update((r["idempotency_key"], r["id"]) for r in added)
                missing = list(set(keys[start:start + ENQUEUE_CHUNK]) - ids.keys())
                if missing:  # keys that were already taken: the existing tasks
                    ids.update((r["idempotency_key"], r["id"])
                               for r in tx.rows("task_ids_by_key", queue=common["queue"], keys=missing))
            if keys:
                tx.rows("notify_work", queue=common["queue"])
        return [ids[k] for k in keys]

    # -- claims and leases --------------------------------------------------

    def claim(self, worker: Worker | str, *, queue: str = "default", limit: int = 1,
              lease_seconds: float | None = None, kinds: Iterable[str] | None = None) -> list[Claim]:
        """Lease up to ``limit`` due tasks of ``queue`` to ``worker``.

        Expired leases are routed by the recovery policy first, in the same
        transaction. Each claim carries a new generation (fencing token).
        ``kinds`` limits the claim to tasks of those kinds (the worker runtime
        passes the kinds it has handlers for); None claims any kind.
        Returns an empty list when nothing is due or the queue is paused.
        """
        wid, params = self._claim_params(worker, queue, limit, lease_seconds, kinds)
        # Fast path: one statement, which claims nothing while an expired
        # lease awaits routing. PostgreSQL always answers with its flags;
        # SQLite answers nothing when nothing was claimed.
        with self.store.transaction(one_statement=True) as tx:
            found = tx.rows("claim_batch", route_first=True, **params)
            rows = self._record_claims(tx, wid, lease_seconds, found)
        if not rows and not _claim_settled(found):
            return self._claim_after_routing(wid, lease_seconds, params)
        return self._claims(wid, lease_seconds, rows)

    async def aclaim(self, worker: Worker | str, *, queue: str = "default", limit: int = 1,
                     lease_seconds: float | None = None, kinds: Iterable[str] | None = None) -> list[Claim]:
        """:meth:`claim` for asyncio code: the same statement, awaited on the
        event loop where the backend can (PostgreSQL), else run in a thread."""
        if self.store.run_async is None:
            return await asyncio.to_thread(self.claim, worker, queue=queue, limit=limit,
                                           lease_seconds=lease_seconds, kinds=kinds)
        wid, params = self._claim_params(worker, queue, limit, lease_seconds, kinds)
        found = await self.store.run_async("claim_batch", route_first=True, **params)
        rows = [r for r in found if r["id"] is not None]  # this statement writes its own events
        if not rows and not _claim_settled(found):
            return await asyncio.to_thread(self._claim_after_routing, wid, lease_seconds, params)
        return self._claims(wid, lease_seconds, rows)

    def _claim_params(self, worker: Worker | str, queue: str, limit: int, lease_seconds: float | None,
                      kinds: Iterable[str] | None) -> tuple[str, dict[str, Any]]:
        wid = _worker_id(worker)
        policy.check_name("queue", queue)
        policy.check_int("limit", limit, minimum=1, maximum=10_000)
        if lease_seconds is not None:
            policy.check_seconds("lease_seconds", lease_seconds, allow_zero=False)
        return wid, dict(queue=queue, worker_id=wid, limit=limit, lease_seconds=lease_seconds,
                         compact=self.evidence == "compact", kinds=_check_kinds(kinds))

    def _claim_after_routing(self, wid: str, lease_seconds: float | None, params: dict[str, Any]) -> list[Claim]:
        """The slow path of a claim: route expired leases, then claim, in one transaction."""
        with self.store.transaction() as tx:
            # the worker row first, as revoke_worker locks it: never a lock cycle with a revocation
            self._check_worker(tx, wid, lock=True)
            self._route_expired(tx)
            rows = self._record_claims(tx, wid, lease_seconds, tx.rows("claim_batch", route_first=False, **params))
            if not rows:
                return []
        return self._claims(wid, lease_seconds, rows)

    @staticmethod
    def _claims(wid: str, lease_seconds: float | None, rows: list[dict[str, Any]]) -> list[Claim]:
        rows.sort(key=lambda r: (-r["priority"], r["available_at"], r["id"]))
        return [Claim(task_id=r["id"], generation=r["claim_generation"], worker_id=wid,
                      expires_at=r["lease_expires_at"], task=_task(r),
                      lease_seconds=r["lease_seconds"] if lease_seconds is None else float(lease_seconds))
                for r in rows]

    def _record_claims(self, tx: Tx, wid: str, lease_seconds: float | None,
                       found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The claimed rows of a claim_batch answer, their events written if the statement did not."""
        rows = [r for r in found if r["id"] is not None]
        if rows and not rows[0]["evidence_written"]:
            tx.rows("insert_events", events=[
                self._event_params(r["id"], "claimed", r["claim_generation"], wid, attempt=r["attempts"],
                                   lease_seconds=r["lease_seconds"] if lease_seconds is None else lease_seconds,
                                   lease_expires_at=r["lease_expires_at"].isoformat())
                for r in rows])
        return rows

    def heartbeat(self, worker: Worker | str, claim: Claim) -> datetime:
        """Renew one lease; returns the new deadline or raises :class:`LeaseLost`."""
        renewed = self.renew_leases(worker, [claim])
        if claim.task_id not in renewed:
            raise LeaseLost(claim.task_id, claim.generation, "heartbeat refused: lease no longer held")
        return renewed[claim.task_id]

    def renew_leases(self, worker: Worker | str, claims: list[Claim]) -> dict[int, datetime]:
        """Renew many leases in one guarded statement.

        Returns ``{task_id: new_deadline}`` for the leases still held; a claim
        missing from the result has been lost.
        """
        wid = _worker_id(worker)
        for c in claims:
            self._check_claim(wid, c)
        if not claims:
            return {}
        with self.store.transaction(one_statement=True) as tx:
            rows = tx.rows("renew_leases", worker_id=wid, task_ids=[c.task_id for c in claims],
                           generations=[c.generation for c in claims])
        return {r["id"]: r["lease_expires_at"] for r in rows}

    def complete(self, worker: Worker | str, claim: Claim, result: Any = None) -> None:
        """Finish the task with ``result``; raises :class:`LeaseLost` without authority."""
        wid = _worker_id(worker)
        self._check_claim(wid, claim)
        policy.check_json("result", result)
        with self.store.transaction() as tx:
            row = tx.row("complete_task", task_id=claim.task_id, worker_id=wid, generation=claim.generation,
                         result=result)
            if row is None:
                raise LeaseLost(claim.task_id, claim.generation, "complete refused: lease no longer held")
            self._event(tx, claim.task_id, "completed", claim.generation, wid, attempt=row["attempts"],
                        **_heartbeats(row))

    def complete_many(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> set[int]:
        """Finish many tasks of one worker in one guarded statement.

        ``done`` holds ``(claim, result)`` pairs. Returns the ids of the tasks
        completed; a task missing from the answer had lost its lease and was
        left untouched, exactly as :meth:`complete` would have refused it.
        """
        wid, items = self._completions(worker, done)
        if not items:
            return set()
        with self.store.transaction(one_statement=True) as tx:
            rows = tx.rows("complete_batch", worker_id=wid, items=items, compact=self.evidence == "compact")
            if rows and not rows[0]["evidence_written"]:
                tx.rows("insert_events", events=[
                    self._event_params(r["id"], "completed", r["claim_generation"], wid, attempt=r["attempts"],
                                       **_heartbeats(r)) for r in rows])
        return {r["id"] for r in rows}

    async def acomplete_many(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> set[int]:
        """:meth:`complete_many` for asyncio code (awaited on the loop where the backend can)."""
        if self.store.run_async is None:
            return await asyncio.to_thread(self.complete_many, worker, done)
        wid, items = self._completions(worker, done)
        if not items:
            return set()
        # PostgreSQL's complete_batch writes its own events
        rows = await self.store.run_async("complete_batch", worker_id=wid, items=items,
                                          compact=self.evidence == "compact")
        return {r["id"] for r in rows}

    def _completions(self, worker: Worker | str, done: Sequence[tuple[Claim, Any]]) -> tuple[str, list[dict]]:
        wid = _worker_id(worker)
        items, seen = [], set()
        for claim, result in done:
            self._check_claim(wid, claim)
            if claim.task_id in seen:
                raise InvalidInput("done", f"names task {claim.task_id} twice")
            seen.add(claim.task_id)
            items.append({"task_id": claim.task_id, "generation": claim.generation,
                          "result": policy.check_json("result", result)})
        return wid, items

    def fail(self, worker: Worker | str, claim: Claim, error: str, *, retry: bool = True,
             block: bool = False, delay: float | None = None) -> Task:
        """End the attempt with ``error``.

        The task is retried after an exponential, jittered backoff (or
        ``delay`` seconds), unless ``retry`` is false, attempts are exhausted or
        the same error repeats ``max_same_error`` times in a row, which send it
        to ``dead``. ``block=True`` marks a missing or revoked credential: the
        task waits in ``blocked`` for :meth:`unblock`. A side-effect task with
        an intent still open goes to ``needs_reconciliation`` instead.
        """
        wid = _worker_id(worker)
        self._check_claim(wid, claim)
        policy.check_text("error", error, required=True)
        if not isinstance(retry, bool) or not isinstance(block, bool):
            raise InvalidInput("retry" if not isinstance(retry, bool) else "block", "must be true or false")
        wait = (policy.backoff_seconds(claim.task.attempts) if delay is None
                else policy.check_seconds("delay", delay, allow_zero=True, maximum=10 * 365 * 86400.0))
        with self.store.transaction() as tx:
            row = tx.row("fail_task", task_id=claim.task_id, worker_id=wid, generation=claim.generation,
                         error=error, fingerprint=policy.error_fingerprint(error), retry=retry, block=block,
                         delay=wait, max_same_error=self.max_same_error)
            if row is None:
                raise LeaseLost(claim.task_id, claim.generation, "fail refused: lease no longer held")
            detail: dict[str, Any] = dict(error=error, attempt=row["attempts"], next_status=row["status"],
                                          error_streak=row["error_streak"], **_heartbeats(row))
            if row["status"] == Status.QUEUED:
                detail["retry_at"] = row["available_at"].isoformat()
            self._event(tx, claim.task_id, "failed", claim.generation, wid, **detail)
            if row["status"] != Status.QUEUED:
                self._event(tx, claim.task_id, row["status"], claim.generation, wid, reason=self._why(row, retry, block))
            task = tx.row("get_task", task_id=claim.task_id)
        return _task(task)

    def _why(self, row: dict[str, Any], retry: bool, block: bool) -> str:
        status = row["status"]
        if status == Status.BLOCKED:
            return "credential missing or revoked"
        if status == Status.NEEDS_RECONCILIATION:
            return "failed with a side-effect intent and no recorded response"
        if not retry:
            return "failure marked permanent"
        if row["attempts"] >= row["max_attempts"]:
            return f"attempts exhausted ({row['attempts']}/{row['max_attempts']})"
        return f"same error {row['error_streak']} times in a row"

    def release(self, worker: Worker | str, claim: Claim, reason: str = "released") -> Task:
        """Give a lease back early (worker shutdown).

        The task goes through the recovery policy exactly as if its lease had
        expired: a side-effect task with an open intent is not simply requeued.
        """
        wid = _worker_id(worker)
        self._check_claim(wid, claim)
        policy.check_text("reason", reason, required=True)
        with self.store.transaction() as tx:
            row = tx.row("expire_lease", task_id=claim.task_id, worker_id=wid, generation=claim.generation)
            if row is None:
                raise LeaseLost(claim.task_id, claim.generation, "release refused: lease no longer held")
            self._route(tx, [row], event="lease_released", reason=reason)
            task = tx.row("get_task", task_id=claim.task_id)
        return _task(task)

    def report_loss(self, worker: Worker | str, claim: Claim, reason: str) -> None:
        """Add the worker's own account of losing a lease to the evidence trail.

        Evidence only: the task itself is not touched (the guards already
        refused whatever the worker tried). ``reason`` says how the worker
        found out (heartbeat refused, deadline passed unrenewed, shutdown...).
        One report per generation the worker held; none for a generation it
        ended itself (completed, failed or released): the ``report_loss``
        query enforces both.
        """
        wid = _worker_id(worker)
        self._check_claim(wid, claim)
        policy.check_text("reason", reason, required=True)
        with self.store.transaction() as tx:
            self._require_task(tx, claim.task_id, lock=True)
            params = self._event_params(claim.task_id, "lease_lost", claim.generation, wid, reason=reason)
            if tx.row("report_loss", task_id=claim.task_id, generation=claim.generation, worker_id=wid,
                      detail=params["detail"]) is not None:
                return
            why = tx.row("generation_outcome", task_id=claim.task_id, generation=claim.generation, worker_id=wid)
        if not why["held"]:
            raise InvalidInput("claim", f"worker {wid!r} never held generation {claim.generation} "
                                        f"of task {claim.task_id}")
        if why["ended"] == "lease_lost":
            raise InvalidTransition(f"task {claim.task_id} generation {claim.generation}: "
                                    "its loss was already reported")
        raise InvalidTransition(f"task {claim.task_id} generation {claim.generation}: not lost, it ended "
                                f"by its holder ({why['ended']})")

    def listener(self, queues: list[str]) -> WorkListener:
        """A blocking waiter woken when work is enqueued on ``queues``
        (PostgreSQL LISTEN/NOTIFY; on SQLite it only sleeps, so workers poll)."""
        for name in queues:
            policy.check_name("queue", name)
        return self.store.listener(set(queues))

    def sweep(self) -> int:
        """Route every expired lease now (claims do this too). Returns how many."""
        total = 0
        while True:
            with self.store.transaction() as tx:
                n = self._route_expired(tx)
            total += n
            if n < ROUTE_BATCH:
                return total

    def _route_expired(self, tx: Tx) -> int:
        expired = tx.rows("lock_expired", limit=ROUTE_BATCH)
        if expired:
            self._route(tx, expired, event="lease_expired", reason="lease expired without renewal")
        return len(expired)

    def _route(self, tx: Tx, leases: list[dict[str, Any]], *, event: str, reason: str) -> None:
        """Apply the recovery policy (the ``route_expired`` query) to locked, expired leases."""
        routed = {r["id"]: r for r in tx.rows("route_expired", task_ids=[r["id"] for r in leases])}
        events = []
        for lease in leases:
            r = routed.get(lease["id"])
            if r is None:
                continue
            events.append(self._event_params(
                lease["id"], event, lease["claim_generation"], lease["lease_owner"], reason=reason,
                routed_to=r["status"], open_intents=r["open_effects"], attempt=r["attempts"],
                lease_expires_at=lease["lease_expires_at"].isoformat(), **_heartbeats(lease)))
            if r["status"] != Status.QUEUED:
                why = ("side-effect intent without a response: a retry could repeat it"
                       if r["status"] == Status.NEEDS_RECONCILIATION else "attempts exhausted")
                events.append(self._event_params(lease["id"], r["status"], lease["claim_generation"],
                                                 lease["lease_owner"], reason=why))
        if events:
            tx.rows("insert_events", events=events)

    # -- effects ------------------------------------------------------------

    def begin_effect(self, worker: Worker | str, claim: Claim, action: str, key: str | None = None, *,
                     resource: str | None = None) -> Effect:
        """Record the intent of a tool call before making it, under the lease guard.

        ``key`` (the action's idempotency key) defaults to one derived from the
        task's idempotency key and ``action``, so it is the same on every
        attempt. If an earlier attempt already recorded a response under that
        key, that effect is returned with ``replayed=True``: do not call again.
        Raises :class:`QueuePaused` while the queue's off-switch is on, and
        :class:`InvalidInput` (field ``action``) for an action the task may
        not take: one it did not declare (``actions=``), or any action of a
        read_only task.

        With a signing key the effect carries ``token``, naming the task, the
        generation, the action, the key and ``resource`` when given; it
        expires at the lease deadline (or after ``action_token_ttl``, if
        sooner). Calling again for the same pending effect returns it with a
        token re-issued from the current deadline (the worker does so after
        each renewal); nothing is written then.
        """
        wid = _worker_id(worker)
        self._check_claim(wid, claim)
        policy.check_kind(action, "action")
        if key is not None:
            policy.check_key("key", key)
        if resource is not None:
            policy.check_key("resource", resource)
        with self.store.transaction() as tx:
            held = tx.row("lock_lease", task_id=claim.task_id, worker_id=wid, generation=claim.generation)
            if held is None:
                raise LeaseLost(claim.task_id, claim.generation, "begin_effect refused: lease no longer held")
            refusal = _action_refusal(held, action)
            if refusal is not None:
                raise InvalidInput("action", refusal)
            deadline = held["lease_expires_at"]
            fx_key = key if key is not None else f"{held['idempotency_key']}:{action}"
            existing = tx.row("get_effect", task_id=claim.task_id, idempotency_key=fx_key)
            if existing is not None and existing["status"] == "done":
                return self._signed(_effect(existing, replayed=True), deadline, resource)
            if existing is not None and existing["generation"] == claim.generation and existing["status"] == "pending":
                return self._signed(_effect(existing), deadline, resource)
            if held["paused"]:
                raise QueuePaused(f"queue {held['queue']!r} is paused: no new actions may start")
            if existing is None:
                row = tx.row("insert_effect", task_id=claim.task_id, generation=claim.generation, worker_id=wid,
                             action=action, idempotency_key=fx_key)
            else:
                # Same key, earlier attempt, no response: an idempotent task
                # reclaimed with its intent open, or one an operator requeued
                # after reconciliation. The new attempt takes the intent over;
                # the key stays, so the downstream service can deduplicate.
                row = tx.row("rebind_effect", effect_id=existing["id"], generation=claim.generation, worker_id=wid)
            if existing is None or existing["status"] != "pending":
                tx.rows("adjust_open_effects", task_id=claim.task_id, delta=1)
            detail = dict(action=action, idempotency_key=fx_key, effect_id=row["id"])
            if existing is not None:
                detail["previous_generation"] = existing["generation"]
            self._event(tx, claim.task_id, "effect_intent", claim.generation, wid, **detail)
        return self._signed(_effect(row), deadline, resource)

    def _signed(self, effect: Effect, deadline: datetime, resource: str | None) -> Effect:
        """The effect with a signed action token scoped to it, when the queue has a key.

        The token expires at the lease deadline it was issued under (the
        database's clock), or after ``action_token_ttl`` if that is sooner:
        a worker that outlives its lease holds an expired token.
        """
        if self.signer is None:
            return effect
        token = self.signer.issue(effect.task_id, effect.generation, effect.action, effect.idempotency_key,
                                  self.action_token_ttl, resource=resource, not_after=deadline.timestamp())
        return dataclasses.replace(effect, token=token)

    @contextlib.contextmanager
    def hold_attempt(self, task_id: int, generation: int) -> Iterator[None]:
        """Hold attempt ``generation`` of ``task_id`` to its live lease while the block runs.

        For a downstream fence on another database
        (:class:`leaseq.fencing.QueueLeaseCheck`): raises :class:`LeaseLost` if
        the attempt is not the running one with a live lease; otherwise keeps
        a transaction open (the row ``FOR SHARE`` on PostgreSQL, the write
        lock on SQLite) so no claim, cancel or expiry routing can take the
        task until the block ends. Keep the block short.
        """
        task_id = policy.check_task_id(task_id)
        generation = policy.check_int("generation", generation, minimum=0)
        with self.store.transaction() as tx:
            if tx.row("attempt_holds_lease", task_id=task_id, generation=generation) is None:
                raise LeaseLost(task_id, generation, "the attempt no longer holds its lease")
            yield

    def finish_effect(self, worker: Worker | str, claim: Claim, effect: Effect, response: Any = None) -> Effect:
        """Record the response of a tool call whose intent :meth:`begin_effect` recorded."""
        wid = _worker_id(worker)
        self._check_claim(wid, claim)
        if not isinstance(effect, Effect):
            raise InvalidInput("effect", "must be the Effect returned by begin_effect()")
        if effect.task_id != claim.task_id:
            raise InvalidInput("effect", f"belongs to task {effect.task_id}, not task {claim.task_id}")
        if effect.replayed:
            return effect
        policy.check_json("response", response)
        with self.store.transaction() as tx:
            if tx.row("lock_lease", task_id=claim.task_id, worker_id=wid, generation=claim.generation) is None:
                raise LeaseLost(claim.task_id, claim.generation, "finish_effect refused: lease no longer held")
            row = tx.row("finish_effect", effect_id=effect.id, task_id=claim.task_id, generation=claim.generation,
                         response=response)
            if row is None:
                raise InvalidTransition(f"effect {effect.id} is not open under generation {claim.generation}")
            tx.rows("adjust_open_effects", task_id=claim.task_id, delta=-1)
            self._event(tx, claim.task_id, "effect_response", claim.generation, wid, action=row["action"],
                        idempotency_key=row["idempotency_key"], effect_id=row["id"])
        return _effect(row)

    def effects(self, task_id: int) -> list[Effect]:
        """The action ledger of a task, oldest first."""
        task_id = policy.check_task_id(task_id)
        with self.store.transaction() as tx:
            self._require_task(tx, task_id)
            return [_effect(r) for r in tx.rows("list_effects", task_id=task_id)]

    # -- operator actions ----------------------------------------------------

    # Each operator action takes ``by`` (who acts: recorded in the evidence
    # trail and the audit log) and ``via`` (how: "api", "dashboard", "cli"),
    # and writes its audit entry in its own transaction: if the entry cannot
    # be written, the action does not happen either.

    def cancel(self, task_id: int, reason: str = "cancelled", *, by: str | None = None,
               via: str | None = None) -> Task:
        """Cancel a task. It stays cancelled; a running holder loses its lease at
        its next guarded call, and expiry never revives it."""
        task_id = policy.check_task_id(task_id)
        policy.check_text("reason", reason, required=True)
        by, via = self._actor(by, via)
        with self.store.transaction() as tx:
            before = self._require_task(tx, task_id, lock=True)
            if tx.row("cancel_task", task_id=task_id, reason=f"cancelled: {reason}") is None:
                raise InvalidTransition(f"task {task_id} is {before['status']}; only unfinished tasks can be cancelled")
            detail: dict[str, Any] = dict(by=by, reason=reason, previous_status=before["status"])
            if before["status"] == Status.RUNNING:
                detail["revoked_lease_of"] = before["lease_owner"]
                detail["open_intents"] = before["open_effects"]
            self._event(tx, task_id, "cancelled", before["claim_generation"] or None, None, **detail)
            self._audit(tx, by, via, "cancel", f"task:{task_id}", reason=reason, previous_status=before["status"])
            return _task(tx.row("get_task", task_id=task_id))

    def reconcile(self, task_id: int, outcome: str, note: str, *, result: Any = None, by: str | None = None,
                  via: str | None = None) -> Task:
        """Resolve a ``needs_reconciliation`` task after checking the outside world.

        ``outcome``: ``completed`` (the action did happen; ``result`` is stored),
        ``requeue`` (it did not; run again with the same keys) or ``cancel``.
        Open intents are marked ``reconciled``.
        """
        task_id = policy.check_task_id(task_id)
        targets = {"completed": Status.COMPLETED, "requeue": Status.QUEUED, "cancel": Status.CANCELLED}
        if not isinstance(outcome, str) or outcome not in targets:
            raise InvalidInput("outcome", f"must be one of completed, requeue, cancel (got {outcome!r})")
        policy.check_text("note", note, required=True)
        policy.check_json("result", result)
        by, via = self._actor(by, via)
        with self.store.transaction() as tx:
            before = self._require_task(tx, task_id, lock=True)
            row = tx.row("set_task_status", task_id=task_id, from_status=Status.NEEDS_RECONCILIATION.value,
                         status=targets[outcome].value, set_result=outcome == "completed", result=result,
                         reset_attempts=False)
            if row is None:
                raise InvalidTransition(f"task {task_id} is {before['status']}, not needs_reconciliation")
            settled = tx.rows("settle_open_effects", task_id=task_id)
            self._event(tx, task_id, "reconciled", before["claim_generation"] or None, None, by=by, outcome=outcome,
                        note=note, settled_intents=[s["idempotency_key"] for s in settled])
            self._audit(tx, by, via, "reconcile", f"task:{task_id}", outcome=outcome, note=note)
            return _task(tx.row("get_task", task_id=task_id))

    def unblock(self, task_id: int, note: str, *, by: str | None = None, via: str | None = None) -> Task:
        """Return a ``blocked`` task to the queue once its credential is repaired."""
        return self._resume(task_id, Status.BLOCKED, "unblocked", "unblock", note, by, via, reset_attempts=False)

    def requeue(self, task_id: int, note: str = "requeued by operator", *, by: str | None = None,
                via: str | None = None) -> Task:
        """Return a ``dead`` task to the queue with a fresh attempt budget."""
        return self._resume(task_id, Status.DEAD, "requeued", "requeue", note, by, via, reset_attempts=True)

    def _resume(self, task_id: int, from_status: Status, event: str, action: str, note: str, by: str | None,
                via: str | None, *, reset_attempts: bool) -> Task:
        task_id = policy.check_task_id(task_id)
        policy.check_text("note", note, required=True)
        by, via = self._actor(by, via)
        with self.store.transaction() as tx:
            before = self._require_task(tx, task_id, lock=True)
            row = tx.row("set_task_status", task_id=task_id, from_status=from_status.value,
                         status=Status.QUEUED.value, set_result=False, result=None, reset_attempts=reset_attempts)
            if row is None:
                raise InvalidTransition(f"task {task_id} is {before['status']}, not {from_status.value}")
            self._event(tx, task_id, event, before["claim_generation"] or None, None, by=by, note=note,
                        previous_attempts=before["attempts"])
            self._audit(tx, by, via, action, f"task:{task_id}", note=note)
            tx.rows("notify_work", queue=before["queue"])
            return _task(tx.row("get_task", task_id=task_id))

    def pause(self, queue: str, *, by: str | None = None, via: str | None = None) -> dict[str, Any]:
        """Turn the off-switch on: no claims, and no new effects in running tasks.
        Returns ``{"queue": name, "paused": True}``."""
        return self._set_paused(queue, True, by, via)

    def resume(self, queue: str, *, by: str | None = None, via: str | None = None) -> dict[str, Any]:
        """Turn the off-switch off. Returns ``{"queue": name, "paused": False}``."""
        return self._set_paused(queue, False, by, via)

    def _set_paused(self, queue: str, paused: bool, by: str | None, via: str | None) -> dict[str, Any]:
        policy.check_name("queue", queue)
        by, via = self._actor(by, via)
        with self.store.transaction() as tx:
            tx.row("set_paused", queue=queue, paused=paused, actor=by)
            self._audit(tx, by, via, "pause" if paused else "resume", f"queue:{queue}")
        return {"queue": queue, "paused": paused}

    def queues(self) -> list[dict[str, Any]]:
        """Queues that have had their off-switch set, with its state."""
        with self.store.transaction() as tx:
            return tx.rows("list_queues")

    # -- reads ----------------------------------------------------------------

    def get(self, task_id: int) -> Task:
        """One task; raises :class:`NotFound`."""
        task_id = policy.check_task_id(task_id)
        with self.store.transaction() as tx:
            return _task(self._require_task(tx, task_id))

    def list(self, *, status: str | None = None, queue: str | None = None, limit: int = 100) -> list[Task]:
        """Tasks, newest first, optionally filtered by status and queue."""
        if status is not None:
            policy.check_status(status)
        if queue is not None:
            policy.check_name("queue", queue)
        policy.check_int("limit", limit, minimum=1, maximum=100_000)
        with self.store.transaction() as tx:
            return [_task(r) for r in tx.rows("list_tasks", status=status, queue=queue, limit=limit)]

    def events(self, task_id: int) -> list[Event]:
        """The evidence trail of a task, in order."""
        task_id = policy.check_task_id(task_id)
        with self.store.transaction() as tx:
            self._require_task(tx, task_id)
            return [Event(**r) for r in tx.rows("list_events", task_id=task_id)]

    def stats(self) -> list[dict[str, Any]]:
        """Counts by queue and status, with the oldest due task's age and unrouted expired leases."""
        with self.store.transaction() as tx:
            return tx.rows("stats")

    def now(self) -> datetime:
        """The database's clock, the only clock leases are judged by."""
        with self.store.transaction() as tx:
            return tx.row("db_now")["now"]

    def prune(self, older_than_seconds: float, *, payloads_older_than_seconds: float | None = None,
              batch: int = 1000, by: str | None = None, via: str | None = None,
              record_empty: bool = True) -> dict[str, int]:
        """Retention: delete finished tasks, with their evidence, older than the cut-off.

        Completed and cancelled tasks untouched for ``older_than_seconds`` are
        deleted with their events and effects. ``payloads_older_than_seconds``
        (usually shorter) only blanks the payload and result of finished
        tasks, keeping the row and its evidence trail for incident review.
        Dead, blocked and needs_reconciliation tasks are never pruned: they wait
        for a person. Works in batches of ``batch`` tasks, one transaction each;
        each batch that changed something writes its audit entry (``by``, with
        that batch's counts) in its own transaction. A pass that changed
        nothing is audited too, unless ``record_empty`` is false.
        Returns counts: ``tasks``, ``events``, ``effects``, ``payloads``.
        """
        older = policy.check_seconds("older_than_seconds", older_than_seconds, allow_zero=True,
                                     maximum=100 * 365 * 86400.0)
        if payloads_older_than_seconds is not None:
            payloads_older_than_seconds = policy.check_seconds(
                "payloads_older_than_seconds", payloads_older_than_seconds, allow_zero=True,
                maximum=100 * 365 * 86400.0)
        batch = policy.check_int("batch", batch, minimum=1, maximum=100_000)
        by, via = self._actor(by, via)
        settings = dict(older_than_seconds=older, payloads_older_than_seconds=payloads_older_than_seconds)
        counts = {"tasks": 0, "events": 0, "effects": 0, "payloads": 0}
        while True:
            with self.store.transaction() as tx:
                ids = [r["id"] for r in tx.rows("prune_finished_ids", older_than=older, limit=batch)]
                if ids:
                    done = {"tasks": 0, "events": len(tx.rows("prune_events", task_ids=ids)),
                            "effects": len(tx.rows("prune_effects", task_ids=ids)), "payloads": 0}
                    done["tasks"] = len(tx.rows("prune_tasks", task_ids=ids))
                    self._audit(tx, by, via, "prune", "retention", **settings, **done)
                    for key, n in done.items():
                        counts[key] += n
            if len(ids) < batch:
                break
        while payloads_older_than_seconds is not None:
            with self.store.transaction() as tx:
                n = len(tx.rows("prune_payloads", older_than=payloads_older_than_seconds, limit=batch))
                if n:
                    self._audit(tx, by, via, "prune", "retention", **settings, tasks=0, events=0, effects=0,
                                payloads=n)
            counts["payloads"] += n
            if n < batch:
                break
        if record_empty and not any(counts.values()):
            with self.store.transaction() as tx:
                self._audit(tx, by, via, "prune", "retention", **settings, **counts)
        return counts

    # -- helpers ----------------------------------------------------------------

    def _check_claim(self, wid: str, claim: Claim) -> None:
        if not isinstance(claim, Claim):
            raise InvalidInput("claim", f"must be a Claim returned by claim() (got {type(claim).__name__})")
        for name in ("task_id", "generation"):
            value = getattr(claim, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**63 - 1:
                raise InvalidInput("claim", f"{name} must be an integer from 0 to 2**63-1 (got {value!r})")
        if claim.worker_id != wid:
            raise InvalidInput("claim", f"belongs to worker {claim.worker_id!r}, not {wid!r}")

    @staticmethod
    def _actor(by: str | None, via: str | None) -> tuple[str, str | None]:
        """``by`` and ``via`` of an operator action, checked; ``by`` defaults to the OS user."""
        return policy.check_text("by", by) or _default_actor(), policy.check_text("via", via)

    @staticmethod
    def _audit(tx: Tx, by: str, via: str | None, action: str, target: str, **detail: Any) -> None:
        """The audit entry of an operator or admin action, in the action's own transaction."""
        if via is not None:
            detail["via"] = via
        tx.rows("audit_insert", actor=by, action=action, target=target, detail=detail)

    def _require_task(self, tx: Tx, task_id: int, *, lock: bool = False) -> dict[str, Any]:
        row = tx.row("lock_task" if lock else "get_task", task_id=task_id)
        if row is None:
            raise NotFound(f"task {task_id} does not exist")
        return row

    def _event_params(self, task_id: int, type_: str, generation: int | None, worker_id: str | None,
                      **detail: Any) -> dict[str, Any]:
        type_ = str(getattr(type_, "value", type_))
        if self.evidence == "compact" and type_ in ROUTINE_EVENTS:
            detail = {}
        return dict(task_id=task_id, type=type_, generation=generation, worker_id=worker_id, detail=detail)

    def _event(self, tx: Tx, task_id: int, type_: str, generation: int | None, worker_id: str | None,
               **detail: Any) -> None:
        tx.rows("insert_event", **self._event_params(task_id, type_, generation, worker_id, **detail))


def connect(dsn: str | None = None, **options: Any) -> Queue:
    """Open a queue. ``dsn``: ``postgresql://…`` or ``sqlite:///path.db``; by
    default ``$LEASEQ_DSN``, else ``sqlite:///leaseq.db`` in the current folder.

    ``signer`` (an :class:`leaseq.fencing.ActionSigner`) makes every effect
    carry a signed action token; by default one is built from
    ``$LEASEQ_ACTION_KEYS`` when that is set. ``evidence="compact"`` keeps the
    routine events' detail out of the trail (see :class:`Queue`). Other options
    go to the backend (e.g. ``max_size`` of the PostgreSQL pool)."""
    settings = {name: options.pop(name) for name in ("max_same_error", "signer", "action_token_ttl", "evidence")
                if name in options}
    if "signer" not in settings and os.environ.get("LEASEQ_ACTION_KEYS"):
        # Imported here: the fencing kit pulls in the ASGI stack, which most
        # queue users (and every CLI call) do not need.
        from .fencing.tokens import ActionSigner

        settings["signer"] = ActionSigner.from_env()
    return Queue(open_store(dsn, **options), **settings)
