"""Every error code through a real service to RemoteQueue: the client raises the class the queue raised.

The service answers from the error registry (status, code, fields, headers)
and RemoteQueue rebuilds the exception from it; nothing else maps errors.
"""

from __future__ import annotations

import pytest

import leaseq
from leaseq.client import RemoteQueue
from leaseq.core.errors import ERRORS, registered_class
from error_samples import SAMPLES

from .conftest import serve


@pytest.fixture
def raising_service(tmp_path):
    """A service with one extra route raising the sample error of each code."""
    q = leaseq.connect(f"sqlite:///{tmp_path / 'q.db'}")
    q.migrate()
    by_code = {cls.code: exc for cls, exc in SAMPLES.items()}
    with serve(q) as (url, app):
        @app.post("/v1/raise/{code}")
        def raise_sample(code: str):
            raise by_code[code]

        rq = RemoteQueue(url, "lq_000000000000_" + "0" * 64, rate_limit_retries=0)
        try:
            yield rq
        finally:
            rq.close()
            q.close()


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.code)
def test_remote_queue_raises_the_class_the_service_raised(raising_service, cls):
    sent = SAMPLES[cls]
    with pytest.raises(leaseq.LeaseqError) as info:
        raising_service._call("POST", f"/v1/raise/{cls.code}")
    got = info.value
    assert type(got) is registered_class(sent) and str(got) == str(sent)
    assert got.wire_fields() == sent.wire_fields()


def test_a_refined_error_arrives_as_the_class_it_travels_as(raising_service):
    from leaseq.fencing import InvalidActionToken

    # InvalidActionToken declares no code: it is sent as "forbidden" and comes back an AccessDenied.
    assert registered_class(InvalidActionToken("expired", "too old")) is leaseq.auth.AccessDenied
    with pytest.raises(leaseq.auth.AccessDenied) as info:
        raising_service._call("POST", "/v1/raise/forbidden")
    assert type(info.value) is leaseq.auth.AccessDenied


def both(q: leaseq.Queue, rq: RemoteQueue, call):
    """Run ``call`` on the local queue and on the remote one; return the two exceptions."""
    raised = []
    for target in (q, rq):
        with pytest.raises(leaseq.LeaseqError) as info:
            call(target)
        raised.append(info.value)
    return raised


def test_the_worker_calls_raise_the_same_classes_locally_and_remotely(svc):
    q = svc.q
    rq = svc.remote(svc.token("worker", all_queues=True))
    local_w, remote_w = q.register_worker("local"), rq.register_worker("remote")
    workers = {id(q): local_w, id(rq): remote_w}
    q.enqueue_many("job", [{"n": n} for n in range(4)], effect="side_effect")
    claims = {id(q): q.claim(local_w, limit=2), id(rq): rq.claim(remote_w, limit=2)}

    def held(target, i=0):
        return workers[id(target)], claims[id(target)][i]

    cases = {
        "invalid": lambda t: t.claim(workers[id(t)], limit=0),
        "lease_lost": lambda t: (t.release(*held(t, 1)), t.complete(*held(t, 1), result=None)),
    }
    for code, call in cases.items():
        local, remote = both(q, rq, call)
        assert type(local) is type(remote) and local.code == remote.code == code, (code, local, remote)
    # a worker token may read only its own workers' tasks (403); a viewer sees not_found
    local, remote = both(q, svc.remote(svc.token("viewer")), lambda t: t.get(10**9))
    assert type(local) is type(remote) is leaseq.NotFound and local.code == remote.code == "not_found"
    q.pause("default")
    local, remote = both(q, rq, lambda t: t.begin_effect(*held(t), "mail.send", key="k1"))
    assert type(local) is type(remote) is leaseq.QueuePaused
