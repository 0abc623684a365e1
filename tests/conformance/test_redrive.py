"""Dead letters and redrive: bulk requeue and bulk cancel by filter (status, kind,
queue, error text, age), each task moved by the single action's path in one
transaction, audited, with a dry run that counts. Both backends."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq import InvalidInput, LeaseLost, auth


def _dead(q: leaseq.Queue, w: leaseq.Worker, kind: str, error: str, queue: str = "default") -> int:
    t = q.enqueue(kind, queue=queue, max_attempts=1)
    [c] = q.claim(w, queue=queue, kinds=[kind])
    q.fail(w, c, error, retry=False)
    assert q.get(t.id).status == "dead"
    return t.id


def test_redrive_requeues_dead_letters_matching_the_filter_with_a_dry_run_first(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    rate = [_dead(q, w, "mail", "HTTP 429 Too Many Requests") for _ in range(3)]
    other = _dead(q, w, "mail", "invalid address")
    elsewhere = _dead(q, w, "mail", "http 429", queue="bulk")
    report = _dead(q, w, "report", "HTTP 429")
    counted = q.redrive(kind="mail", error="http 429", queue="default", dry_run=True)
    assert (counted["matched"], counted["task_ids"], counted["dry_run"]) == (3, rate, True)
    assert all(q.get(i).status == "dead" for i in rate)  # a dry run changes nothing
    assert [e["action"] for e in auth.audit_log(q)].count("redrive") == 0
    done = q.redrive(kind="mail", error="http 429", queue="default", note="provider recovered", by="ops")
    assert (done["matched"], done["task_ids"], done["skipped"], done["dry_run"]) == (3, rate, [], False)
    for i in rate:
        t = q.get(i)
        assert (t.status, t.attempts) == ("queued", 0)
        assert [e.type for e in q.events(i)][-1] == "requeued"
    assert {q.get(i).status for i in (other, elsewhere, report)} == {"dead"}
    log = auth.audit_log(q)
    summary = next(e for e in log if e["action"] == "redrive")
    assert summary["actor"] == "ops" and summary["detail"]["matched"] == 3
    assert summary["detail"]["filter"] == {"statuses": ["dead"], "queue": "default", "kind": "mail",
                                           "error": "http 429"}
    assert [e["action"] for e in log].count("requeue") == 3  # and each task's own entry


def test_redrive_by_age_and_blocked_tasks(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    old = _dead(q, w, "job", "boom")
    time.sleep(0.3)
    new = _dead(q, w, "job", "boom")
    assert q.redrive(older_than=0.2, dry_run=True)["task_ids"] == [old]
    t = q.enqueue("job", queue="creds")
    [c] = q.claim(w, queue="creds")
    q.fail(w, c, "token revoked", block=True)
    moved = q.redrive(status=["dead", "blocked"], limit=2)
    assert moved["task_ids"] == [old, new] and moved["more"] is True
    moved = q.redrive(status=["dead", "blocked"])
    assert moved["task_ids"] == [t.id] and q.get(t.id).status == "queued"
    assert [e.type for e in q.events(t.id)][-1] == "unblocked"


def test_cancel_where_cancels_through_the_cancellation_path(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    queued = [q.enqueue("scrape", {"n": n}).id for n in range(3)]
    keep = q.enqueue("index").id
    running = q.enqueue("scrape", {"n": "r"}, queue="live")
    [c] = q.claim(w, queue="live")
    assert q.cancel_where(status="queued", kind="scrape", dry_run=True)["matched"] == 3
    done = q.cancel_where(status=["queued", "running"], kind="scrape", reason="site gone", by="ops")
    assert sorted(done["task_ids"]) == sorted([*queued, running.id])
    assert all(q.get(i).status == "cancelled" for i in done["task_ids"])
    assert q.get(keep).status == "queued"
    with pytest.raises(LeaseLost):  # the running one's holder is fenced
        q.complete(w, c, "late")
    ev = [e for e in q.events(running.id) if e.type == "cancelled"][0]
    assert ev.detail["revoked_lease_of"] == w.id and ev.detail["reason"] == "site gone"
    assert next(e for e in auth.audit_log(q) if e["action"] == "cancel_where")["detail"]["moved"] == 4


def test_bad_filters_name_their_field_and_change_nothing(q: leaseq.Queue) -> None:
    q.enqueue("job")
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("redrive", dict(status="queued"), "status"),
        ("redrive", dict(status=[]), "status"),
        ("redrive", dict(queue="no spaces"), "queue"),
        ("redrive", dict(older_than=-1), "older_than"),
        ("redrive", dict(limit=0), "limit"),
        ("redrive", dict(limit=10**6), "limit"),
        ("redrive", dict(error=""), "error"),
        ("redrive", dict(dry_run="yes"), "dry_run"),
        ("redrive", dict(note=""), "note"),
        ("cancel_where", dict(status="completed"), "status"),
        ("cancel_where", dict(status="queued", reason=""), "reason"),
    ]
    for method, options, field in cases:
        with pytest.raises(InvalidInput) as err:
            getattr(q, method)(**options)
        assert err.value.field == field, (method, options)
    assert q.list_tasks()[0].status == "queued"


def test_a_redrive_racing_workers_and_another_redrive_moves_each_task_once(dsn: str, q: leaseq.Queue) -> None:
    """Two redrives at once over the same dead letters, while workers claim what comes back:
    each task is requeued by exactly one of them."""
    w = q.register_worker("w")
    for round_ in range(3):
        ids = [_dead(q, w, "job", f"boom {round_}") for _ in range(20)]
        barrier = threading.Barrier(2)
        results: list[dict[str, Any]] = []

        def redriver() -> None:
            with leaseq.connect(dsn) as mine:
                barrier.wait()
                results.append(mine.redrive(error=f"boom {round_}"))

        threads = [threading.Thread(target=redriver) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        moved = sorted(i for r in results for i in r["task_ids"])
        assert moved == ids  # each once, between them
        for i in ids:
            assert [e.type for e in q.events(i)].count("requeued") == 1
        for c in q.claim(w, limit=50):
            q.complete(w, c)
