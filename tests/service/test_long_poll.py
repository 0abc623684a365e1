"""Long-poll claims: a claim waits in the service for work, and the wake-up delivers it.

Each test makes the service's own re-check (``claim_recheck``) far longer
than the time it allows, so only the mechanism under test can deliver the
task in time: the PostgreSQL NOTIFY heard by the process's one listener,
or the in-process wake-up of an enqueue through the same service. A test
that passed without the mechanism would prove nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq.client import AsyncRemoteQueue, RemoteQueue
from leaseq.worker import WorkerRuntime

from leaseq.service.wakeups import LIMIT_SPREAD

from .conftest import Service, serve
from .support import error_of

SLOW_RECHECK = 30.0  # longer than any wait below: the re-check never delivers in these tests


def _wait_for(predicate: Any, timeout: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class Poll(threading.Thread):
    """One long-poll claim in a thread; ``answered_at`` is when its answer arrived."""

    def __init__(self, rq: RemoteQueue, worker: leaseq.Worker, wait: float, **options: Any):
        super().__init__(daemon=True)
        self.rq, self.worker, self.wait, self.options = rq, worker, wait, options
        self.claims: list[leaseq.Claim] | None = None
        self.error: BaseException | None = None
        self.answered_at = 0.0
        self.asked_at = 0.0

    def run(self) -> None:
        self.asked_at = time.monotonic()
        try:
            self.claims = self.rq.claim(self.worker, wait=self.wait, **self.options)
        except BaseException as exc:  # reported by the test
            self.error = exc
        self.answered_at = time.monotonic()


@pytest.fixture
def slow_svc(q: leaseq.Queue, dsn: str) -> Any:
    with serve(q, claim_recheck=SLOW_RECHECK) as (url, app):
        s = Service(url, app, q, dsn)
        try:
            yield s
        finally:
            s.close()


def _start_poll(svc: Service, wait: float, **options: Any) -> tuple[Poll, RemoteQueue, leaseq.Worker]:
    rq = svc.remote(svc.token("worker", all_queues=True))
    w = rq.register_worker("poller")
    poll = Poll(rq, w, wait, **options)
    signal = svc.app.state.work_signal
    poll.start()
    _wait_for(lambda: signal.waiting == 1, what="the claim waiting in the service")
    if signal.notifies:
        assert signal.listening.wait(10), "the shared listener never connected"
    return poll, rq, w


def test_notify_delivers_a_task_enqueued_during_a_long_poll(slow_svc: Service, q: leaseq.Queue) -> None:
    if not q.capabilities.listen_notify:
        pytest.skip("SQLite cannot notify (see the in-process wake-up test)")
    poll, _, w = _start_poll(slow_svc, wait=10.0)
    time.sleep(1.0)
    # Straight into the database, not through the service: only NOTIFY tells the service.
    enqueued = time.monotonic()
    task = q.enqueue("job", {"n": 1})
    poll.join(12)
    assert poll.error is None, poll.error
    assert [c.task_id for c in poll.claims] == [task.id]
    took = poll.answered_at - enqueued
    assert took < 1.0, f"the task took {took:.2f}s to arrive (the re-check is {SLOW_RECHECK}s)"
    assert slow_svc.app.state.work_signal.notifications >= 1
    assert q.get(task.id).lease_owner == w.id


def test_an_enqueue_through_the_service_wakes_its_waiting_claims(slow_svc: Service) -> None:
    poll, _, _ = _start_poll(slow_svc, wait=10.0, queue="mail")
    time.sleep(0.3)
    producer = slow_svc.remote(slow_svc.token("operator"))
    enqueued = time.monotonic()
    task = producer.enqueue("send", {"to": "ada"}, queue="mail")
    poll.join(12)
    assert poll.error is None, poll.error
    assert [c.task_id for c in poll.claims] == [task.id]
    assert poll.answered_at - enqueued < 1.0


def test_sqlite_waiting_claims_recheck_for_tasks_enqueued_elsewhere(svc: Service, q: leaseq.Queue) -> None:
    if q.capabilities.listen_notify:
        pytest.skip("PostgreSQL's waits are woken by NOTIFY (see above)")
    poll, _, _ = _start_poll(svc, wait=10.0)
    time.sleep(0.3)
    enqueued = time.monotonic()
    task = q.enqueue("job", {})  # another process's enqueue, as far as the service can tell
    poll.join(12)
    assert [c.task_id for c in poll.claims] == [task.id]
    assert poll.answered_at - enqueued < 1.0  # the short internal re-check


def test_a_long_poll_ends_empty_at_the_service_cap(q: leaseq.Queue, dsn: str) -> None:
    with serve(q, claim_wait_limit=0.3, claim_recheck=SLOW_RECHECK) as (url, app):
        svc = Service(url, app, q, dsn)
        try:
            rq = svc.remote(svc.token("worker", all_queues=True))
            w = rq.register_worker("poller")
            started = time.monotonic()
            assert rq.claim(w, wait=20.0) == []
            assert 0.3 * (1 - LIMIT_SPREAD) <= time.monotonic() - started < 3.0
        finally:
            svc.close()


def test_waits_opened_together_do_not_all_end_together_at_the_service_cap(q: leaseq.Queue, dsn: str) -> None:
    """The service's cap on a waiting request is drawn for each request from its last fifth:
    a flood's waits, opened at once, end spread out, and are not all asked again in one burst
    that holds every other request up (issue 29). Capped at exactly 4 s, every one of these
    twenty claims and ten task waits would last 4 s and more."""
    limit = 4.0
    with serve(q, claim_wait_limit=limit, wait_limit=limit, claim_recheck=SLOW_RECHECK) as (url, app):
        svc = Service(url, app, q, dsn)
        try:
            token = svc.token("worker", all_queues=True)
            w = svc.remote(token).register_worker("poller")
            polls = [Poll(svc.remote(token), w, 20.0) for _ in range(20)]
            task = q.enqueue("held")
            assert q.claim(q.register_worker("holder"))  # running: its waits wait
            operator = svc.http(svc.token("operator"))
            waits: list[float] = []

            def wait() -> None:
                asked = time.monotonic()
                r = operator.get(f"/v1/tasks/{task.id}/wait", params={"timeout": 20})
                assert r.status_code == 200 and r.json()["settled"] is False, r.text
                waits.append(time.monotonic() - asked)

            waiters = [threading.Thread(target=wait, daemon=True) for _ in range(10)]
            for t in [*polls, *waiters]:
                t.start()
            for t in [*polls, *waiters]:
                t.join(20)
            assert all(p.claims == [] for p in polls), [p.error for p in polls]
            assert len(waits) == 10
            spent = sorted([p.answered_at - p.asked_at for p in polls] + waits)
            assert spent[0] >= limit * (1 - LIMIT_SPREAD)  # never shorter than the cap's last fifth
            # some end in the first half of it (each request's own time to start waiting, under
            # a loaded machine's scheduling, only adds to what it lasts)
            assert spent[0] < limit * (1 - LIMIT_SPREAD / 2), spent
            assert spent[-1] < limit + 3.0
        finally:
            svc.close()


def test_interrupt_ends_a_waiting_claim_empty_handed(slow_svc: Service, q: leaseq.Queue) -> None:
    poll, rq, w = _start_poll(slow_svc, wait=10.0)
    interrupted = time.monotonic()
    rq.interrupt_claims(w)
    poll.join(5)
    assert poll.claims == [] and poll.answered_at - interrupted < 1.0
    task = q.enqueue("job", {})
    time.sleep(0.2)
    assert q.get(task.id).status == "queued"  # the interrupted poll leased nothing


def test_bad_waits_are_refused_naming_the_field(svc: Service) -> None:
    token = svc.token("worker", all_queues=True)
    rq = svc.remote(token)
    w = rq.register_worker("poller")
    with svc.http(token) as http:
        for wait in (-1, "5", True, [1]):
            resp = http.post(f"/v1/workers/{w.id}/claim", json={"queue": "default", "wait": wait})
            assert resp.status_code == 422, (wait, resp.text)
            assert error_of(resp)["field"] == "wait"
        resp = http.post(f"/v1/workers/{w.id}/claim", content=b'{"queue": "default", "wait": Infinity}',
                         headers={"content-type": "application/json"})
        assert resp.status_code in (400, 422) and error_of(resp)["code"] == "invalid", resp.text
    with pytest.raises(leaseq.InvalidInput) as err:
        rq.claim(w, wait=-1)
    assert err.value.field == "wait"


def test_an_idle_remote_worker_does_not_poll_and_stops_promptly(slow_svc: Service, q: leaseq.Queue) -> None:
    calls: list[float] = []

    class Counting(AsyncRemoteQueue):
        async def claim(self, *args: Any, **kwargs: Any) -> list[leaseq.Claim]:
            calls.append(time.monotonic())
            return await super().claim(*args, **kwargs)

    rq = Counting(slow_svc.url, slow_svc.token("worker", all_queues=True), timeout=10)
    app = leaseq.App(name="remote")
    done = threading.Event()

    @app.task("job")
    def job(ctx: leaseq.TaskContext) -> str:
        done.set()
        return "ok"

    runtime = WorkerRuntime(app, rq, concurrency=2)
    thread = threading.Thread(target=lambda: __import__("asyncio").run(runtime.run()), daemon=True)
    thread.start()
    try:
        _wait_for(lambda: slow_svc.app.state.work_signal.waiting == 1, what="the worker's claim waiting")
        time.sleep(1.5)
        assert len(calls) <= 2, f"{len(calls)} claims in 1.5 s while idle: the worker polls"
        task = slow_svc.remote(slow_svc.token("operator")).enqueue("job", {})
        assert done.wait(5)
        _wait_for(lambda: q.get(task.id).status == "completed", what="the completion")
    finally:
        stopped = time.monotonic()
        runtime.stop()
        thread.join(10)  # the runtime closes its client as it ends
    assert not thread.is_alive()
    assert time.monotonic() - stopped < 3.0  # the waiting claim was interrupted, not waited out


def test_a_token_revoked_during_a_long_poll_leases_nothing(slow_svc: Service, q: leaseq.Queue) -> None:
    from leaseq import auth

    token = slow_svc.token("worker", name="revoked-soon", all_queues=True)
    rq = slow_svc.remote(token)
    w = rq.register_worker("poller")
    poll = Poll(rq, w, 10.0)
    poll.start()
    _wait_for(lambda: slow_svc.app.state.work_signal.waiting == 1, what="the claim waiting in the service")
    auth.revoke_token(q, token.split("_")[1], by="test")
    task = slow_svc.remote(slow_svc.token("operator")).enqueue("job", {})  # wakes the waiting claim
    poll.join(12)
    assert isinstance(poll.error, leaseq.UnknownWorker), poll.error  # the token is checked at every attempt
    assert q.get(task.id).status == "queued"
