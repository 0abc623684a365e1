"""OpenTelemetry spans of a real worker run, collected with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

import leaseq

trace = pytest.importorskip("opentelemetry.trace")
from opentelemetry.trace import StatusCode  # noqa: E402

# the ``spans`` fixture (the SDK's in-memory exporter) is in conftest.py


def make_app(q: leaseq.Queue) -> leaseq.App:
    app = leaseq.App(queue=q)
    tracer = trace.get_tracer("handlers")

    @app.task("agent", effect="side_effect", lease_seconds=5)
    async def agent(ctx, n: int):
        with tracer.start_as_current_span("model call"):  # the handler's own span nests under the run
            pass
        async with ctx.effect("tool.call", key=f"call:{n}") as fx:
            await fx.arecord({"n": n})
        return n

    @app.task("sync_agent", effect="side_effect", lease_seconds=5)
    def sync_agent(ctx, n: int):
        with tracer.start_as_current_span("sync model call"):
            pass
        with ctx.effect("tool.call", key=f"sync:{n}") as fx:
            fx.record({"n": n})
        with pytest.raises(RuntimeError), ctx.effect("tool.broken", key=f"broken:{n}"):
            raise RuntimeError("the tool timed out")
        return n

    @app.task("boom")
    def boom(ctx):
        raise leaseq.Permanent("cannot summarize an empty document")

    return app


def test_spans_of_a_worker_run(q, spans):
    app = make_app(q)
    tasks = {"agent": app.definitions["agent"].enqueue(n=1).id,
             "sync_agent": app.definitions["sync_agent"].enqueue(n=2).id,
             "boom": app.definitions["boom"].enqueue().id}
    stats = app.run_worker(until_idle=True, install_signals=False, name="traced")
    assert (stats.completed, stats.failed) == (2, 1)
    finished = spans.get_finished_spans()
    by_name: dict[str, list] = {}
    for s in finished:
        by_name.setdefault(s.name, []).append(s)

    # The caller's side: one enqueue span per task, naming it.
    enqueued = {s.attributes["leaseq.task_id"]: s for s in finished if s.name.startswith("leaseq.enqueue ")}
    assert set(enqueued) == set(tasks.values())
    assert enqueued[tasks["agent"]].kind == trace.SpanKind.PRODUCER
    assert enqueued[tasks["agent"]].attributes["leaseq.kind"] == "agent"

    worker_id = None
    for kind, task_id in tasks.items():
        [claim] = [s for s in by_name[f"leaseq.claim {kind}"] if s.attributes["leaseq.task_id"] == task_id]
        [run] = [s for s in by_name[f"leaseq.run {kind}"] if s.attributes["leaseq.task_id"] == task_id]
        assert run.parent is not None and run.parent.span_id == claim.context.span_id
        assert run.context.trace_id == claim.context.trace_id
        assert claim.start_time <= claim.end_time <= run.start_time <= run.end_time
        for span in (claim, run):
            attrs = span.attributes
            assert (attrs["leaseq.kind"], attrs["leaseq.generation"], attrs["leaseq.attempt"]) == (kind, 1, 1)
            assert attrs["leaseq.worker"].startswith("traced-")
            worker_id = worker_id or attrs["leaseq.worker"]
            assert attrs["leaseq.worker"] == worker_id
        assert run.attributes["leaseq.duration"] >= 0
        children = [s for s in finished if s.parent is not None and s.parent.span_id == run.context.span_id]
        if kind == "boom":
            assert run.attributes["leaseq.outcome"] == "failed"
            assert run.status.status_code is StatusCode.ERROR
            [event] = [e for e in run.events if e.name == "exception"]
            assert event.attributes["exception.type"].endswith("Permanent")
            assert "empty document" in event.attributes["exception.message"]
            assert children == []
            continue
        assert run.attributes["leaseq.outcome"] == "completed"
        assert run.status.status_code is not StatusCode.ERROR
        names = sorted(s.name for s in children)
        if kind == "agent":
            assert names == ["leaseq.effect tool.call", "model call"]
        else:  # a sync handler: its thread runs in the attempt's context too
            assert names == ["leaseq.effect tool.broken", "leaseq.effect tool.call", "sync model call"]
            [broken] = [s for s in children if s.name == "leaseq.effect tool.broken"]
            assert broken.status.status_code is StatusCode.ERROR
            assert any(e.attributes.get("exception.message") == "the tool timed out" for e in broken.events)
        [effect] = [s for s in children if s.name == "leaseq.effect tool.call"]
        assert effect.attributes["leaseq.action"] == "tool.call"
        assert effect.attributes["leaseq.task_id"] == task_id and effect.attributes["leaseq.replayed"] is False
        assert effect.status.status_code is not StatusCode.ERROR


def test_a_lost_lease_ends_the_run_span_as_an_error(q, spans):
    app = leaseq.App(queue=q)

    @app.task("held", lease_seconds=2)
    def held(ctx):
        q.cancel(ctx.task_id, "taken away")  # the next renewal is refused
        while True:
            ctx.pause(0.05)

    task_id = held.enqueue().id
    stats = app.run_worker(until_idle=True, install_signals=False)
    assert stats.lost == 1
    [run] = [s for s in spans.get_finished_spans() if s.name == "leaseq.run held"]
    assert run.attributes["leaseq.task_id"] == task_id and run.attributes["leaseq.outcome"] == "lost"
    assert run.status.status_code is StatusCode.ERROR
    [event] = [e for e in run.events if e.name == "lease lost"]
    assert "heartbeat refused" in event.attributes["reason"]


def test_works_without_opentelemetry(tmp_path):
    """Without the package: no spans, and the worker, the effects and enqueue all work."""
    script = textwrap.dedent(f'''
        import sys
        sys.modules["opentelemetry"] = None   # as if it were not installed
        import leaseq
        from leaseq.observability import tracing
        assert not tracing.enabled()
        app = leaseq.App("sqlite:///{tmp_path / 'q.db'}")

        @app.task("agent", effect="side_effect")
        def agent(ctx, n):
            with ctx.effect("tool.call", key=str(n)) as fx:
                fx.record(n)
            return n

        ids = [agent.enqueue(n=i).id for i in range(3)]
        stats = app.run_worker(until_idle=True)
        assert stats.completed == 3, stats
        assert [app.queue.get(i).result for i in ids] == [0, 1, 2]
        # no trace to carry, unless one is given (stored all the same)
        assert [app.queue.get(i).trace_context for i in ids] == [None, None, None]
        given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        assert app.queue.enqueue("agent", {{"n": 9}}, trace_context=given).trace_context == given
        print("ok")
    ''')
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_importing_leaseq_does_not_import_opentelemetry():
    """Spans cost nothing, not even an import, until the application sets OpenTelemetry up."""
    script = ("import sys, leaseq, leaseq.worker, leaseq.client\n"
              "assert not [m for m in sys.modules if m.startswith('opentelemetry')], sys.modules.keys()\n"
              "print('ok')")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_a_task_claimed_ahead_marks_where_its_handler_began(q, spans):
    """With prefetch, a task may wait leased for a handler slot: its run span begins at the
    claim, and an event marks where its handler began."""
    app = leaseq.App(queue=q)

    @app.task("step", lease_seconds=5)
    async def step(ctx):
        await asyncio.sleep(0.6)

    step.enqueue(), step.enqueue()
    stats = app.run_worker(until_idle=True, install_signals=False, concurrency=1, prefetch=1)
    assert stats.completed == 2
    runs = [s for s in spans.get_finished_spans() if s.name == "leaseq.run step"]
    waits = sorted(event.timestamp - run.start_time for run in runs for event in run.events
                   if event.name == "leaseq.handler_started")
    assert len(waits) == 2
    # one began at once (a loaded machine may take a tenth of a second or more to start it); the
    # other waited, leased, for the first one's 0.6 s handler
    assert waits[0] < 0.3e9 and waits[1] >= 0.55e9, waits
