"""Tool calls (ctx.tool, @leaseq.tool) on every transport and both backends:
replay from the ledger, divergence, and which open calls route to reconciliation."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

import leaseq
from leaseq.worker import tools
from leaseq.worker.context import TaskContext

from .support import WORKING_LEASE, run_out, snapshot, wait_expired
from .test_transports import transport  # noqa: F401  (the fixture: sync, async and HTTP transports)

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


class Calls:
    """Downstream stand-ins that count how often they really ran."""

    def __init__(self) -> None:
        self.n: dict[str, int] = {}

    def llm(self, prompt: str) -> dict[str, Any]:
        self.n["llm"] = self.n.get("llm", 0) + 1
        return {"text": f"answer to {prompt}", "tokens": 7}

    def write(self, doc: str, body: dict[str, Any]) -> dict[str, Any]:
        self.n["write"] = self.n.get("write", 0) + 1
        return {"stored": doc}

    def pay(self, amount: int) -> dict[str, Any]:
        self.n["pay"] = self.n.get("pay", 0) + 1
        return {"paid": amount}


def _attempt(q: leaseq.Queue, t: Any, w: leaseq.Worker, **claim_kw: Any) -> TaskContext:
    [claim] = t.claim(w, **claim_kw)
    return TaskContext(t, w, claim, LOG)


def _run(ctx: TaskContext, calls: Calls, prompt: str = "q1") -> list[Any]:
    llm = ctx.tool(calls.llm, action="llm.chat", effect="read_only")
    write = ctx.tool(calls.write, action="docs.put", effect="idempotent")
    pay = ctx.tool(calls.pay, action="payments.charge", effect="side_effect")
    return [llm(prompt), llm("q2"), write("d-1", body={"x": 1}), pay(5)]


def test_recorded_tool_calls_replay_on_the_next_attempt(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, effect="side_effect", idempotency_key="run-1", max_attempts=5)
    calls = Calls()
    ctx = _attempt(q, transport, w)
    first = _run(ctx, calls)
    assert calls.n == {"llm": 2, "write": 1, "pay": 1}
    entries = q.effects(task.id)
    assert [e.idempotency_key for e in entries] == ["run-1:llm.chat:0", "run-1:llm.chat:1", "run-1:docs.put:0",
                                                    "run-1:payments.charge:0"]
    assert [e.effect for e in entries] == ["read_only", "read_only", "idempotent", "side_effect"]
    assert all(e.status == "done" and e.args_digest for e in entries)
    transport.fail(w, ctx.claim, "crashed", delay=0)
    assert q.get(task.id).status == "queued"  # every call answered: nothing ambiguous
    again = _run(_attempt(q, transport, w), calls)
    assert again == first and calls.n == {"llm": 2, "write": 1, "pay": 1}  # nothing ran twice
    replayed = [e for e in q.events(task.id) if e.type == "tool_replayed"]
    assert [e.detail["idempotency_key"] for e in replayed] == [e.idempotency_key for e in entries]
    assert {e.generation for e in replayed} == {2} and {e.detail["recorded_generation"] for e in replayed} == {1}


def test_a_call_with_other_arguments_at_a_recorded_position_diverges(q: leaseq.Queue, dsn: str,
                                                                     transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, effect="side_effect", max_attempts=5)
    calls = Calls()
    ctx = _attempt(q, transport, w)
    ctx.tool(calls.llm, action="llm.chat", effect="read_only")("first prompt")
    transport.fail(w, ctx.claim, "crashed", delay=0)
    ctx2 = _attempt(q, transport, w)
    effects_before = q.effects(task.id)
    with pytest.raises(leaseq.ToolCallDiverged, match="other arguments") as caught:
        ctx2.tool(calls.llm, action="llm.chat", effect="read_only")("another prompt")
    assert caught.value.idempotency_key.endswith(":llm.chat:0") and caught.value.code == "tool_call_diverged"
    assert caught.value.recorded["args_digest"] != caught.value.requested["args_digest"]
    # nothing of the call was written or made; the attempt ended there, the task awaits a person
    assert q.effects(task.id) == effects_before and calls.n == {"llm": 1}
    ended = q.get(task.id)
    assert (ended.status, ended.lease_owner, ended.attempts) == ("needs_reconciliation", None, 1)
    assert caught.value.idempotency_key in (ended.last_error or "")
    # the attempt is over: the same position under another class is refused with the lease
    with pytest.raises(leaseq.LeaseLost):
        ctx2.tool(calls.llm, action="llm.chat", effect="idempotent").keyed("0")("first prompt")
    assert task.id == ctx2.task_id and calls.n == {"llm": 1}


def test_async_tools_and_framework_call_ids(q: leaseq.Queue, transport: Any) -> None:  # noqa: F811
    w = transport.register_worker("a")
    task = q.enqueue("agent", {}, effect="idempotent", idempotency_key="run-2", max_attempts=5)
    ran: list[str] = []

    async def lookup(city: str) -> dict[str, Any]:
        ran.append(city)
        return {"city": city, "temp": 21}

    async def attempt(ctx: TaskContext) -> list[Any]:
        look = ctx.tool(lookup, action="weather.get", effect="read_only")
        # a framework names its calls: the key is the call id, whatever order they finish in
        return [await look.keyed("call_b")("Oslo"), await look.keyed("call_a")("Rome")]

    ctx = _attempt(q, transport, w)
    first = asyncio.run(attempt(ctx))
    transport.fail(w, ctx.claim, "crashed", delay=0)
    second = asyncio.run(attempt(_attempt(q, transport, w)))
    assert first == second == [{"city": "Oslo", "temp": 21}, {"city": "Rome", "temp": 21}] and ran == ["Oslo", "Rome"]
    assert [e.idempotency_key for e in q.effects(task.id)] == ["run-2:weather.get:call_b", "run-2:weather.get:call_a"]


def _on_loop(q: leaseq.Queue, port: Any, w: leaseq.Worker, claim: leaseq.Claim) -> TaskContext:
    """The context the worker runtime makes: its port awaited on the running loop."""
    return TaskContext(port, w, claim, LOG, loop=asyncio.get_running_loop())


def test_an_async_handlers_tool_calls_are_awaited_on_the_event_loop_where_the_backend_can(
        q: leaseq.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """On PostgreSQL an async handler's tool calls (the ledger's begin and finish, an action
    token asked for again) are awaited on the handler's own event loop with the asyncio
    driver: no thread per call. SQLite, which has no asyncio driver, runs them in a thread.
    A refusal by the lease guard reaches the handler's context either way."""
    task = q.enqueue("agent", {}, effect="side_effect", actions=["crm.update"], max_attempts=5)
    w = q.register_worker("a")
    [claim] = q.claim(w)
    port = leaseq.AsyncQueue(q)
    blocking: list[str] = []
    real = q.store.transaction

    def spied(*args: Any, **kwargs: Any) -> Any:
        blocking.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(q.store, "transaction", spied)

    async def update(record: str) -> dict[str, Any]:
        return {"updated": record}

    async def attempt() -> list[Any]:
        ctx = _on_loop(q, port, w, claim)
        crm = ctx.tool(update, action="crm.update", effect="side_effect")
        first = await crm("r-1")
        async with ctx.effect("crm.update", key="by-hand") as fx:
            await fx.atoken()
            await fx.arecord({"by": "hand"})
        await port.close_async()
        return [first, fx.response]

    loop_thread: list[str] = []

    async def main() -> list[Any]:
        loop_thread.append(threading.current_thread().name)
        return await attempt()

    assert asyncio.run(main()) == [{"updated": "r-1"}, {"by": "hand"}]
    if q.native_async:
        assert blocking == []
    else:
        assert len(blocking) == 4 and loop_thread[0] not in blocking  # begin, finish, twice: each in a thread
    assert [e.status for e in q.effects(task.id)] == ["done", "done"]
    run_out(q, w, claim)
    lost: list[TaskContext] = []

    async def late() -> None:
        ctx = _on_loop(q, port, w, claim)
        lost.append(ctx)
        try:
            await ctx.tool(update, action="crm.update", effect="side_effect")("r-2")
        finally:
            await port.close_async()

    with pytest.raises(leaseq.LeaseLost):
        asyncio.run(late())
    assert lost[0].lost  # the refusal is the handler's lost lease, as for a blocking call
    assert [e.status for e in q.effects(task.id)] == ["done", "done"]


class _SlowResponses:
    """The direct port, whose finish_effect waits for ``release`` once it has begun (``writing``)."""

    def __init__(self, q: leaseq.Queue):
        self._port = leaseq.AsyncQueue(q)
        self.writing = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._port, name)

    async def finish_effect(self, *args: Any, **kwargs: Any) -> Any:
        self.writing.set()
        await self.release.wait()
        return await self._port.finish_effect(*args, **kwargs)


def test_a_response_being_recorded_when_its_handler_is_cancelled_is_still_recorded(q: leaseq.Queue) -> None:
    """A handler cancelled (a timeout) while its tool call's response is being written:
    the write goes on, so the next attempt replays the call instead of the task going to
    reconciliation with a side effect open."""
    task = q.enqueue("agent", {}, effect="side_effect", actions=["payments.charge"], max_attempts=5)
    w = q.register_worker("a")
    [claim] = q.claim(w)
    ran: list[int] = []

    async def charge(amount: int) -> dict[str, Any]:
        ran.append(amount)
        return {"charged": amount}

    async def main() -> None:
        port = _SlowResponses(q)
        ctx = _on_loop(q, port, w, claim)
        try:
            handler = asyncio.ensure_future(ctx.tool(charge, action="payments.charge")(5))
            await port.writing.wait()
            handler.cancel()  # the attempt's timeout, while the response is on its way
            with pytest.raises(asyncio.CancelledError):
                await handler
            port.release.set()
            for _ in range(500):
                if q.effects(task.id)[0].status == "done":
                    break
                await asyncio.sleep(0.01)
        finally:
            await port.close_async()

    asyncio.run(main())
    assert [e.status for e in q.effects(task.id)] == ["done"] and ran == [5]
    q.fail(w, claim, "timeout", delay=0)
    assert q.get(task.id).status == "queued"  # nothing ambiguous: not sent to reconciliation
    ctx2 = _attempt(q, q, w)
    assert asyncio.run(_call(ctx2, charge)) == {"charged": 5} and ran == [5]  # replayed, not charged again


async def _call(ctx: TaskContext, fn: Any) -> Any:
    return await ctx.tool(fn, action="payments.charge")(5)


@pytest.mark.parametrize("open_class,routed", [("read_only", "queued"), ("idempotent", "queued"),
                                               ("side_effect", "needs_reconciliation")])
def test_only_an_open_side_effect_call_sends_an_expired_lease_to_reconciliation(
        q: leaseq.Queue, open_class: str, routed: str) -> None:
    w = q.register_worker("a")
    task = q.enqueue("agent", {}, effect="side_effect", max_attempts=5)
    ctx = _attempt(q, q, w, lease_seconds=WORKING_LEASE)
    calls = Calls()
    ctx.tool(calls.llm, action="llm.chat", effect="read_only")("q")  # answered: never ambiguous

    def dies(_: str) -> None:
        raise KeyboardInterrupt  # stands in for the process dying inside the call

    with pytest.raises(KeyboardInterrupt):
        ctx.tool(dies, action="tool.x", effect=open_class)("arg")
    assert q.get(task.id).open_effects == 1
    wait_expired(q, ctx.claim)
    q.sweep()
    assert q.get(task.id).status == routed
    [expired] = [e for e in q.events(task.id) if e.type == "lease_expired"]
    assert expired.detail["routed_to"] == routed
    if routed == "queued":  # the retry makes the open call again under the same key
        ctx2 = _attempt(q, q, w)
        made: list[str] = []
        ctx2.tool(calls.llm, action="llm.chat", effect="read_only")("q")
        assert ctx2.tool(lambda a: made.append(a) or "ok", action="tool.x", effect=open_class)("arg") == "ok"
        assert made == ["arg"] and calls.n == {"llm": 1} and q.get(task.id).open_effects == 0


@pytest.mark.parametrize("task_effect,open_class,routed", [
    ("side_effect", "read_only", "queued"),
    ("side_effect", "side_effect", "needs_reconciliation"),
    ("idempotent", "side_effect", "needs_reconciliation"),
    ("idempotent", "idempotent", "queued"),
])
def test_fail_routing_considers_the_open_call_class(q: leaseq.Queue, task_effect: str, open_class: str,
                                                    routed: str) -> None:
    w = q.register_worker("a")
    task = q.enqueue("agent", {}, effect=task_effect, max_attempts=5)
    ctx = _attempt(q, q, w)

    def broken(_: str) -> None:
        raise RuntimeError("connection reset mid-call")

    with pytest.raises(RuntimeError):
        ctx.tool(broken, action="tool.x", effect=open_class)("arg")
    failed = q.fail(w, ctx.claim, "connection reset mid-call", delay=0)
    assert failed.status == routed


def test_plain_effects_keep_routing_by_the_task_class(q: leaseq.Queue) -> None:
    """ctx.effect entries take their task's class: a side_effect task with an open one
    still goes to reconciliation, an idempotent one is retried."""
    w = q.register_worker("a")
    for effect, routed in (("side_effect", "needs_reconciliation"), ("idempotent", "queued")):
        task = q.enqueue("job", {"e": effect}, effect=effect, max_attempts=5)
        [c] = q.claim(w)
        fx = q.begin_effect(w, c, "crm.update")
        assert fx.effect == effect and fx.args_digest is None
        assert q.fail(w, c, "boom", delay=0).status == routed, task


def test_read_only_calls_need_no_declared_action_but_other_calls_do(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    q.enqueue("summarize", {}, effect="read_only")
    ctx = _attempt(q, q, w)
    assert ctx.tool(lambda p: {"t": p}, action="llm.chat", effect="read_only")("hi") == {"t": "hi"}
    with pytest.raises(leaseq.InvalidInput, match="read_only"):
        ctx.tool(lambda: None, action="docs.put", effect="idempotent")()
    q.enqueue("agent", {}, effect="side_effect", actions=["payments.charge"])
    ctx2 = _attempt(q, q, w)
    assert ctx2.tool(lambda: 1, action="search.web", effect="read_only")() == 1
    with pytest.raises(leaseq.InvalidInput, match="not an action"):
        ctx2.tool(lambda: 2, action="email.send", effect="side_effect")()


def test_bad_tool_arguments_are_refused_with_the_field_named(q: leaseq.Queue, dsn: str) -> None:
    w = q.register_worker("a")
    q.enqueue("agent", {}, effect="side_effect")
    ctx = _attempt(q, q, w)
    with pytest.raises(leaseq.InvalidInput, match="effect"):
        ctx.tool(print, action="x.y", effect="sometimes")
    with pytest.raises(leaseq.InvalidInput, match="fn"):
        ctx.tool("not callable", action="x.y")  # type: ignore[arg-type]
    with pytest.raises(leaseq.InvalidInput, match="args_digest"):
        q.begin_effect(w, ctx.claim, "x.y", effect="read_only", args_digest="NOT HEX")
    with pytest.raises(leaseq.InvalidInput, match="effect"):
        q.begin_effect(w, ctx.claim, "x.y", effect="maybe")
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput, match="response"):  # not JSON: the call stays open, nothing recorded
        ctx.tool(lambda: object(), action="x.y", effect="read_only")()
    assert [e.status for e in q.effects(ctx.task_id)] == ["pending"] and snapshot(dsn) != before


def test_the_decorator_records_inside_a_handler_and_is_plain_outside(q: leaseq.Queue) -> None:
    ran: list[int] = []

    @leaseq.tool(action="math.double", effect="read_only")
    def double(n: int) -> int:
        ran.append(n)
        return 2 * n

    assert double(2) == 4 and q.effects  # outside a handler: the plain function
    w = q.register_worker("a")
    task = q.enqueue("agent", {}, effect="side_effect", max_attempts=5)
    for _ in range(2):
        ctx = _attempt(q, q, w)
        token = tools.current_context.set(ctx)
        try:
            assert [double(3), double(4)] == [6, 8]
        finally:
            tools.current_context.reset(token)
        q.fail(w, ctx.claim, "again", delay=0)
    assert ran == [2, 3, 4]  # the second attempt replayed both calls
    assert [e.idempotency_key.rsplit(":", 2)[1:] for e in q.effects(task.id)] == [["math.double", "0"],
                                                                                 ["math.double", "1"]]
    with pytest.raises(leaseq.InvalidInput, match="effect"):
        leaseq.tool(action="x.y", effect="risky")


def test_a_paused_queue_refuses_new_actions_but_not_reads_or_replays(q: leaseq.Queue) -> None:
    w = q.register_worker("a")
    q.enqueue("agent", {}, effect="side_effect", max_attempts=5)
    ctx = _attempt(q, q, w)
    calls = Calls()
    pay = ctx.tool(calls.pay, action="payments.charge", effect="side_effect")
    assert pay(1) == {"paid": 1}
    q.pause("default", by="ops")
    assert ctx.tool(calls.llm, action="llm.chat", effect="read_only")("q") == {"text": "answer to q", "tokens": 7}
    with pytest.raises(leaseq.QueuePaused):
        pay(2)
    assert calls.n == {"pay": 1, "llm": 1}


@pytest.mark.parametrize("open_class,routed", [("read_only", "queued"), ("side_effect", "needs_reconciliation")])
def test_a_requested_retry_considers_the_open_call_class(q: leaseq.Queue, open_class: str, routed: str) -> None:
    w = q.register_worker("a")
    q.enqueue("agent", {}, effect="side_effect", max_attempts=5)
    ctx = _attempt(q, q, w)

    def broken(_: str) -> None:
        raise RuntimeError("rate limited mid-call")

    with pytest.raises(RuntimeError):
        ctx.tool(broken, action="tool.x", effect=open_class)("arg")
    assert q.retry(w, ctx.claim, 0, "rate limited").status == routed


def test_the_action_token_is_asked_for_again_once_the_lease_was_renewed(dsn: str) -> None:
    """A token expires at the lease deadline it was issued under: after a renewal,
    ``fresh_token()`` (``await atoken()``) asks the queue for one carrying the new
    deadline; without a renewal since, it hands back the one it has, asking nothing."""
    import time

    from leaseq.fencing.tokens import ActionSigner

    signer = ActionSigner({"k1": b"s" * 32}, "k1")
    q = leaseq.connect(dsn, signer=signer)
    q.migrate()
    try:
        q.enqueue("agent", {}, effect="side_effect", actions=["crm.update"])
        w = q.register_worker("a")
        ctx = _attempt(q, q, w)

        def renewed() -> None:  # what the runtime's renewer does
            time.sleep(0.05)
            assert q.renew_leases(w, [ctx.claim])
            ctx.renewed_at = time.monotonic()

        def expiry(token: str | None) -> float:
            assert token is not None
            return signer.verify(token, action="crm.update").expires_at

        with ctx.effect("crm.update", key="sync") as fx:
            first = fx.fresh_token()
            assert fx.fresh_token() == first == fx.token
            renewed()
            second = fx.fresh_token()
            assert expiry(second) > expiry(first) and fx.token == second
            fx.record({"ok": 1})

        async def in_a_handler() -> tuple[str | None, str | None, str | None]:
            async with ctx.effect("crm.update", key="async") as afx:
                before = await afx.atoken()
                same = await afx.atoken()
                renewed()
                after = await afx.atoken()
                await afx.arecord({"ok": 2})
            return before, same, after

        before, same, after = asyncio.run(in_a_handler())
        assert before == same and expiry(after) > expiry(before)
    finally:
        q.close()
