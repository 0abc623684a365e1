"""A new service replica warms up before it says it is listening, and a stalled
database at that moment delays its start by the warm-up's bound only.

The warm-up (leaseq.service.app._warm_up) builds the routes and opens the
asyncio pool that the worker API runs on, so the first worker to reach a new
replica is not the one that pays for them. It is best effort: here the path
to PostgreSQL is a real black hole (the chaos proxy) while the service starts;
the service starts all the same, says why its pool is not open, and serves
workers once the path heals.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import urlsplit

import leaseq
from leaseq import auth
from leaseq.client import RemoteQueue
from leaseq.service import app as service_app
from leaseq_chaos.proxy import FaultyProxy

from service.conftest import serve

from .test_presumed_loss import through


def test_a_database_that_stalls_as_the_service_starts_holds_it_back_only_for_the_warm_up(
        pg_schema_dsn: str, monkeypatch, caplog) -> None:
    admin = leaseq.connect(pg_schema_dsn)
    admin.migrate()
    token, _ = auth.create_token(admin, name="late", role="worker", all_queues=True)
    task = admin.enqueue("job", {"n": 1})
    proxy = FaultyProxy(urlsplit(pg_schema_dsn).port or 5432)
    q = leaseq.connect(through(pg_schema_dsn, proxy.add_link("svc")), connect_timeout=2)
    monkeypatch.setattr(service_app, "WARM_UP_SECONDS", 0.5)
    caplog.set_level(logging.WARNING, logger="leaseq.service")
    try:
        proxy.blackhole("svc")
        started = time.monotonic()
        with serve(q) as (url, _):
            assert time.monotonic() - started < 5, "the warm-up held the start beyond its bound"
            assert any("warm-up" in r.getMessage() and "did not open" in r.getMessage() for r in caplog.records)
            proxy.heal("svc")
            rq = RemoteQueue(url, token)
            try:
                worker = rq.register_worker("late")
                [claim] = rq.claim(worker)  # the worker API's pool opens now, on this request
                assert claim.task_id == task.id
                rq.complete(worker, claim, {"ok": True})
            finally:
                rq.close()
        assert admin.get(task.id).status == "completed"
    finally:
        proxy.heal_all()
        proxy.close()
        q.close()
        admin.close()
