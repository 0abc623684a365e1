"""A claim racing a revocation: the two serialize.

One thread claims in a loop for worker W while another revokes W. Whatever
the interleaving, the outcome must be one a serial order explains: either
the claim came first (and the revocation ended its lease, with a
``lease_revoked`` event), or the revocation came first (and the claim got
nothing). So once ``revoke_worker()`` has returned, W holds no live lease and
every guarded call it makes on what it claimed is refused.

These are real threads on separate connections, racing, many trials.
SQLite runs one writer at a time, so it cannot interleave; it runs anyway.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq.core.errors import LeaseLost, UnknownWorker

from .support import wait_expired

TRIALS = 30
TASKS_PER_TRIAL = 40
#: Long enough that no lease ends by expiry during a trial on a loaded machine:
#: any lease that ends, ends because of the revocation.
LEASE_SECONDS = 120.0


def _claim_until_revoked(dsn: str, wid: str, start: threading.Event, got: list[tuple[Any, Any]],
                         errors: list[BaseException], first_claim: list[float]) -> None:
    """Claim one task at a time for ``wid`` (and record an intent under each
    claim, for finish_effect to try later) until the queue refuses the worker.
    How long its first claim took goes to ``first_claim`` when it returns."""
    q = leaseq.connect(dsn)
    try:
        q.now()  # connected before the race starts, so the first claim is not slowed by it
        try:  # nor by preparing the claim statement: a claim for no worker prepares it and takes nothing
            q.claim("warm-up-no-such-worker")
        except UnknownWorker:
            pass
        start.set()
        began = time.monotonic()
        timed = False
        while True:
            try:
                claims = q.claim(wid, lease_seconds=LEASE_SECONDS)
            except UnknownWorker:
                return
            finally:  # this trial's first claim, refused or not (the list holds every trial's)
                if not timed:
                    first_claim.append(time.monotonic() - began)
                    timed = True
            for c in claims:
                try:
                    fx = q.begin_effect(wid, c, "ledger.write")
                except LeaseLost:
                    fx = None  # revoked between the claim and the intent
                got.append((c, fx))
            if not claims:
                return  # the queue ran dry before the revocation: the trial still counts
    except BaseException as exc:  # noqa: BLE001 - reported to the test thread
        errors.append(exc)
    finally:
        q.close()


def _revoke(dsn: str, wid: str, start: threading.Event, delay: float, errors: list[BaseException]) -> None:
    q = leaseq.connect(dsn)
    try:
        q.now()
        assert start.wait(timeout=30), "the claiming thread never started"
        threading.Event().wait(delay)  # a moment into the claim loop: mostly while a claim is in flight
        q.revoke_worker(wid)
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)
    finally:
        q.close()


def _live_leases(q: leaseq.Queue, wid: str) -> list[int]:
    now = q.now()
    return [t.id for t in q.list_tasks(status="running", limit=1000)
            if t.lease_owner == wid and t.lease_expires_at is not None and t.lease_expires_at >= now]


@pytest.mark.parametrize("path", ["fast", "routing"])
def test_a_claim_racing_revoke_worker_leaves_no_live_lease(q: leaseq.Queue, dsn: str, path: str) -> None:
    """``routing``: W also holds leases that have run out, so its claims take
    the slow path (route expired leases, then claim) while the revocation ends
    those same leases: the two lock the same rows and must not deadlock."""
    rng = random.Random(11)
    leaked: list[str] = []
    raced = 0
    #: how long the first claim of each trial took: the revocation is aimed at
    #: the first claim's span (a delay up to twice its median), so about half
    #: of the revocations land before it commits and half after, however fast
    #: or loaded the machine is
    first_claims: list[float] = []
    for trial in range(TRIALS):
        w = q.register_worker(f"racer{trial}")
        if path == "routing":
            q.enqueue_many("old", [{"n": i} for i in range(3)], queue="default", effect="idempotent",
                         lease_seconds=LEASE_SECONDS)
            stale = q.claim(w, limit=3, lease_seconds=0.01)
            assert len(stale) == 3
            wait_expired(q, max(stale, key=lambda c: c.expires_at))
        q.enqueue_many("job", [{"n": i} for i in range(TASKS_PER_TRIAL)], queue="default", effect="side_effect",
                       lease_seconds=LEASE_SECONDS)
        got: list[tuple[Any, Any]] = []
        errors: list[BaseException] = []
        start = threading.Event()
        span = 2 * statistics.median(first_claims) if first_claims else 0.02
        claimer = threading.Thread(target=_claim_until_revoked, args=(dsn, w.id, start, got, errors, first_claims))
        revoker = threading.Thread(target=_revoke, args=(dsn, w.id, start, rng.uniform(0.0, span), errors))
        claimer.start()
        revoker.start()
        revoker.join(timeout=60)
        assert not revoker.is_alive(), "revoke_worker() did not return"
        # revoke_worker() has returned: from here on W holds nothing
        claimer.join(timeout=60)
        assert not claimer.is_alive(), "the claim loop did not end after the revocation"
        assert errors == [], errors
        if got:
            raced += 1

        live = _live_leases(q, w.id)
        if live:
            leaked.append(f"trial {trial}: live leases {live} after revoke_worker() returned")
        for claim, fx in got:
            refused = []
            for name, call in (("heartbeat", lambda: q.heartbeat(w, claim)),
                               ("begin_effect", lambda: q.begin_effect(w, claim, "ledger.other")),
                               ("finish_effect", lambda: fx is not None and q.finish_effect(w, claim, fx, {"ok": 1})),
                               ("complete", lambda: q.complete(w, claim, {"late": True}))):
                if name == "finish_effect" and fx is None:
                    continue
                try:
                    call()
                except LeaseLost:
                    refused.append(name)
                else:
                    leaked.append(f"trial {trial}: {name} on task {claim.task_id} accepted after the revocation")
            revoked = [e for e in q.events(claim.task_id) if e.type == "lease_revoked"]
            if [e.generation for e in revoked] != [claim.generation]:
                leaked.append(f"trial {trial}: task {claim.task_id} claimed before the revocation "
                              f"but has no lease_revoked event")
        # leave nothing queued for the next trial's worker to race over
        q.sweep()
        for t in q.list_tasks(status="queued", limit=1000):
            q.cancel(t.id, "trial over")
    trials = {line.split(":")[0] for line in leaked}
    assert leaked == [], f"{len(trials)} of {TRIALS} trials explained by no serial order"
    assert raced >= TRIALS // 3, f"only {raced} of {TRIALS} trials claimed anything: the race did not happen"


def test_a_revoked_worker_claims_nothing(q: leaseq.Queue) -> None:
    """The serial case the race must reduce to, on both backends."""
    w = q.register_worker("w")
    q.enqueue("job")
    q.revoke_worker(w)
    with pytest.raises(UnknownWorker):
        q.claim(w)
    assert q.list_tasks(status="queued")[0].attempts == 0
