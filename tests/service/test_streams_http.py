"""GET /v1/tasks/{id}/stream: a task's stream as server-sent events, on both backends.

Each entry is an event whose ``id:`` is its cursor; a reader resumes with ``Last-Event-ID``
(or ``after``) and sees no entry twice; the same readers who may read the task may read its
stream (items redacted for a token that may not read payloads); one response is bounded in
entries and in time (then ``event: reconnect``), and counts among its token's waiting requests.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

import leaseq
from leaseq.client import AsyncRemoteQueue
from leaseq.service.wire import SseReader

from .conftest import Service, serve
from .support import error_of


def _events(client: httpx.Client, task_id: int, **options: Any) -> list[tuple[str, int | None, Any]]:
    """Every event of one response, read to its end."""
    headers = options.pop("headers", {})
    reader = SseReader()
    out: list[tuple[str, int | None, Any]] = []
    with client.stream("GET", f"/v1/tasks/{task_id}/stream", params=options, headers=headers) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for chunk in resp.iter_raw():
            out.extend(reader.feed(chunk))
    return out


def _running(q: leaseq.Queue, *items: Any) -> tuple[leaseq.Worker, leaseq.Claim]:
    w = q.register_worker("w")
    queue = f"s-{time.monotonic_ns()}"  # a queue of its own: the claim takes this very task
    q.enqueue("agent", {"secret": "s3cr3t"}, queue=queue)
    [claim] = q.claim(w, queue=queue)
    for item in items:
        q.emit(w, claim, item)
    return w, claim


def test_entries_are_events_whose_ids_are_cursors_and_a_reader_resumes_with_last_event_id(svc: Service) -> None:
    q = svc.q
    w, claim = _running(q, {"step": 1}, {"step": 2})
    viewer = svc.http(svc.token("viewer", read_payloads=True))
    events = _events(viewer, claim.task_id, follow="false")
    assert [(e, i) for e, i, _ in events] == [("reset", 1), ("item", 2), ("item", 3), ("end", None)]
    assert events[1][2] == {"task_id": claim.task_id, "seq": 2, "generation": 1, "type": "item",
                            "item": {"step": 1}, "durable": False, "at": events[1][2]["at"]}
    assert events[-1][2] == {"task_id": claim.task_id, "status": "running", "settled": False, "after": 3}
    q.emit(w, claim, {"step": 3})
    # the browser's reconnection: Last-Event-ID wins over the URL's after
    resumed = _events(viewer, claim.task_id, follow="false", after="0", headers={"Last-Event-ID": "2"})
    assert [(e, i) for e, i, _ in resumed] == [("item", 3), ("item", 4), ("end", None)]
    assert [i for _, i, _ in _events(viewer, claim.task_id, follow="false", after="3")] == [4, None]
    q.complete(w, claim, None)
    assert _events(viewer, claim.task_id, after="4")[-1] == (
        "end", None, {"task_id": claim.task_id, "status": "completed", "settled": True, "after": 4})


def test_a_reader_follows_live_and_ends_with_the_task(svc: Service) -> None:
    q = svc.q
    w, claim = _running(q)
    viewer = svc.http(svc.token("viewer", read_payloads=True))
    got: list[tuple[str, int | None, Any]] = []
    first = threading.Event()

    def read() -> None:
        reader = SseReader()
        with viewer.stream("GET", f"/v1/tasks/{claim.task_id}/stream") as resp:
            for chunk in resp.iter_raw():
                for event in reader.feed(chunk):
                    got.append(event)
                    first.set()

    thread = threading.Thread(target=read)
    thread.start()
    q.emit(w, claim, "live")
    assert first.wait(10)
    q.complete(w, claim, None)
    thread.join(10)
    assert not thread.is_alive()
    assert [(e, d.get("item")) for e, _, d in got] == [("reset", None), ("item", "live"), ("end", None)]


def test_the_readers_of_the_task_read_its_stream_and_no_one_else(svc: Service) -> None:
    q = svc.q
    worker_token = svc.token("worker", all_queues=True)
    worker_http = svc.http(worker_token)
    wid = worker_http.post("/v1/workers", json={"name": "own"}).json()["id"]
    task = q.enqueue("agent", {"secret": "s3cr3t"}, queue="own")
    [claim] = q.claim(wid, queue="own")
    q.emit(wid, claim, {"secret": "s3cr3t"})
    # a plain viewer: the entries, the items redacted (it may not read payloads)
    plain = _events(svc.http(svc.token("viewer")), task.id, follow="false")
    assert [d.get("item") for e, _, d in plain if e == "item"] == ["[redacted]"]
    # the worker token whose worker holds the task reads it; another worker token does not
    assert [e for e, _, _ in _events(worker_http, task.id, follow="false")] == ["reset", "item", "end"]
    stranger = svc.http(svc.token("worker", "stranger", all_queues=True))
    resp = stranger.get(f"/v1/tasks/{task.id}/stream", params={"follow": "false"})
    assert resp.status_code == 403 and error_of(resp)["code"] == "forbidden"
    # a token limited to another queue: refused as a task that does not exist would be
    scoped = svc.http(svc.token("viewer", queues=["elsewhere"]))
    assert scoped.get(f"/v1/tasks/{task.id}/stream").status_code == 403
    assert svc.http().get(f"/v1/tasks/{task.id}/stream").status_code == 401
    q.complete(wid, claim, None)


def test_bad_cursors_are_refused_naming_the_field(svc: Service) -> None:
    q = svc.q
    w, claim = _running(q, 1)
    viewer = svc.http(svc.token("viewer"))
    for params, headers, field in (({"after": "x"}, {}, "after"), ({"after": "-1"}, {}, "after"),
                                   ({"after": "9" * 30}, {}, "after"), ({}, {"Last-Event-ID": "abc"}, "Last-Event-ID"),
                                   ({"follow": "maybe"}, {}, "follow"), ({"timeout": "-1"}, {}, "timeout")):
        resp = viewer.get(f"/v1/tasks/{claim.task_id}/stream", params=params, headers=headers)
        assert resp.status_code == 422, (params, headers, resp.text)
        assert field in error_of(resp)["field"], (field, resp.text)
    resp = viewer.get("/v1/tasks/999999/stream")
    assert resp.status_code == 404 and error_of(resp)["code"] == "not_found"
    q.complete(w, claim, None)


def test_one_response_is_bounded_and_the_client_asks_again_after_its_last_entry(q: leaseq.Queue, dsn: str) -> None:
    with serve(q, stream_items=3, stream_seconds=0.5) as (url, app):
        svc = Service(url, app, q, dsn)
        try:
            w, claim = _running(q, *range(7))
            viewer = svc.http(svc.token("viewer", read_payloads=True))
            capped = _events(viewer, claim.task_id, follow="false")
            assert [(e, i) for e, i, _ in capped] == [("reset", 1), ("item", 2), ("item", 3), ("reconnect", None)]
            assert capped[-1][2] == {"after": 3}
            started = time.monotonic()
            quiet = _events(viewer, claim.task_id, after="8")  # following, nothing comes: its time is up
            assert [e for e, _, _ in quiet] == ["reconnect"] and time.monotonic() - started < 10
            # RemoteQueue asks again after each response's last entry: every entry, once, in order
            remote = svc.remote(svc.token("viewer", read_payloads=True))
            q.complete(w, claim, None)
            assert [e.item for e in remote.stream(claim.task_id)] == [None, *range(7)]
            assert [e.seq for e in remote.stream(claim.task_id, after=5)] == [6, 7, 8]
            with pytest.raises(leaseq.NotFound):
                list(remote.stream(10**9))
            with pytest.raises(leaseq.InvalidInput) as bad:
                remote.stream(claim.task_id, after=-2)
            assert bad.value.field == "after"
        finally:
            svc.close()


def test_a_stream_is_one_of_its_tokens_waiting_requests(q: leaseq.Queue, dsn: str) -> None:
    with serve(q, waits_per_token=1) as (url, app):
        svc = Service(url, app, q, dsn)
        try:
            w, claim = _running(q)
            token = svc.token("viewer")
            holder = svc.http(token)
            opened = threading.Event()
            done = threading.Event()

            def hold() -> None:
                with holder.stream("GET", f"/v1/tasks/{claim.task_id}/stream") as resp:
                    for _ in resp.iter_raw():
                        opened.set()
                done.set()

            thread = threading.Thread(target=hold)
            thread.start()
            assert opened.wait(10)
            resp = svc.http(token).get(f"/v1/tasks/{claim.task_id}/stream")
            assert resp.status_code == 429 and error_of(resp)["code"] == "rate_limited"
            assert "retry-after" in resp.headers
            q.complete(w, claim, None)  # the held stream ends with its task
            assert done.wait(10)
            thread.join(10)
        finally:
            svc.close()


def test_the_timeline_gives_the_streams_size_per_attempt(svc: Service) -> None:
    q = svc.q
    w, first = _running(q, {"step": 1})
    q.emit(w, first, {"step": 2}, key=f"{first.task.idempotency_key}:emit:0")  # durable: kept across the reset
    q.fail(w, first, "boom", delay=0)
    [second] = q.claim(w, queue=first.task.queue)
    q.emit(w, second, {"step": 1})
    view = svc.http(svc.token("viewer")).get(f"/v1/tasks/{first.task_id}/timeline").json()
    sizes = {a["generation"]: a["stream"] for a in view["attempts"]}
    assert {g: (s["items"], s["durable"]) for g, s in sizes.items()} == {1: (2, 1), 2: (1, 0)}
    assert sizes[2]["first_seq"] > sizes[1]["last_seq"] and sizes[1]["first_at"] <= sizes[1]["last_at"]
    stats = q.stream_stats(first.task_id)
    assert view["stream"] == {"items": 3, "durable": 1, "last_seq": stats["last_seq"]}
    assert [(a["generation"], a["items"], a["first_seq"], a["last_seq"]) for a in stats["attempts"]] == \
        [(g, s["items"], s["first_seq"], s["last_seq"]) for g, s in sorted(sizes.items())]
    # a task that emitted nothing: no attempt has a stream, and its size is zero
    quiet = q.enqueue("quiet")
    view = svc.http(svc.token("viewer")).get(f"/v1/tasks/{quiet.id}/timeline").json()
    assert view["stream"] == {"items": 0, "durable": 0, "last_seq": 0} and view["attempts"] == []


def test_async_remote_queue_follows_a_stream_as_remote_queue_does(svc: Service) -> None:
    q = svc.q
    w, claim = _running(q, {"step": 1})
    token = svc.token("viewer", read_payloads=True)

    async def read() -> tuple[list[Any], list[int], list[Any]]:
        async with AsyncRemoteQueue(svc.url, token, timeout=10) as arq:
            live: list[Any] = []
            async for entry in arq.stream(claim.task_id):  # follows until the task ends
                live.append((entry.type, entry.item))
                if entry.item == {"step": 1}:
                    await asyncio.to_thread(q.emit, w, claim, {"step": 2})
                elif entry.item == {"step": 2}:
                    await asyncio.to_thread(q.complete, w, claim, None)
            resumed = [e.seq async for e in arq.stream(claim.task_id, after=2)]
            with pytest.raises(leaseq.InvalidInput) as bad:
                arq.stream(claim.task_id, after=-1)  # checked at the call, as RemoteQueue does
            assert bad.value.field == "after"
            with pytest.raises(leaseq.NotFound):
                [e async for e in arq.stream(10**9)]
            # left early while following a live task: closed, nothing hangs
            other_w, other = _running(q, "a", "b")
            early = arq.stream(other.task_id)
            first = [(await anext(early)).type, (await anext(early)).type, (await anext(early)).item]
            with pytest.raises(asyncio.TimeoutError):  # cancelled while a thread waits for the next entry
                await asyncio.wait_for(anext(early), 0.3)
            await early.aclose()
            await asyncio.to_thread(q.complete, other_w, other, None)
            return live, resumed, first

    live, resumed, first = asyncio.run(asyncio.wait_for(read(), 30))
    assert live == [("reset", None), ("item", {"step": 1}), ("item", {"step": 2})]
    assert resumed == [3]
    assert first == ["reset", "item", "b"]

