"""A short run of claims racing revocations, its trails replayed against the lease model.

Run as ``python revocation_race.py DSN TRIALS``: each trial registers a worker,
claims for it in a loop on one connection while another revokes it, reads the
database's time once ``revoke_worker()`` has returned (the revocation had
committed by then) and then tries each claim it got once more (a completion).
At the end every task's trail is replayed against the model with those
revocation times, and the violations are printed as JSON, one per line.
"""

from __future__ import annotations

import json
import random
import sys
import threading

import leaseq
from leaseq.core.errors import LeaseLost, UnknownWorker
from leaseq_chaos.traces import validate_queue


def trial(dsn: str, q: leaseq.Queue, n: int, delay: float) -> tuple[str, float]:
    w = q.register_worker(f"racer{n}")
    q.enqueue_many("job", [{"n": i} for i in range(30)], queue=f"race{n}", effect="side_effect", lease_seconds=120)
    got: list[leaseq.Claim] = []
    start = threading.Event()

    def claim() -> None:
        c = leaseq.connect(dsn)
        try:
            c.now()
            start.set()
            while True:
                try:
                    claims = c.claim(w.id, queue=f"race{n}", lease_seconds=120)
                except UnknownWorker:
                    return
                if not claims:
                    return
                got.extend(claims)
        finally:
            c.close()

    def revoke() -> None:
        r = leaseq.connect(dsn)
        try:
            r.now()
            start.wait(30)
            threading.Event().wait(delay)
            r.revoke_worker(w.id)
        finally:
            r.close()

    threads = [threading.Thread(target=claim), threading.Thread(target=revoke)]
    for t in threads:
        t.start()
    threads[1].join(60)
    committed_by = q.now().timestamp()
    threads[0].join(60)
    for c in got:  # the revoked worker tries to finish what it claimed: each must be refused
        try:
            q.complete(w, c, {"late": True})
        except LeaseLost:
            pass
    return w.id, committed_by


def main() -> None:
    dsn, trials = sys.argv[1], int(sys.argv[2])
    q = leaseq.connect(dsn)
    q.migrate()
    rng = random.Random(5)
    bounds = dict(trial(dsn, q, n, rng.uniform(0.0, 0.03)) for n in range(trials))
    for v in validate_queue(q, revoked=bounds):
        print(json.dumps(v, default=str))
    q.close()


if __name__ == "__main__":
    main()
