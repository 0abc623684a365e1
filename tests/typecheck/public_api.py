"""The public API used as the README and docs teach it, written for ``mypy --strict``.

Never run: tests/typecheck/test_public_api.py type-checks it against the installed
package. A ``# type: ignore[code]`` line here is a call the annotations must
refuse: under --strict an ignore that is not needed is itself an error, so a
signature that stopped checking its arguments fails the test.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Any

import leaseq
from leaseq.client import RemoteQueue

app = leaseq.App()


class ProviderDown(ConnectionError):
    """The provider cannot be reached."""


@app.task("summarize", effect="read_only", lease_seconds=30, max_attempts=5)
async def summarize(ctx: leaseq.TaskContext, doc_id: int) -> dict[str, str]:
    ctx.check()
    return {"summary": f"document {doc_id}, summarized"}


@app.task("send_welcome", effect="side_effect", actions=["email.send"])
def send_welcome(ctx: leaseq.TaskContext, user_id: int) -> Any:
    with ctx.effect("email.send", key=f"welcome:{user_id}") as fx:
        if not fx.replayed:
            fx.record({"message_id": f"welcome-{user_id}", "key": fx.idempotency_key,
                       "fencing_token": fx.fencing_token})
    return fx.response


@app.task(
    "ask_model",
    timeout=30,
    deadline=timedelta(minutes=10),
    retry=leaseq.RetryPolicy(base=2, cap=300, jitter=0.5, retry_on=(ConnectionError, TimeoutError),
                             give_up_on=(PermissionError,)),
    limits=["openai", "openai-tokens"],
    units=2_000,
)
async def ask_model(ctx: leaseq.TaskContext, prompt: str) -> str:
    if ctx.task.snoozes == 0:
        raise leaseq.Retry(after=0, reason="429 Too Many Requests (Retry-After: 0)")
    if ctx.lost:
        raise leaseq.Permanent("gave up")
    return f"an answer to {prompt!r}"


def lease_by_hand() -> None:
    q: leaseq.Queue = leaseq.connect()
    q.migrate()
    a: leaseq.Worker = q.register_worker("a")
    b = q.register_worker("b")
    task: leaseq.Task = q.enqueue("summarize", {"doc_id": 1}, effect="read_only", lease_seconds=0.5)
    [claim_a] = q.claim(a)
    time.sleep(0.6)
    claims: list[leaseq.Claim] = q.claim(b, limit=10, kinds=["summarize"])
    for claim in claims:
        q.complete(b, claim, result={"summary": "…"})
    try:
        deadline: datetime = q.heartbeat(a, claim_a)
        print(deadline.isoformat())
    except leaseq.LeaseLost as exc:
        print("A is refused:", exc, exc.task_id, exc.generation)
    events: list[leaseq.Event] = q.events(task.id)
    print([e.type for e in events])


def enqueue_through_definitions() -> None:
    first: leaseq.Task = summarize.enqueue(doc_id=2)
    again = summarize.options(key="doc-2", delay=1.5, priority=3).enqueue(doc_id=2)
    print(first.id == again.id, ask_model.payload(prompt="six times seven"))
    send_welcome.enqueue(user_id=7)
    # the handler's signature, checked by the type checker:
    summarize.enqueue(doc_id="two")  # type: ignore[arg-type]
    summarize.enqueue(document=2)  # type: ignore[call-arg]


async def enqueue_from_async_code() -> None:
    task = await summarize.enqueue_async(doc_id=3)
    queue = leaseq.AsyncQueue(app.queue)
    fetched: leaseq.Task = await queue.get(task.id)
    done: leaseq.Task = await queue.wait(fetched.id, timeout=10)
    print(done.status, done.result)
    aq: leaseq.AsyncQueue = await leaseq.connect_async("sqlite:///async.db")
    await aq.migrate()
    await aq.enqueue("lookup", {"n": 1}, limits=["search"])


def limits_and_wait() -> None:
    q = leaseq.connect("sqlite:///wait.db", max_snoozes=100)
    q.migrate()
    q.set_limit("openai", max_running=8, per_second=1.0, burst=5)
    q.set_limit("openai-tokens", per_second=1500, burst=90_000, counts="units")
    q.enqueue("summarize", {"doc_id": 3}, limits=["openai"], units=1)
    usage: list[dict[str, Any]] = q.limits()
    print(usage)
    ask_model.options(units=12_000).enqueue(prompt="a long document")
    task = q.enqueue("answer", {"question": "six times seven"})
    try:
        done = q.wait(task.id, timeout=0.1)
        print(done.status, done.result)
    except TimeoutError as exc:
        print(exc)
    q.wait("1")  # type: ignore[arg-type]
    policy = leaseq.RetryPolicy(base=2, cap=300, jitter=0)
    assert policy.retries(TimeoutError()) and not leaseq.RetryPolicy(give_up_on=(KeyError,)).retries(KeyError())
    q.close()


def workers() -> None:
    stats = app.run_worker(until_idle=True, install_signals=False)
    print(stats)
    runtime = app.worker(concurrency=4)
    print(asyncio.run(runtime.run(until_idle=True)))


def remote_worker() -> None:
    remote = RemoteQueue("http://127.0.0.1:8000", "lq_token")
    worker = remote.register_worker("remote")
    for claim in remote.claim(worker, queue="default", limit=4):
        remote.heartbeat(worker, claim)
        remote.complete(worker, claim, result={"ok": True})
    task: leaseq.Task = remote.enqueue("summarize", {"doc_id": 4})
    print(remote.wait(task.id, timeout=5).status, remote.get(task.id).attempts)
    remote.close()
