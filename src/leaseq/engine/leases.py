"""Leases: claim, renew, complete many, report a loss (how an attempt ends: :mod:`.endings`;
expiry: :mod:`.expiry`).

Every write here runs on the strength of a lease, and the lease guard is in
the SQL (the ``lease_guard`` template of ``sql/<dialect>/queries.sql``): zero
rows back means the lease is lost and nothing changed, which these
operations turn into :class:`LeaseLost` (or leave out of a batch's answer).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from ..core import checks
from ..core.errors import InvalidInput, InvalidTransition, LeaseLost
from ..core.model import Claim, Claims, Held, Worker
from . import fairness, limits
from .common import (Settings, check_claim, check_worker, event_params, heartbeats, require_task, to_task,
                     worker_id)
from .dependencies import settle_dependents
from .expiry import route_expired, wake_due
from .steps import BEGIN, BEGIN_ONE, COMMIT, Op, one, rows



def check_kinds(kinds: Iterable[str] | None) -> list[str] | None:
    """The kinds a claim may take, checked and sorted; None for any kind."""
    if kinds is None:
        return None
    if isinstance(kinds, (str, bytes)) or not isinstance(kinds, Iterable):
        raise InvalidInput("kinds", f"must be a list of task kinds, or None for any kind (got {kinds!r})")
    checked = sorted({checks.check_kind(k, f"kinds[{i}]") for i, k in enumerate(kinds)})
    if not checked:
        raise InvalidInput("kinds", "must name at least one task kind (None claims any kind)")
    if len(checked) > 1000:
        raise InvalidInput("kinds", f"names {len(checked)} kinds; at most 1000")
    return checked


def _settled(found: list[dict[str, Any]]) -> bool:
    """Whether a fast-path claim_batch answer that claimed nothing is final: no
    expired lease awaits routing and the worker may claim. Only a backend that
    answers with its flags (PostgreSQL's row of NULL task columns) can say so;
    an empty answer (SQLite) sends the claim down the slow path."""
    return bool(found) and found[0]["id"] is None and not found[0]["routing_due"] and found[0]["worker_ok"]


def claim(s: Settings, worker: Worker | str, *, queue: str = "default", limit: int = 1,
          lease_seconds: float | None = None, kinds: Iterable[str] | None = None) -> Op[Claims]:
    """:meth:`leaseq.Queue.claim`."""
    out = yield from _claim(s, worker, queue=queue, limit=limit, lease_seconds=lease_seconds, kinds=kinds)
    assert out is not None  # only a fast-path-only claim leaves the answer open
    return out


#: The most tasks one claim may lease.
MAX_CLAIM = 10_000


def _claim(s: Settings, worker: Worker | str, *, queue: str = "default", limit: int = 1,
           lease_seconds: float | None = None, kinds: Iterable[str] | None = None,
           fast_only: bool = False) -> Op[Claims | None]:
    """The claim; ``fast_only``: None where its one-statement fast path cannot settle it."""
    wid = worker_id(worker)
    checks.check_name("queue", queue)
    checks.check_int("limit", limit, minimum=1, maximum=MAX_CLAIM)
    if lease_seconds is not None:
        checks.check_seconds("lease_seconds", lease_seconds, allow_zero=False)
    params = dict(queue=queue, worker_id=wid, limit=limit, lease_seconds=lease_seconds, compact=s.compact,
                  kinds=check_kinds(kinds))
    # Fast path: one statement, which claims nothing while an expired lease
    # awaits routing.
    yield BEGIN_ONE
    found = yield from fairness.claim_rows(s, params, route_first=True, one_statement=True)
    claimed = yield from _record_claims(s, wid, found)
    yield COMMIT
    # PostgreSQL's statement answers how long an empty rate bucket needs (every row says it)
    wait = found[0].get("limit_wait") if found else None
    if not claimed and not _settled(found):
        if fast_only:
            return None
        # Slow path: route expired leases, then claim, in two transactions.
        yield from route_for_claim(s, wid, queue)
        yield BEGIN
        found = yield from fairness.claim_rows(s, params, route_first=False, one_statement=False)
        claimed = yield from _record_claims(s, wid, found)
        wait = found[0].get("limit_wait") if found else None
        if len(claimed) < limit and not s.backend.own_limit_slots:
            wait = (yield one("limit_wait"))["limit_wait"]
        yield COMMIT
    claimed.sort(key=fairness.service_order)
    out = Claims(Claim(task_id=r["id"], generation=r["claim_generation"], worker_id=wid,
                       expires_at=r["lease_expires_at"], task=to_task(r),
                       lease_seconds=r["lease_granted"], epoch=r.get("claim_epoch") or 0)
                 for r in claimed)
    if len(out) < limit and wait is not None:
        out.limit_wait = max(0.0, float(wait))
    return out


def try_claim(s: Settings, worker: Worker | str, *, queue: str = "default", limit: int = 1,
              lease_seconds: float | None = None, kinds: Iterable[str] | None = None) -> Op[Claims | None]:
    """The claim for a caller whose transaction may hold other rows (a service request,
    completions): its fast path alone, one statement, answering None where that cannot
    settle the claim (expired leases await routing, or the worker must be checked). The
    caller then runs :func:`route_for_claim` and tries again, each in a transaction that
    commits. Run as one transaction, routing and claim would take limit rows out of key
    order. A backend that writes one transaction at a time waits for no row lock: there
    the claim runs whole, and never answers None."""
    return (yield from _claim(s, worker, queue=queue, limit=limit, lease_seconds=lease_seconds, kinds=kinds,
                              fast_only=not s.backend.serial_writes))


def route_for_claim(s: Settings, worker: Worker | str, queue: str) -> Op[int]:
    """The first transaction of a claim's slow path: the worker checked (UnknownWorker if
    revoked or never registered) and a batch of the claimed queue's expired leases routed
    (only its own: another queue's are its claims' or the sweep's). The worker row is
    locked first, as revoke_worker locks it: never a lock cycle with a revocation; the
    queue's waiting tasks whose wake time has come are made claimable too. It
    commits before the claim: the routing gives limit slots back (locking their rows), and
    a claim must take limit rows only in key order. Returns how many leases were routed."""
    checks.check_name("queue", queue)
    yield BEGIN
    yield from check_worker(worker_id(worker), lock=True)
    routed = yield from route_expired(s, queue)
    routed += yield from wake_due(s, queue)
    yield COMMIT
    return routed


def _record_claims(s: Settings, wid: str, found: list[dict[str, Any]]) -> Op[list[dict[str, Any]]]:
    """The claimed rows of a claim_batch answer, their events written (and their limit
    slots taken, their fairness keys charged) if the backend's statement did not."""
    claimed = [r for r in found if r["id"] is not None]
    if claimed and not s.backend.own_limit_slots:
        taken = limits.slot_items(claimed)
        if taken:
            yield rows("take_limits", items=taken)
    if claimed:
        yield from fairness.charge(s, claimed)
    if claimed and not s.backend.writes_own_evidence:
        yield rows("insert_events", events=[
            event_params(s, r["id"], "claimed", r["claim_generation"], wid, attempt=r["attempts"],
                         lease_seconds=r["lease_granted"],
                         lease_expires_at=r["lease_expires_at"].isoformat())
            for r in claimed])
    return claimed


def renew_leases(s: Settings, worker: Worker | str, claims: Sequence[Held]) -> Op[dict[int, datetime]]:
    """:meth:`leaseq.Queue.renew_leases`."""
    wid = worker_id(worker)
    refs = [check_claim(wid, c) for c in claims]
    if not refs:
        return {}
    yield BEGIN_ONE
    # the ids to find the rows by, and each one's generation for the guard
    renewed = yield rows("renew_leases", worker_id=wid, task_ids=[c.task_id for c in refs],
                         leases={str(c.task_id): c.generation for c in refs})
    yield COMMIT
    return {r["id"]: r["lease_expires_at"] for r in renewed}


def heartbeat(s: Settings, worker: Worker | str, claim: Held) -> Op[datetime]:
    """:meth:`leaseq.Queue.heartbeat`: a renewal of one lease."""
    claim = check_claim(worker_id(worker), claim)
    renewed = yield from renew_leases(s, worker, [claim])
    if claim.task_id not in renewed:
        raise LeaseLost(claim.task_id, claim.generation, "heartbeat refused: lease no longer held")
    return renewed[claim.task_id]


def complete_many(s: Settings, worker: Worker | str, done: Sequence[tuple[Held, Any]], *,
                  results_checked: bool = False) -> Op[set[int]]:
    """:meth:`leaseq.Queue.complete_many`: the one completion statement. ``results_checked``:
    the caller checked each result already (:func:`.endings.end_attempts`), so each is
    encoded once more only, by the store, not walked again here."""
    completed, _ = yield from _complete_many(s, worker, done, results_checked=results_checked)
    return completed


class ClaimFailed(Exception):
    """The claim of :func:`complete_and_claim` failed (``cause``): its transaction must roll
    back, the completions with it (a failed statement leaves nothing to commit)."""

    def __init__(self, cause: Exception):
        super().__init__(f"the claim after the completions failed: {cause!r}")
        self.cause = cause


def complete_and_claim(s: Settings, worker: Worker | str, done: Sequence[tuple[Held, Any]],
                       claim_with: dict[str, Any] | None, *,
                       results_checked: bool = False) -> Op[tuple[set[int], Claims | None]]:
    """``complete_many``, then the claim ``claim_with`` names (its keyword arguments), in
    the caller's one transaction: one commit for both. Run it joined (the service's
    complete-and-claim request): alone, each part commits on its own.

    The claim comes with the completions only where it cannot wait for a lock
    out of the order every other transaction takes them in; elsewhere the
    answer's claims are None, and the caller claims in a transaction of its own:

    * when the completions gave limit slots back: this transaction holds those
      limit rows now, and a claim must take limit rows in key order only;
    * when the claim's one-statement fast path cannot settle it (expired leases
      to route, or a worker to check): routing gives limit slots back, and the
      claim after it would take limit rows out of key order (see
      :func:`try_claim`).

    Every claim locks the worker row (FOR SHARE), which a revocation locks before
    the worker's tasks; so, when a claim is to follow, the worker row is locked
    before the completions lock any task row: taken after them, a revocation
    between the two would wait for a completed task while the claim waited for
    the worker row.

    A backend that writes one transaction at a time waits for no row lock, and
    claims in full. A claim that fails raises :class:`ClaimFailed`.
    """
    serial = s.backend.serial_writes
    completed, held_limits = yield from _complete_many(s, worker, done, results_checked=results_checked,
                                                       lock_worker=claim_with is not None and not serial)
    if claim_with is None or (held_limits and not serial):
        return completed, None
    try:
        claims = yield from try_claim(s, worker, **claim_with)
    except Exception as exc:
        raise ClaimFailed(exc) from exc
    return completed, claims


def _complete_many(s: Settings, worker: Worker | str, done: Sequence[tuple[Held, Any]], *,
                   lock_worker: bool = False, results_checked: bool = False) -> Op[tuple[set[int], bool]]:
    """The completions, and whether they gave limit slots back; ``lock_worker``: the
    worker row is locked before the tasks (a claim follows in this transaction)."""
    wid = worker_id(worker)
    items, seen = [], set()
    for held, result in done:
        ref = check_claim(wid, held)
        if ref.task_id in seen:
            raise InvalidInput("done", f"names task {ref.task_id} twice")
        seen.add(ref.task_id)
        items.append({"task_id": ref.task_id, "generation": ref.generation,
                      "result": result if results_checked else checks.check_json("result", result)})
    if not items:
        return set(), False
    # one statement where the backend writes its own evidence; else the
    # events follow in the same transaction (one_statement is a promise only
    # a backend that can skip BEGIN acts on). Tasks that others wait for are
    # left out of this statement...
    yield BEGIN_ONE
    # the lean completion where no task the caller holds names a limit (or it cannot say:
    # an AttemptRef, as the service names an attempt, carries no task); a task that
    # names one after all (the row decides) is left out of its answer, and completed below
    lean = s.backend.lean_complete and not any(isinstance(held, Claim) and held.task is not None
                                               and held.task.limits for held, _ in done)
    found = yield from _complete_batch(s, wid, items, with_dependents=False, lock_worker=lock_worker, lean=lean)
    yield COMMIT
    completed: set[int] = {r["id"] for r in found}
    held_limits = any(r["limits"] for r in found)
    rest = [item for item in items if item["task_id"] not in completed]
    if rest:
        # ...and completed here (with a task the lean completion left out: it names
        # a limit), in a transaction that also settles their waiters (a task
        # missing from both answers had lost its lease)
        yield BEGIN
        found = yield from _complete_batch(s, wid, rest, with_dependents=True, lock_worker=lock_worker)
        settled = [r["id"] for r in found]
        if settled:
            yield from settle_dependents(s, settled)
        yield COMMIT
        completed.update(settled)
        held_limits = held_limits or any(r["limits"] for r in found)
    return completed, held_limits


def _complete_batch(s: Settings, wid: str, items: list[dict[str, Any]], *,
                    with_dependents: bool, lock_worker: bool = False, lean: bool = False) -> Op[list[dict[str, Any]]]:
    completed: list[dict[str, Any]] = yield rows("complete_plain" if lean else "complete_batch", worker_id=wid,
                           items=items, compact=s.compact,
                           task_ids=[item["task_id"] for item in items],
                           with_dependents=with_dependents, lock_worker=lock_worker)
    if completed and not s.backend.own_limit_slots:
        yield from limits.release(s, completed)
    if completed and not s.backend.writes_own_evidence:
        # the generation the caller completed under (the guard made it the row's): a
        # completion the guard should have refused is recorded as the stale attempt it was
        claimed = {item["task_id"]: item["generation"] for item in items}
        yield rows("insert_events", events=[
            event_params(s, r["id"], "completed", claimed[r["id"]], wid, attempt=r["attempts"],
                         **heartbeats(r)) for r in completed])
    return completed


def report_loss(s: Settings, worker: Worker | str, claim: Held, reason: str) -> Op[None]:
    """:meth:`leaseq.Queue.report_loss`: evidence only; the report_loss query decides whether it is due."""
    wid = worker_id(worker)
    claim = check_claim(wid, claim)
    checks.check_text("reason", reason, required=True)
    yield BEGIN
    yield from require_task(claim.task_id, lock=True)
    params = event_params(s, claim.task_id, "lease_lost", claim.generation, wid, reason=reason)
    written = yield one("report_loss", task_id=claim.task_id, generation=claim.generation, worker_id=wid,
                        detail=params["detail"])
    if written is not None:
        yield COMMIT
        return
    why = yield one("generation_outcome", task_id=claim.task_id, generation=claim.generation, worker_id=wid)
    yield COMMIT
    if not why["held"]:
        raise InvalidInput("claim", f"worker {wid!r} never held generation {claim.generation} "
                                    f"of task {claim.task_id}")
    if why["ended"] == "lease_lost":
        raise InvalidTransition(f"task {claim.task_id} generation {claim.generation}: "
                                "its loss was already reported")
    raise InvalidTransition(f"task {claim.task_id} generation {claim.generation}: not lost, it ended "
                            f"by its holder ({why['ended']})")
