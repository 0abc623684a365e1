"""A stream's reader across a worker killed mid-stream (SIGKILL).

A reader follows a task's stream over HTTP (server-sent events) while the worker emits;
the worker is killed mid-stream and the reader's connection dropped. Reconnecting with
``Last-Event-ID`` (the last entry it got), the reader sees no entry twice, then the new
attempt's ``reset`` (generation 2) before any of its items; the durable item the killed
attempt emitted is replayed by the new attempt from the ledger, not emitted again.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import leaseq
from leaseq import auth
from leaseq.service.wire import SseReader
from leaseq_chaos.traces import validate_queue

from .support import AppWorkers, wait_for

pytest.importorskip("uvicorn")

LEASE = 2.0


@pytest.fixture
def queue(dsn: str) -> Iterator[leaseq.Queue]:
    q = leaseq.connect(dsn)
    q.migrate()
    yield q
    q.close()


Workers = AppWorkers


@pytest.fixture
def workers(dsn: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers("streams_app", dsn, tmp_path)
    yield w
    w.close()


def _read(client: httpx.Client, task_id: int, *, last_event_id: int | None, until: Any) -> list[tuple[str, Any]]:
    """Follow the stream until ``until(events)`` holds (then drop the connection) or it ends."""
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    reader = SseReader()
    got: list[tuple[str, Any]] = []
    with client.stream("GET", f"/v1/tasks/{task_id}/stream", headers=headers, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        for chunk in resp.iter_raw():
            for event, _, data in reader.feed(chunk):
                got.append((event, data))
                if event in ("end", "reconnect") or until(got):
                    return got
    return got


def test_a_reader_reconnecting_after_the_worker_was_killed_sees_no_entry_twice_and_the_new_attempts_reset(
        queue: leaseq.Queue, dsn: str, workers: Workers, tmp_path: Path) -> None:
    from service.conftest import serve  # the service tests' real uvicorn server, on a free port

    task = queue.enqueue("report", {"parts": 3}, effect="idempotent", idempotency_key="report-1",
                         lease_seconds=LEASE)
    with serve(queue) as (url, _app):
        token, _ = auth.create_token(queue, name="reader", role="viewer", created_by="test", read_payloads=True)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
            first = workers.start("first", HOLD_AT="1")
            # the reader follows the first attempt live, up to its part 1
            before = _read(client, task.id, last_event_id=None,
                           until=lambda got: any(d.get("item") == {"part": 1} for _, d in got))
            wait_for(lambda: (tmp_path / f"held-{task.id}").exists() or first.poll() is not None, 60,
                     "the first attempt held mid-stream")
            assert first.poll() is None, workers.log("first")
            first.send_signal(signal.SIGKILL)  # mid-stream, holding its lease
            first.wait(10)
            last = before[-1][1]["seq"]
            workers.start("second")  # claims once the killed attempt's lease has run out
            after: list[tuple[str, Any]] = []
            cursor = last
            while True:  # a response that ends with "reconnect" is asked again, after its last entry
                got = _read(client, task.id, last_event_id=cursor, until=lambda got: False)
                cursor = next((d["seq"] for e, d in reversed(got) if e in ("item", "reset")), cursor)
                after += [x for x in got if x[0] != "reconnect"]
                if got[-1][0] == "end":
                    break
    wait_for(lambda: queue.get(task.id).status == "completed", 60, "the task completed")
    entries = [d for e, d in before + after if e in ("item", "reset")]
    seqs = [d["seq"] for d in entries]
    assert seqs == sorted(set(seqs)) == list(range(1, len(seqs) + 1)), seqs  # each entry once, none missed
    assert [(d["generation"], d["type"], d["item"]) for d in entries] == [
        (1, "reset", None), (1, "item", {"plan": 3}), (1, "item", {"part": 0}), (1, "item", {"part": 1}),
        (2, "reset", None), (2, "item", {"part": 0}), (2, "item", {"part": 1}), (2, "item", {"part": 2})]
    resumed = [d for e, d in after if e in ("item", "reset")]
    assert resumed[0]["type"] == "reset" and resumed[0]["generation"] == 2  # the new attempt's reset first
    assert after[-1] == ("end", {"task_id": task.id, "status": "completed", "settled": True, "after": 8})
    # the durable plan: once in the stream, recorded once in the ledger, replayed by the second attempt
    assert [fx.idempotency_key for fx in queue.effects(task.id)] == ["report-1:emit:0"]
    assert [e.durable for e in queue.stream(task.id)].count(True) == 1
    assert queue.get(task.id).result == {"parts": 3}
    assert validate_queue(queue) == []
