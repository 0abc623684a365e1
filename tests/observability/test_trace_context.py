"""A task carries its caller's trace: enqueue, claim, handler and effect spans in one trace.

Collected with the OpenTelemetry SDK's in-memory exporter (the ``spans``
fixture), directly on both backends and through a real ``leaseq serve``
(uvicorn on loopback) with RemoteQueue on both sides: the client sends the
W3C ``traceparent`` header, the service stores it in the task, the claim
returns it, and the worker starts the task's spans under it.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

import leaseq
from leaseq import auth
from leaseq.client import AsyncRemoteQueue, RemoteQueue
from leaseq.observability.tracing import traceparent

from service.conftest import serve

trace = pytest.importorskip("opentelemetry.trace")

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def agent_app(q: leaseq.Queue) -> leaseq.App:
    app = leaseq.App(queue=q)

    @app.task("agent", effect="side_effect", lease_seconds=10)
    async def agent(ctx, n: int):
        async with ctx.effect("tool.call", key=f"call:{n}") as fx:
            await fx.arecord({"n": n})
        return n

    return app


def one_trace(finished: list, task_id: int) -> dict[str, object]:
    """The task's spans by name, checked to form one chain in one trace."""
    named = {}
    for s in finished:
        if s.attributes.get("leaseq.task_id") == task_id:
            named.setdefault(s.name, []).append(s)
    [claim], [run], [effect] = named["leaseq.claim agent"], named["leaseq.run agent"], named["leaseq.effect tool.call"]
    assert run.parent.span_id == claim.context.span_id
    assert effect.parent.span_id == run.context.span_id
    assert len({claim.context.trace_id, run.context.trace_id, effect.context.trace_id}) == 1
    return {"claim": claim, "run": run, "effect": effect, "enqueue": named.get("leaseq.enqueue agent", [])}


def test_a_task_joins_the_trace_that_enqueued_it(q, spans):
    app = agent_app(q)
    tracer = trace.get_tracer("caller")
    with tracer.start_as_current_span("web request") as request:
        task = app.definitions["agent"].enqueue(n=1)
    [enqueue] = [s for s in spans.get_finished_spans() if s.name == "leaseq.enqueue agent"]
    assert enqueue.parent.span_id == request.get_span_context().span_id
    assert task.trace_context == traceparent(enqueue) == q.get(task.id).trace_context
    stats = app.run_worker(until_idle=True, install_signals=False, name="traced")
    assert stats.completed == 1
    chain = one_trace(spans.get_finished_spans(), task.id)
    assert chain["claim"].parent.span_id == enqueue.context.span_id
    assert chain["claim"].context.trace_id == request.get_span_context().trace_id


def test_the_async_queue_stores_the_trace_too(q, spans):
    async def go() -> leaseq.Task:
        aq = leaseq.AsyncQueue(q)
        with trace.get_tracer("caller").start_as_current_span("async request"):
            return await aq.enqueue("agent", {"n": 2})
    task = asyncio.run(go())
    [enqueue] = [s for s in spans.get_finished_spans() if s.name == "leaseq.enqueue agent"]
    assert q.get(task.id).trace_context == traceparent(enqueue)


def test_a_given_trace_context_is_stored_as_given_and_a_bad_one_refused(q, spans):
    task = q.enqueue("agent", {"n": 3}, trace_context=CALLER)
    assert q.get(task.id).trace_context == CALLER
    [enqueue] = [s for s in spans.get_finished_spans() if s.name == "leaseq.enqueue agent"]
    assert f"{enqueue.parent.span_id:016x}" == CALLER.split("-")[2]  # the given context parents the span
    before = len(q.list_tasks())
    for bad in ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", "nonsense",
                "00-00000000000000000000000000000000-b7ad6b7169203331-01", 42):
        with pytest.raises(leaseq.InvalidInput) as err:
            q.enqueue("agent", {"n": 4}, trace_context=bad)
        assert err.value.field == "trace_context"
    assert len(q.list_tasks()) == before  # nothing written


def test_over_http_the_traceparent_header_carries_the_trace(q, spans):
    with serve(q) as (url, _app):
        operator, _ = auth.create_token(q, name="caller", role="operator")
        worker_token, _ = auth.create_token(q, name="agent-worker", role="worker", all_queues=True)
        caller = RemoteQueue(url, operator)
        remote = RemoteQueue(url, worker_token)
        try:
            with trace.get_tracer("caller").start_as_current_span("web request") as request:
                task = caller.enqueue("agent", {"n": 6}, effect="side_effect")
            finished = spans.get_finished_spans()
            # the client's enqueue span, and the service's own under it (same process here)
            client_side = [s for s in finished if s.name == "leaseq.enqueue agent"
                           and s.parent.span_id == request.get_span_context().span_id]
            assert len(client_side) == 1
            assert task.trace_context == traceparent(client_side[0]) == q.get(task.id).trace_context
            app = agent_app(q)
            runtime = app.worker(transport=remote, concurrency=2, poll_interval=0.05, name="remote-traced")
            stats = asyncio.run(runtime.run(until_idle=True))
            assert stats.completed == 1
            # the service's own span of each claim request, named for the worker that asked
            served = [s for s in spans.get_finished_spans() if s.instrumentation_scope.name == "leaseq.service"]
            claims = [s for s in served if s.name == "leaseq.claim"]
            assert claims and {s.attributes["worker_id"] for s in claims} == {runtime.worker.id}
            chain = one_trace(spans.get_finished_spans(), task.id)
            assert chain["claim"].parent.span_id == client_side[0].context.span_id
            assert chain["run"].context.trace_id == request.get_span_context().trace_id
            # A raw request: a valid header is stored as sent, an invalid one ignored (W3C Trace Context).
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {operator}"}) as http:
                sent = http.post("/v1/tasks", json={"kind": "agent", "payload": {"n": 7}},
                                 headers={"traceparent": CALLER})
                assert sent.status_code == 201 and sent.json()["trace_context"] == CALLER
                ignored = http.post("/v1/tasks", json={"kind": "agent", "payload": {"n": 8}},
                                    headers={"traceparent": "00-zz-bad-01"})
                assert ignored.status_code == 201
                assert q.get(ignored.json()["id"]).trace_context != "00-zz-bad-01"
            # the claim hands the stored context to a remote worker
            w = remote.register_worker("reader")
            claimed = {c.task_id: c.task.trace_context for c in remote.claim(w, limit=5)}
            assert claimed[sent.json()["id"]] == CALLER
        finally:
            caller.close()
            remote.close()


def _many_spans(finished: list) -> list:
    return [s for s in finished if s.name == "leaseq.enqueue_many agent"]


def test_enqueue_many_has_one_span_for_the_batch_and_its_tasks_join_its_trace(q, spans):
    """One ``leaseq.enqueue_many {kind}`` span per call (its queue, kind and count), under the
    caller's span; every task written carries its trace context, so their claims nest under it.
    The payloads may be an iterator: counted and written alike."""
    with trace.get_tracer("caller").start_as_current_span("web request") as request:
        ids = q.enqueue_many("agent", ({"n": n} for n in range(3)), effect="side_effect")
    finished = spans.get_finished_spans()
    [many] = _many_spans(finished)
    assert not [s for s in finished if s.name == "leaseq.enqueue agent"]  # not a span per task
    assert many.kind == trace.SpanKind.PRODUCER and many.parent.span_id == request.get_span_context().span_id
    assert dict(many.attributes) == {"leaseq.kind": "agent", "leaseq.queue": "default", "leaseq.count": 3}
    assert len(ids) == 3 and {q.get(i).trace_context for i in ids} == {traceparent(many)}
    stats = agent_app(q).run_worker(until_idle=True, install_signals=False, name="batch-traced")
    assert stats.completed == 3
    for task_id in ids:
        chain = one_trace(spans.get_finished_spans(), task_id)
        assert chain["claim"].parent.span_id == many.context.span_id
        assert chain["run"].context.trace_id == request.get_span_context().trace_id


def test_the_async_enqueue_many_has_its_span_and_a_given_context_parents_it(q, spans):
    async def go() -> tuple[list[int], list[int]]:
        aq = leaseq.AsyncQueue(q)
        with trace.get_tracer("caller").start_as_current_span("async request"):
            mine = await aq.enqueue_many("agent", [{"n": 1}, {"n": 2}])
        return mine, await aq.enqueue_many("agent", [{"n": 3}], queue="given", trace_context=CALLER)
    mine, given = asyncio.run(go())
    own, passed = sorted(_many_spans(spans.get_finished_spans()), key=lambda s: s.attributes["leaseq.count"],
                         reverse=True)
    assert (own.attributes["leaseq.count"], own.attributes["leaseq.queue"]) == (2, "default")
    assert {q.get(i).trace_context for i in mine} == {traceparent(own)}
    assert (passed.attributes["leaseq.count"], passed.attributes["leaseq.queue"]) == (1, "given")
    assert q.get(given[0]).trace_context == CALLER  # stored as given, and it parents the span
    assert f"{passed.parent.span_id:016x}" == CALLER.split("-")[2]


def test_a_refused_enqueue_many_ends_its_span_as_an_error(q, spans):
    with pytest.raises(leaseq.InvalidInput) as err:
        q.enqueue_many("agent", [{"n": 1}, {"n": 2}], idempotency_keys=["only-one"])
    assert err.value.field == "idempotency_keys"
    [many] = _many_spans(spans.get_finished_spans())
    assert many.status.status_code == trace.StatusCode.ERROR and many.attributes["leaseq.count"] == 2
    assert q.list_tasks() == []


def test_over_http_enqueue_many_sends_its_span_as_the_traceparent(q, spans):
    with serve(q) as (url, _app):
        operator, _ = auth.create_token(q, name="caller", role="operator")
        caller = RemoteQueue(url, operator)
        try:
            with trace.get_tracer("caller").start_as_current_span("web request") as request:
                ids = caller.enqueue_many("agent", [{"n": n} for n in range(4)], queue="remote")
        finally:
            caller.close()
        many = _many_spans(spans.get_finished_spans())

        async def awaited() -> list[int]:
            aremote = AsyncRemoteQueue(url, operator)
            try:
                return await aremote.enqueue_many("agent", [{"n": 9}], queue="awaited")
            finally:
                await aremote.close_async()
        spans.clear()
        [awaited_id] = asyncio.run(awaited())
        [sent, _served] = sorted(_many_spans(spans.get_finished_spans()), key=lambda s: s.start_time)
        assert sent.parent is None and sent.attributes["leaseq.queue"] == "awaited"
        assert q.get(awaited_id).trace_context == traceparent(sent)
    # the client's span, and the service's own under it (same process here), each counting the batch
    [client_side] = [s for s in many if s.parent.span_id == request.get_span_context().span_id]
    [served] = [s for s in many if s.parent.span_id == client_side.context.span_id]
    for span in (client_side, served):
        assert (span.attributes["leaseq.count"], span.attributes["leaseq.queue"]) == (4, "remote")
    assert {q.get(i).trace_context for i in ids} == {traceparent(client_side)}


def test_the_awaited_remote_enqueue_has_its_span_and_sends_it_as_the_traceparent(q, spans):
    """``AsyncRemoteQueue.enqueue`` makes the ``leaseq.enqueue`` span ``RemoteQueue.enqueue``
    makes, under the caller's, and the task carries it."""
    with serve(q) as (url, _app):
        operator, _ = auth.create_token(q, name="caller", role="operator")

        async def awaited() -> leaseq.Task:
            aremote = AsyncRemoteQueue(url, operator)
            try:
                with trace.get_tracer("caller").start_as_current_span("async web request"):
                    return await aremote.enqueue("agent", {"n": 1}, queue="awaited")
            finally:
                await aremote.close_async()
        task = asyncio.run(awaited())
        finished = spans.get_finished_spans()
    [request] = [s for s in finished if s.name == "async web request"]
    [sent] = [s for s in finished if s.name.startswith("leaseq.enqueue ") and s.parent is not None
              and s.parent.span_id == request.context.span_id]
    assert sent.kind == trace.SpanKind.PRODUCER and sent.attributes["leaseq.kind"] == "agent"
    assert q.get(task.id).trace_context == traceparent(sent)
