"""A lease presumed lost on the worker's clock is judged by the database, not by the worker.

When no renewal succeeds within the lease length, the worker presumes the
lease lost: ``ctx.lost`` turns true, ``ctx.check()`` and new effects refuse.
But the worker only inferred it. Here the worker reaches PostgreSQL through a
fault proxy, on a real network path:

* its renewals *commit* and their answers are lost (``lose_replies``): the
  lease is still live in the database when the worker gives up on it. The
  sync handler then returns; its success is sent through the guarded
  completion and the task ends ``completed`` by its first attempt
  (``max_attempts=1``: one charged attempt would make it ``dead``);
* the converse: the connection stalls (``blackhole``), nothing reaches the
  database, the lease really expires, and another worker takes the task over.
  The handler's late success is sent and refused by the guard (zero rows):
  the new holder's lease and result stand.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from conftest import check_trails

import leaseq
from leaseq_chaos.proxy import FaultyProxy

from .support import Runner, first_attempt_completed, wait_for

#: renewed every 2 s: the worker presumes the lease lost 2 s before an unanswered renewal runs out
LEASE = 6.0


def through(dsn: str, port: int) -> str:
    """``dsn`` reaching its server through a local port (the proxy's)."""
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"{netloc[0]}@127.0.0.1:{port}" if len(netloc) == 2 else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=host))


class Proxied:
    """A worker app reaching the queue through a fault proxy, a held handler, and a direct observer."""

    def __init__(self, schema_dsn: str, *, max_attempts: int):
        upstream = urlsplit(schema_dsn).port or 5432
        self.proxy = FaultyProxy(upstream)
        self.link = f"w-{uuid.uuid4().hex[:6]}"
        port = self.proxy.add_link(self.link)
        self.q = leaseq.connect(schema_dsn)
        self.q.migrate()
        self.app = leaseq.App(through(schema_dsn, port), name="proxied", connect_timeout=3)
        self.contexts: list[leaseq.TaskContext] = []
        self.release = threading.Event()
        self.max_attempts = max_attempts

        @self.app.task("job", effect="read_only", max_attempts=max_attempts, lease_seconds=LEASE)
        def job(ctx: leaseq.TaskContext) -> dict:
            self.contexts.append(ctx)
            assert self.release.wait(60)
            return {"by": ctx.worker.id, "generation": ctx.generation}  # ignores ctx.lost on purpose

    def enqueue(self) -> int:
        return self.q.enqueue("job", {}, max_attempts=self.max_attempts, lease_seconds=LEASE).id

    def close(self) -> None:
        self.release.set()
        self.proxy.heal_all()
        self.q.close()
        self.app.queue.close()
        self.proxy.close()


@pytest.fixture
def proxied(request: pytest.FixtureRequest, pg_schema_dsn: str) -> Iterator[Proxied]:
    p = Proxied(pg_schema_dsn, max_attempts=request.param)
    yield p
    try:
        check_trails(p.q, request)  # the trails the proxy's faults left, replayed against the lease model
    finally:
        p.close()


@pytest.mark.parametrize("proxied", [1], indirect=True)
def test_renewal_answers_lost_the_lease_still_live_the_success_is_recorded_on_attempt_one(proxied) -> None:
    task_id = proxied.enqueue()
    running = Runner(proxied.app.worker(concurrency=1, poll_interval=30))
    runtime = running.runtime
    try:
        wait_for(lambda: proxied.contexts, what="the handler running")
        ctx = proxied.contexts[0]
        claimed_until = proxied.q.get(task_id).lease_expires_at
        # One renewal goes through first: it prepares the renewal statement on the
        # worker's connection, so the next one is sent whole and commits unanswered.
        wait_for(lambda: runtime.stats.renewals >= 1, LEASE, "a first renewal")
        renewed_until = proxied.q.get(task_id).lease_expires_at
        assert renewed_until > claimed_until
        proxied.proxy.lose_replies(proxied.link)  # renewals commit; their answers never come back
        wait_for(lambda: ctx.lost, LEASE * 2, "the worker presuming the lease lost")
        task = proxied.q.get(task_id)
        # The worker gave up on a lease the database still holds for it, renewed by a
        # renewal whose answer was lost.
        assert task.status == "running" and task.claim_generation == 1
        assert task.lease_expires_at > renewed_until and task.lease_expires_at > proxied.q.now(), task
        with pytest.raises(leaseq.LeaseLost):
            ctx.check()  # the safe side holds: the handler is told to stop
        proxied.proxy.heal(proxied.link)
        proxied.release.set()  # ...but it had already done its work, and returns
        wait_for(lambda: proxied.q.get(task_id).status != "running", LEASE, "the task leaving running")
    finally:
        proxied.release.set()
        running.stop()
    first_attempt_completed(proxied.q, [task_id])
    assert proxied.q.get(task_id).result == {"by": runtime.worker.id, "generation": 1}
    stats = runtime.stats
    assert (stats.presumed_lost, stats.recovered, stats.completed, stats.lost) == (1, 1, 1, 0), stats


@pytest.mark.parametrize("proxied", [2], indirect=True)
def test_lease_really_expired_and_reclaimed_the_late_success_is_refused(proxied) -> None:
    task_id = proxied.enqueue()
    running = Runner(proxied.app.worker(concurrency=1, poll_interval=30))
    runtime = running.runtime
    try:
        wait_for(lambda: proxied.contexts, what="the handler running")
        ctx = proxied.contexts[0]
        proxied.proxy.blackhole(proxied.link)  # nothing reaches the database: the lease runs out
        wait_for(lambda: ctx.lost, LEASE * 2, "the worker presuming the lease lost")
        wait_for(lambda: proxied.q.get(task_id).lease_expires_at < proxied.q.now(), LEASE, "the lease expired")
        other = proxied.q.register_worker("other")
        [taken] = proxied.q.claim(other, kinds=["job"])
        assert (taken.task_id, taken.generation) == (task_id, 2)
        proxied.proxy.heal(proxied.link)  # the stalled renewal arrives late, and is refused
        proxied.release.set()  # the first holder's handler returns: its success is sent, and refused
        wait_for(lambda: runtime.stats.lost == 1, LEASE, "the late completion refused")
        task = proxied.q.get(task_id)
        assert (task.status, task.claim_generation, task.lease_owner) == ("running", 2, other.id), task
        proxied.q.complete(other, taken, result={"by": "other"})
    finally:
        proxied.release.set()
        running.stop()
    assert proxied.q.get(task_id).result == {"by": "other"}
    stats = runtime.stats
    # The worker did send the success, and the guard refused it.
    assert stats.lost_reasons == {"complete refused: lease no longer held": 1}, stats.lost_reasons
    assert (stats.presumed_lost, stats.recovered, stats.completed) == (1, 0, 0), stats
